"""headlab-train: the Hydra entry point (`python -m headlab.cli.train` is the same).

The composed config is validated before torch, Lightning or the data are imported, so a wrong value is
reported in one line at once. Every job ends with results.json in its run directory, also when it fails; in a
sweep (-m) a failed job is recorded and the others go on.
"""

import json
import logging
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.resources import files
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from headlab.cli import console, neighbours, rundir, runtime
from headlab.cli.hydra_errors import one_line
from headlab.errors import ConfigError, DataError, DiskFull, TrainingError, UsageError
from headlab.files import write_atomic, write_json_atomic
from headlab.training import sweep, trust
from headlab.training.config_check import check_config, check_launch, check_resume
from headlab.training.results import flat_config, git_sha, read_record, recorded_config, versions

runtime.configure()

log = logging.getLogger("headlab")
_KIND = (  # how a user's mistake is introduced, by its type (the first that applies)
    (ConfigError, "invalid config"),
    (DataError, "data error"),
    (TrainingError, "training stopped"),
    (UsageError, "error"),
)
TRACEBACKS = "HEADLAB_TRACEBACKS"  # "1": the user asked for whole tracebacks (HYDRA_FULL_ERROR=1 when started)
_job_started = False  # False while Hydra parses, composes and creates the output directory
_said: set[str] = set()  # the errors this process has reported: a sweep says each once (its summary counts the jobs)
_ctrl_c = False  # whether the interrupt came from Ctrl-C (exit code 130) rather than SIGTERM (143)


@dataclass
class Job:
    """One job of headlab-train: its config, run directory and results.json record."""

    cfg: DictConfig
    run_dir: Path
    record: dict
    in_sweep: bool
    composed: dict[str, str]  # the .hydra/ files of the job as Hydra composed it, written once it owns run_dir
    started: float = field(default_factory=time.time)
    previous: str | None = None  # results.json of the run being resumed, restored if the resume is refused
    owned: bool = False  # the job holds its run directory (run_dir.claim): only then does it write there
    continued: bool = False  # resume was set by headlab (a requeued SLURM job, sweep.resume), not by the user
    fresh: bool = False  # run_dir held nothing before this job (a refused job removes it again)
    sweep_dir: Path | None = None  # hydra.sweep.dir, for a job of a sweep (-m)


def open_job(cfg: DictConfig) -> Job:
    """The job Hydra is running, before anything heavy is imported. A refused resume leaves the run it refused as
    it was (job.previous)."""
    global _job_started
    _job_started = True
    console.quiet()
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    composed = {  # before anything below changes cfg
        "config.yaml": OmegaConf.to_yaml(cfg),
        "hydra.yaml": OmegaConf.to_yaml(OmegaConf.create({"hydra": OmegaConf.to_container(hydra_cfg)})),
        "overrides.yaml": OmegaConf.to_yaml(hydra_cfg.overrides.task),
    }
    continued = not cfg.resume and sweep.requeued(run_dir)
    if continued:
        log.info("requeued by SLURM: resuming %s from its checkpoints/last.ckpt", run_dir)
        with open_dict(cfg):
            cfg.resume = str(run_dir)
    record = {
        "status": "running",
        "started_at": datetime.now(timezone.utc).isoformat(),
        "config": flat_config(cfg, dict(hydra_cfg.runtime.choices)),
        "seed": cfg.seed,
        "git_sha": git_sha(),
        "versions": versions(),
        "wandb": {"id": None, "url": None},
    }
    in_sweep = hydra_cfg.mode == RunMode.MULTIRUN
    job = Job(cfg, run_dir, record, in_sweep=in_sweep, composed=composed)
    job.sweep_dir = Path(hydra_cfg.sweep.dir) if in_sweep else None
    job.continued = continued
    if not cfg.resume and cfg.sweep.resume and rundir.continues(run_dir, record["config"]):
        log.info("continuing %s from its checkpoints/last.ckpt (sweep.resume=true)", run_dir)
        job.continued = True
        with open_dict(cfg):
            cfg.resume = str(run_dir)
    if cfg.resume and (run_dir / "results.json").is_file():
        job.previous = (run_dir / "results.json").read_text(errors="replace")
        record["attempts"] = rundir.earlier_attempts(run_dir, read_record(run_dir) or {})
        before = recorded_config(run_dir) or {}  # composed from the run's saved config, the choice of each group
        record["config"] = {**{k: v for k, v in before.items() if "." not in k}, **record["config"]}  # is known
        # from its record only
    return job


