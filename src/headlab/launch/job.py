"""A job's life, the same for a single run, a pack's member and a SLURM job: open (the job Hydra composed), claim
and check (its run directory locked, every check that needs no data or model), start, close (its final record, its
objective, an error in one line). Every job ends with results.json in its run directory, also when it fails; in a
sweep a failed job is recorded and the others go on.
"""

import logging
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf._utils import get_omega_conf_dumper

from headlab.config import trust
from headlab.config.check import check_config, check_launch, check_sections
from headlab.config.run_config import check_resume, flat_config, recorded_config
from headlab.errors import ConfigError, DataError, DiskFull, TrainingError, UsageError
from headlab.files import write_atomic, write_text_atomic
from headlab.launch import console, rundir
from headlab.record import git_sha, is_finite_number, read_record, versions, write_record
from headlab.training import cores

log = logging.getLogger("headlab")
_KIND = (  # how a user's mistake is introduced, by its type (the first that applies)
    (ConfigError, "invalid config"),
    (DataError, "data error"),
    (TrainingError, "training stopped"),
    (UsageError, "error"),
)
TRACEBACKS = "HEADLAB_TRACEBACKS"  # "1": the user asked for whole tracebacks (HYDRA_FULL_ERROR=1 when started)
_began = False  # False while Hydra parses, composes and creates the output directory
_said: set[str] = set()  # the errors this process has reported: a sweep says each once (its summary counts the jobs)
_ctrl_c = False  # whether the interrupt came from Ctrl-C (exit code 130) rather than SIGTERM (143)


def began() -> bool:
    """Whether a job has opened in this process (an error before is Hydra's, while it composes)."""
    return _began


def tracebacks() -> bool:
    return os.environ.get(TRACEBACKS) == "1"


def diverged(fields: dict | None) -> str | None:
    """Why a run that trained to its end has no finite model, or None: a metric it measured (validation, test,
    the last epoch's training) that is not a finite number, as after an update that made its weights NaN."""
    metrics = (fields or {}).get("metrics") or {}
    bad = {k: v for k, v in metrics.items() if v is not None and not is_finite_number(v)}  # compare's rule
    if not bad:
        return None
    shown = ", ".join(f"{k} {v}" for k, v in bad.items())
    return (
        f"diverged: {shown} at the end of training (the model's outputs are not finite); lower optim.lr, or set "
        "trainer.gradient_clip_val"
    )


def objective(cfg: DictConfig, record: dict) -> float:
    """What a job returns to its sweeper (Optuna maximises it): sweep.objective of its metrics, NaN if it failed."""
    value = record.get("metrics", {}).get(cfg.sweep.objective) if record.get("status") == "completed" else None
    return float("nan") if value is None else float(value)


def check_sweep(config: DictConfig) -> None:
    """What every job of a sweep shares, refused before its first job (the sweepers': grid, search): a section given
    one value for all of them (sweep=3, optim=5), which no job could read."""
    check_sections(config)


def composed_files(cfg: DictConfig) -> dict[str, str]:
    """The .hydra/ files of a job as Hydra composed it (YAML: about 8 ms a job, made only where they are written).
    hydra.yaml is dumped as OmegaConf.to_yaml dumps a config, from its container: the same text, without making a
    config of it first (two thirds of the time)."""
    hydra_cfg = HydraConfig.get()
    hydra = {"hydra": OmegaConf.to_container(hydra_cfg, enum_to_str=True)}
    return {
        "config.yaml": OmegaConf.to_yaml(cfg),
        "hydra.yaml": yaml.dump(hydra, default_flow_style=False, allow_unicode=True, sort_keys=False,
                                Dumper=get_omega_conf_dumper()),
        "overrides.yaml": OmegaConf.to_yaml(hydra_cfg.overrides.task),
    }  # fmt: skip


