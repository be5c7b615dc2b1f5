"""headlab-train: the Hydra entry point (`python -m headlab.cli.train` is the same).

The composed config is validated before torch, Lightning or the data are imported, so a wrong value is
reported in one line at once; a job's life (its run directory, its record, its errors) is headlab.launch.job's.
"""

import contextlib
import functools
import multiprocessing
import os
import signal
import sys
from pathlib import Path

import hydra
from hydra._internal.hydra import Hydra
from hydra.errors import HydraException
from omegaconf import DictConfig

from headlab.cli import neighbours
from headlab.cli.hydra_errors import config_groups, one_line, refused_override
from headlab.launch import job as job_
from headlab.launch import runtime
from headlab.launch.job import Job
from headlab.training import cores
from hydra_plugins.headlab_launcher import register


@hydra.main(version_base="1.3", config_path="pkg://headlab.conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    runtime.configure()  # also where a launcher's worker process runs the job (joblib, SLURM)
    job = Job.open(cfg)
    if (objective := job.skipped()) is not None:
        return objective
    signal.signal(signal.SIGTERM, job_.stop_on_sigterm)
    signal.signal(signal.SIGINT, job_.stop_on_ctrl_c)
    try:
        job.check()
        with runtime.heavy_imports():  # once the config is known valid
            from headlab.training.pack.train import train_run

        fields = train_run(cfg, job.record["config"], threads=cores.cpu_threads(), run_dir=job.run_dir)
    except BaseException as error:
        return job.close(error=error)
    return job.close(fields)


def resume_argv(argv: list[str]) -> list[str]:
    """`headlab-train resume=<run dir> [key=value ...]`: composed from the configuration the run saved
    (<run dir>/.hydra/config.yaml), so the run continues as it was started; values given with it must equal the
    saved ones (check_resume refuses the others). With a config group among the overrides (logger=csv) it is
    composed as usual, from every override given again. A resumed run's .hydra/ files stay as they were: a refused
    resume leaves the run as it was."""
    run_dir = next((a.split("=", 1)[1] for a in argv if a.startswith("resume=")), None)
    if not run_dir or any(a in ("-m", "--multirun") for a in argv):
        return argv
    argv = ["hydra.output_subdir=null", *argv]  # composed from the run's config, not headlab's hydra defaults
    saved = Path(run_dir) / ".hydra" / "config.yaml"
    keys, groups = [a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a], config_groups()
    if not saved.is_file() or any("/" in k or k in groups for k in keys) or any(a.startswith("-") for a in argv):
        return argv
    return ["--config-dir", str(saved.parent), "--config-name", "config", f"hydra.run.dir={run_dir}", *argv]


PLAN_FLAGS = ("--prior", "--baseline", "--effect", "--budget")  # the dry run's plan: sweep.plan.<name>


def dry_run_argv(argv: list[str]) -> list[str]:
    """`--dry-run`: sweep.dry_run=true, as a sweep (a single run is a sweep of one job): what would run, nothing run;
    `--dry-run --json`: sweep.dry_run=json, the same as one JSON object on stdout; `--prior DIR`, `--baseline
    KEY=VALUE`, `--effect X`, `--budget 30m` (or --flag=value): sweep.plan's keys, with --dry-run only."""
    planned, rest, i = [], [], 0
    while i < len(argv):
        flag, given, value = argv[i].partition("=")
        if flag in PLAN_FLAGS:
            if not given and i + 1 >= len(argv):
                _refuse(f"{flag} needs a value")
            value = value if given else argv[i + 1]
            quote = ("'" if "'" not in value else '"') if flag in ("--prior", "--baseline") else ""  # paths, KEY=VALUE
            planned.append(f"sweep.plan.{flag[2:]}={quote}{value}{quote}")
            i += 1 if given else 2
            continue
        rest.append(argv[i])
        i += 1
    if "--dry-run" not in rest:
        if planned:
            _refuse(f"{', '.join(PLAN_FLAGS)} plan a sweep before it runs: give them with --dry-run")
        return rest
    as_json = "--json" in rest
    rest = [a for a in rest if a not in ("--dry-run", "--json")] + [f"sweep.dry_run={'json' if as_json else 'true'}"]
    rest += planned
    return rest if any(a in ("-m", "--multirun") for a in rest) else ["-m", *rest]


def _refuse(message: str) -> None:
    print(f"headlab-train: {message}", file=sys.stderr)
    sys.exit(2)


def cli() -> None:
    """headlab-train: Hydra's own errors, like headlab's, are one line on stderr and exit code 2."""
    os.environ.setdefault(job_.TRACEBACKS, os.environ.get("HYDRA_FULL_ERROR", "0"))
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises its errors to us instead of printing them
    register()
    sys.argv[1:] = resume_argv(dry_run_argv(sys.argv[1:]))
    if refused := refused_override(sys.argv[1:]):  # trainer=5, ~model, resume=[a]: Hydra would not name them
        _refuse(refused)
    dry_run = any(a.startswith("sweep.dry_run=") for a in sys.argv)
    if "hydra/launcher=slurm" not in sys.argv and (line := neighbours.warning()):  # slurm: it trains elsewhere
        busy = f"{line.split(' too:', 1)[0]}: this dry run's times are measured beside it" if dry_run else line
        print(f"headlab-train: {busy}", file=sys.stderr)
    try:
        with _composed_once(any(a in ("-m", "--multirun") for a in sys.argv[1:])):
            main()
    except Exception as error:
        message = None if job_.tracebacks() else one_line(error)
        if message is None or (job_.began() and not isinstance(error, HydraException)):
            raise
        print(f"headlab-train: {message}", file=sys.stderr)
        sys.exit(2)


@contextlib.contextmanager
def _composed_once(multirun: bool):
    """Hydra composes the whole config (0.1-0.3 s) to read hydra.mode (Hydra.get_mode), then again to run it. With -m
    that first composition is skipped: the command is a multirun whatever the config says (Hydra would only warn
    where it said RUN). Without -m, the mode is read from the composition the run then gets (_mode_of_the_run)."""
    composing = Hydra.get_mode
    Hydra.get_mode = (
        (lambda self, config_name, overrides: None)  # None and -m: Hydra runs it as a multirun
        if multirun
        else functools.partialmethod(_mode_of_the_run, composing)
    )
    try:
        yield
    finally:
        Hydra.get_mode = composing


def _mode_of_the_run(hydra: Hydra, get_mode, config_name: str | None, overrides: list[str]):
    """hydra.mode as Hydra.run composes the config, that composition handed over to Hydra.run (hand_over): where the
    config names no mode, Hydra runs it with hydra.mode=RUN added to the overrides, which is applied to the kept
    config as Hydra applies it; where an experiment says MULTIRUN, the sweep composes its own. Where it cannot compose
    so (a sweep's a,b without -m, which a MULTIRUN experiment allows), Hydra's own get_mode reads the mode."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    from headlab.launch.compose import hand_over

    loader = hydra.config_loader
    try:
        cfg = loader.load_configuration(config_name=config_name, overrides=overrides, run_mode=RunMode.RUN)
    except Exception:
        return get_mode(hydra, config_name, overrides)
    mode = cfg.hydra.mode
    if mode == RunMode.MULTIRUN:
        return mode
    run_overrides = list(overrides)
    if mode is None:  # Hydra's _run_app adds hydra.mode=RUN to the overrides it runs with
        run_overrides.append("hydra.mode=RUN")
        added = OverridesParser.create().parse_overrides(run_overrides[-1:])
        ConfigLoaderImpl._apply_overrides_to_config(added, cfg)
        cfg.hydra.overrides.hydra.append(run_overrides[-1])
    kept = {(config_name, tuple(run_overrides), RunMode.RUN): cfg}
    hand_over(loader, "load_configuration", kept, _composition_asked)
    return mode


def _composition_asked(config_name=None, overrides=(), run_mode=None, **how) -> tuple:
    """Which config ConfigLoader.load_configuration is asked for (Hydra.compose_config names its arguments)."""
    return config_name, tuple(overrides), run_mode


if getattr(multiprocessing.current_process(), "_inheriting", False):  # as multiprocessing itself tells it (spawn.py)
    # a process started by running this module first, to train next: a rank that Lightning spawns (ddp_spawn), which
    # imports torch and Lightning as it unpickles its work, a worker of the local launcher (joblib's loky): they are
    # imported here before, as a run's process imports them
    with runtime.heavy_imports():
        import headlab.training.pack.train  # noqa: F401

if __name__ == "__main__":  # python -m headlab.cli.train: run the imported module, the one the launchers use too
    from headlab.cli.train import cli as imported_cli

    imported_cli()