def skipped(job: Job) -> float | None:
    """The objective of the job's earlier result when sweep.resume skips it (it completed before with the same
    config); None when it is to run."""
    if job.cfg.sweep.resume and sweep.completed_before(job.run_dir, job.record["config"]):
        log.info("skipping %s: completed before with the same config (sweep.resume=true)", job.run_dir)
        return sweep.objective(job.cfg, _read_results(job.run_dir))
    return None


def check_job(job: Job) -> None:
    """Claim the run directory, then every check that needs no data or model; then results.json holds the job's
    record, "running" (a pack's member: "queued" until its pack starts, start_job), and .hydra/ its config, written
    by headlab once the directory is the job's."""
    cfg = job.cfg
    if sweep.process_rank() == 0:  # other ranks of a run that re-runs the command write nothing
        job.fresh = rundir.claim(job.run_dir, job.record["config"], resuming=bool(cfg.resume), rerun=cfg.sweep.resume)
        job.owned = True
    if cfg.resume:
        given = {o.split("=", 1)[0].lstrip("+~") for o in HydraConfig.get().overrides.task if "=" in o}
        trust.check_targets(cfg, f"{cfg.resume}/.hydra/config.yaml", given)
        trust.check_paths(cfg, job.run_dir)
        check_resume(cfg, job.run_dir, job.record["config"])
    check_config(cfg)
    launcher = HydraConfig.get().runtime.choices.get("hydra/launcher")
    check_launch(cfg, job.in_sweep, launcher, user_resume=bool(cfg.resume) and not job.continued)
    if job.owned and not cfg.resume:
        for name, text in job.composed.items():
            write_atomic(job.run_dir / ".hydra" / name, lambda f, text=text: f.write(text.encode()))
    _write(job, job.record)  # "running" until the run ends (or is killed)


def start_job(job: Job, pack: str) -> None:
    """A pack's member begins, when its pack starts: it is "running" from now (its started_at and duration_s are
    its own, not the wait for the packs before it), in the pack named (headlab-status shows its members as one)."""
    job.started = time.time()
    job.record.update(status="running", started_at=datetime.now(timezone.utc).isoformat(), pack={"id": pack})
    _write(job, job.record)


def close_job(job: Job, fields: dict | None = None, error: BaseException | None = None, stop: bool = True) -> float:
    """Write the job's final record and return its objective; report an error in one line (exit 2 for the
    user's mistakes outside a sweep); re-raise interrupts after recording them, unless stop=False (an interrupt
    of another process, a pack's worker, which this one outlives)."""
    cfg = job.cfg
    if isinstance(error, UsageError):
        if not job.owned:  # the directory is another run's (or another process's): nothing of it is touched
            if job.sweep_dir is not None:
                rundir.note_refused(job.sweep_dir, job.run_dir, str(error))
        elif job.previous is not None and not isinstance(error, TrainingError):  # a refused resume: the run
            # keeps the record it had
            (job.run_dir / "results.json").write_text(job.previous)
        elif job.fresh and not job.in_sweep and not (job.run_dir / "results.json").exists():
            rundir.remove_fresh(job.run_dir)  # refused before it began: it leaves no directory behind
        else:
            _finish(job, error)
        kind = next(text for kind, text in _KIND if isinstance(error, kind))
        _say(f"headlab-train: {kind}: {error}")
        if _debug():
            raise error
        if not job.in_sweep:
            sys.exit(2)
        return sweep.objective(cfg, job.record)  # a sweep records the failure and goes on with the next job
    if isinstance(error, Exception):
        _finish(job, error)
        if not job.in_sweep:
            raise error
        print(
            f"headlab-train: job {job.run_dir} failed: {job.record['error']} (traceback in its results.json)",
            file=sys.stderr,
        )
        return sweep.objective(cfg, job.record)
    if error is not None:  # Ctrl-C, SIGTERM via SystemExit: recorded as interrupted, then stop
        _finish(job, error)
        hint = (
            f"continue the sweep with the same command and sweep.resume=true hydra.sweep.dir={job.run_dir.parent}"
            if job.in_sweep
            else f"continue it with: headlab-train resume={job.run_dir}"
        )
        _say(f"headlab-train: interrupted: {hint}")
        if not stop:
            return sweep.objective(cfg, job.record)
        if _ctrl_c:
            sys.exit(128 + signal.SIGINT)
        if isinstance(error, SystemExit) and not error.code:  # Lightning's SIGTERMException carries no code
            sys.exit(128 + signal.SIGTERM)
        raise error
    job.record.update(fields or {}, status="completed")
    _finish(job)
    log.info(console.outcome(job.run_dir, job.record))
    return sweep.objective(cfg, job.record)