@dataclass
class Job:
    """One job of headlab-train: its config, run directory and results.json record."""

    cfg: DictConfig
    run_dir: Path
    record: dict
    in_sweep: bool
    started: float = field(default_factory=time.time)
    previous: str | None = None  # results.json of the run being resumed, restored if the resume is refused
    owned: bool = False  # the job holds its run directory (run_dir.claim): only then does it write there
    continued: bool = False  # resume was set by headlab (a requeued SLURM job, sweep.resume), not by the user
    fresh: bool = False  # run_dir held nothing before this job (a refused job removes it again)
    sweep_dir: Path | None = None  # hydra.sweep.dir, for a job of a sweep (-m)

    @classmethod
    def open(cls, cfg: DictConfig) -> "Job":
        """The job Hydra is running, before anything heavy is imported. A refused resume leaves the run it refused
        as it was (job.previous)."""
        global _began
        _began = True
        console.quiet()
        hydra_cfg = HydraConfig.get()
        run_dir = Path(hydra_cfg.runtime.output_dir)
        continued = not cfg.resume and _requeued(run_dir)
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
        job = cls(cfg, run_dir, record, in_sweep=in_sweep, continued=continued)
        job.sweep_dir = Path(hydra_cfg.sweep.dir) if in_sweep else None
        if not cfg.resume and job.rerun and rundir.continues(run_dir, record["config"]):
            log.info("continuing %s from its checkpoints/last.ckpt (sweep.resume=true)", run_dir)
            job.continued = True
            with open_dict(cfg):
                cfg.resume = str(run_dir)
        if cfg.resume and (run_dir / "results.json").is_file():
            job.previous = (run_dir / "results.json").read_text(errors="replace")
            record["attempts"] = rundir.earlier_attempts(run_dir, read_record(run_dir) or {})
            before = recorded_config(run_dir) or {}  # composed from the run's saved config, the choice of each
            # group is known from its record only
            record["config"] = {**{k: v for k, v in before.items() if "." not in k}, **record["config"]}
        return job

    @property
    def rerun(self) -> bool:
        """sweep.resume, read before the checks: a sweep section given one value (sweep=3) is theirs to refuse."""
        return bool(OmegaConf.select(self.cfg, "sweep.resume", default=False))

    def skipped(self) -> float | None:
        """The objective of the job's earlier result when sweep.resume skips it (it completed before with the same
        config); None when it is to run."""
        if self.rerun and rundir.completed_before(self.run_dir, self.record["config"]):
            log.info("skipping %s: completed before with the same config (sweep.resume=true)", self.run_dir)
            return objective(self.cfg, read_record(self.run_dir) or {})
        return None

    def check(self) -> None:
        """Claim the run directory, then every check that needs no data or model; then results.json holds the
        job's record, "running" (a pack's member: "queued" until its pack starts), and .hydra/ its config, written
        by headlab once the directory is the job's."""
        cfg = self.cfg
        if cores.process_rank() == 0:  # other ranks of a run that re-runs the command write nothing
            resuming, rerun = bool(cfg.resume), self.rerun
            self.fresh = rundir.claim(self.run_dir, self.record["config"], resuming=resuming, rerun=rerun)
            self.owned = True
        if cfg.resume:
            given = {o.split("=", 1)[0].lstrip("+~") for o in HydraConfig.get().overrides.task if "=" in o}
            trust.check_targets(cfg, f"{cfg.resume}/.hydra/config.yaml", given)
            trust.check_paths(cfg, self.run_dir)
            check_resume(cfg, self.run_dir, self.record["config"])
        check_config(cfg)
        launcher = HydraConfig.get().runtime.choices.get("hydra/launcher")
        check_launch(cfg, self.in_sweep, launcher, user_resume=bool(cfg.resume) and not self.continued)
        if self.owned and not cfg.resume:  # cfg as Hydra composed it: open changes it only to resume, the checks never
            for name, text in composed_files(cfg).items():
                write_atomic(self.run_dir / ".hydra" / name, lambda f, text=text: f.write(text.encode()))
        self._write()  # "running" until the run ends (or is killed)

    def member(self):
        """This job as a pack trains it (headlab.training.pack.train.train_members): a Member of its config, run
        directory and flat config (torch and Lightning are imported: call it once every job is checked)."""
        from headlab.training.pack.member import Member

        return Member(cfg=self.cfg, run_dir=self.run_dir, flat_config=self.record["config"])

    def start(self, pack: str) -> None:
        """A pack's member begins, when its pack starts: it is "running" from now (its started_at and duration_s
        are its own, not the wait for the packs before it), in the pack named (headlab-status shows its members as
        one)."""
        self.started = time.time()
        self.record.update(status="running", started_at=datetime.now(timezone.utc).isoformat(), pack={"id": pack})
        self._write()

    def close(self, fields: dict | None = None, error: BaseException | None = None, stop: bool = True) -> float:
        """Write the job's final record and return its objective; report an error in one line (exit 2 for the
        user's mistakes outside a sweep); re-raise interrupts after recording them, unless stop=False (an interrupt
        of another process, a pack's worker, which this one outlives)."""
        cfg = self.cfg
        if error is None and (why := diverged(fields)):  # a run without a trained, finite model never completes
            self.record.update({k: v for k, v in (fields or {}).items() if k != "status"})
            error = TrainingError(why)
        if isinstance(error, UsageError):
            if not self.owned:  # the directory is another run's (or another process's): nothing of it is touched
                if self.sweep_dir is not None:
                    rundir.note_refused(self.sweep_dir, self.run_dir, str(error))
            elif self.previous is not None and not isinstance(error, TrainingError):  # a refused resume: the run
                # keeps the record it had
                write_text_atomic(self.run_dir / "results.json", self.previous)
            elif self.fresh and not self.in_sweep and not (self.run_dir / "results.json").exists():
                rundir.remove_fresh(self.run_dir)  # refused before it began: it leaves no directory behind
            else:
                self._finish(error)
            kind = next(text for kind, text in _KIND if isinstance(error, kind))
            _say(f"headlab-train: {kind}: {error}")
            if tracebacks():
                raise error
            if not self.in_sweep:
                sys.exit(2)
            return objective(cfg, self.record)  # a sweep records the failure and goes on with the next job
        if isinstance(error, Exception):
            self._finish(error)
            if not self.in_sweep:
                raise error
            print(
                f"headlab-train: job {self.run_dir} failed: {self.record['error']} (traceback in its results.json)",
                file=sys.stderr,
            )
            return objective(cfg, self.record)
        if error is not None:  # Ctrl-C, SIGTERM via SystemExit: recorded as interrupted, then stop
            self._finish(error)
            hint = (
                f"continue the sweep with the same command and sweep.resume=true hydra.sweep.dir={self.run_dir.parent}"
                if self.in_sweep
                else f"continue it with: headlab-train resume={self.run_dir}"
            )
            _say(f"headlab-train: interrupted: {hint}")
            if not stop:
                return objective(cfg, self.record)
            if _ctrl_c:
                sys.exit(128 + signal.SIGINT)
            if isinstance(error, SystemExit) and not error.code:  # Lightning's SIGTERMException carries no code
                sys.exit(128 + signal.SIGTERM)
            raise error
        self.record.update(fields or {}, status="completed")
        self._finish()
        log.info(console.outcome(self.run_dir, self.record))
        return objective(cfg, self.record)

    def _finish(self, error: BaseException | None = None) -> None:
        record = self.record
        if isinstance(error, KeyboardInterrupt | SystemExit):
            record.update(status="interrupted", error=_stopped_by(error))
        elif error is not None:
            record.update(status="failed", error=f"{type(error).__name__}: {error}")
            record["traceback"] = "".join(traceback.format_exception(error))
        record["duration_s"] = round(time.time() - self.started, 3)
        try:
            self._write()
        except DiskFull as full:  # results.json keeps its "running" record
            print(
                f"headlab-train: the run's final status ({record['status']}) is not recorded: {full}", file=sys.stderr
            )
        rundir.release(self.run_dir)  # its record is final: the run is readable (headlab-heads) while the sweep goes on

    def _write(self) -> None:
        """results.json, from the process that owns the run directory only (rank 0: the other ranks of a run that
        re-runs the command run this code too)."""
        if self.owned:
            write_record(self.run_dir, self.record)


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


def _say(line: str) -> None:
    """A line on stderr, once a process (a sweep says a mistake every job shares once)."""
    if line not in _said:
        print(line, file=sys.stderr)
    _said.add(line)


def _requeued(run_dir: Path) -> bool:
    """A SLURM job started again (preempted or timed out, then requeued by submitit) in a run directory that
    already holds the checkpoint its first attempt saved when it was signalled."""
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    return restarts.isdigit() and int(restarts) > 0 and (run_dir / "checkpoints" / "last.ckpt").exists()


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