def _say(line: str) -> None:
    """A line on stderr, once a process (a sweep says a mistake every job shares once)."""
    if line not in _said:
        print(line, file=sys.stderr)
    _said.add(line)


def stop_on_ctrl_c(signum, frame) -> None:
    """The first Ctrl-C stops the run as SIGTERM does: at its next training step, where last.ckpt is saved (a
    Ctrl-C inside a step would leave no checkpoint to continue from); a second Ctrl-C stops at once."""
    global _ctrl_c
    _ctrl_c = True
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print("headlab-train: stopping at the next step (Ctrl-C again to stop at once)", file=sys.stderr)
    os.kill(os.getpid(), signal.SIGTERM)


def stop_on_sigterm(signum, frame) -> None:
    """SIGTERM outside Lightning's loops (data preparation, between fit and test): stop at once, recorded as an
    interrupt. Inside them Lightning's own handler, which notes the signal and stops at its next step or batch,
    calls this one too: then it leaves the stopping to Lightning."""
    if signal.getsignal(signal.SIGTERM) is stop_on_sigterm:
        raise SystemExit(128 + signum)


@hydra.main(version_base="1.3", config_path="pkg://headlab.conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    job = open_job(cfg)
    if (objective := skipped(job)) is not None:
        return objective
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    signal.signal(signal.SIGINT, stop_on_ctrl_c)
    try:
        check_job(job)
        from headlab.training.run import train  # the heavy imports, only once the config is known to be valid

        fields = train(cfg, job.record["config"], threads=sweep.cpu_threads(), run_dir=job.run_dir)
    except BaseException as error:
        return close_job(job, error=error)
    return close_job(job, fields)


def _read_results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def _finish(job: Job, error: BaseException | None = None) -> None:
    record = job.record
    if isinstance(error, KeyboardInterrupt | SystemExit):
        record.update(status="interrupted", error=_stopped_by(error))
    elif error is not None:
        record.update(status="failed", error=f"{type(error).__name__}: {error}")
        record["traceback"] = "".join(traceback.format_exception(error))
    record["duration_s"] = round(time.time() - job.started, 3)
    try:
        _write(job, record)
    except DiskFull as full:  # results.json keeps its "running" record
        print(f"headlab-train: the run's final status ({record['status']}) is not recorded: {full}", file=sys.stderr)


def _stopped_by(error: KeyboardInterrupt | SystemExit) -> str:
    """What interrupted a run, in its record's words: Ctrl-C, or the signal (SIGTERM: kill, scancel, a sweep's
    launcher stopping its packs)."""
    if _ctrl_c or isinstance(error, KeyboardInterrupt):
        return "stopped by Ctrl-C"
    code = getattr(error, "code", None)
    if code is None:  # Lightning's SIGTERMException carries no code
        return "stopped by SIGTERM"
    if isinstance(code, int) and code - 128 in signal.valid_signals():
        return f"stopped by {signal.Signals(code - 128).name}"
    return f"stopped ({code})"


def _write(job: Job, record: dict) -> None:
    """results.json, from the process that owns the run directory only (rank 0: the other ranks of a run that
    re-runs the command run this code too)."""
    if job.owned:
        write_json_atomic(job.run_dir / "results.json", record)


def _debug() -> bool:
    return os.environ.get(TRACEBACKS) == "1"


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
    group_names = {p.name for p in files("headlab.conf").iterdir() if p.is_dir()}
    keys = [a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a]
    if not saved.is_file() or any("/" in k or k in group_names for k in keys) or any(a.startswith("-") for a in argv):
        return argv
    return ["--config-dir", str(saved.parent), "--config-name", "config", f"hydra.run.dir={run_dir}", *argv]


def cli() -> None:
    """headlab-train: Hydra's own errors, like headlab's, are one line on stderr and exit code 2."""
    os.environ.setdefault(TRACEBACKS, os.environ.get("HYDRA_FULL_ERROR", "0"))
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises its errors to us instead of printing them
    sys.argv[1:] = resume_argv(sys.argv[1:])
    if "hydra/launcher=slurm" not in sys.argv and (line := neighbours.warning()):  # slurm: it trains elsewhere
        print(f"headlab-train: {line}", file=sys.stderr)
    try:
        main()
    except Exception as error:
        message = None if _debug() else one_line(error)
        if message is None or (_job_started and not isinstance(error, HydraException)):
            raise
        print(f"headlab-train: {message}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":  # python -m headlab.cli.train: run the imported module, the one the launchers use too
    from headlab.cli.train import cli as imported_cli

    imported_cli()
