"""The packed launcher's work: open every job of a sweep, group the jobs that can share one vectorized model into
packs, train each pack, and close every job as headlab-train closes a single one.

Which jobs share a pack is headlab.launch.plan's (the same plan for packs as SLURM jobs, headlab.launch.pack_slurm).
"""

import contextlib
import logging
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from omegaconf import OmegaConf, open_dict

from headlab.launch import console, estimates, runtime
from headlab.launch.compose import compose_jobs
from headlab.launch.job import Job, objective, stop_on_ctrl_c, stop_on_sigterm
from headlab.launch.plan import at_once, max_pack, on_cpu, plan, trained_at_once
from headlab.printing import duration
from headlab.record import read_record
from headlab.training.loggers import run_identity

log = logging.getLogger("headlab")


def prepare(cfg) -> Job | float:
    """The task each job runs under Hydra: open and check it, and resolve its config while Hydra's job
    information (its directory, its overrides) is its own. Returns the job ("queued" until its pack starts), or its
    objective when it ends here."""
    job = Job.open(cfg)
    if (earlier := job.skipped()) is not None:
        return earlier
    job.record["status"] = "queued"
    try:
        job.check()
        wandb = (cfg.get("logger") or {}).get("wandb")
        with open_dict(cfg):
            if wandb is not None:
                wandb.name, wandb.group = run_identity(wandb.name, wandb.group)
            OmegaConf.resolve(cfg)
    except BaseException as error:
        return job.close(error=error)
    return job


def open_jobs(hydra_context, config, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
    """Every job of the sweep composed first (an override that cannot compose touches nothing), then prepared under
    Hydra (prepare: its run directory, .hydra files, record and check); each job's JobReturn, whose value is the Job
    to train or the objective of one that ended there."""
    composed = compose_jobs(hydra_context.config_loader, config, job_overrides)
    returns: list[JobReturn] = []
    for idx, (overrides, sweep_config) in enumerate(zip(job_overrides, composed, strict=True), start=initial_job_idx):
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = sweep_config.hydra.job.num = idx
        log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
        returns.append(
            run_job(
                hydra_context=hydra_context,
                task_function=prepare,
                config=sweep_config,
                job_dir_key="hydra.sweep.dir",
                job_subdir_key="hydra.sweep.subdir",
            )
        )
        configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    return returns


class PackLedger:
    """Which packs of a sweep began and ended: start(k) opens pack k's jobs, close(k, results) closes each with its
    result or error and says how many packs ended and how long the rest will take at this pace (at the end: what
    they took, against the estimate)."""

    def __init__(self, packs: list, ready: list, n_jobs: int):
        self.packs, self.ready, self.n_jobs = packs, ready, n_jobs
        self.done: set[int] = set()  # id() of each job closed
        self.closed = [False] * len(packs)
        self.began: list[float] = []  # when each pack began (monotonic)
        self.estimated: list[float] = []  # seconds the packs were said to take, where it could be said

    def start(self, k: int) -> None:
        self.began.append(time.monotonic())
        for job in self.packs[k].jobs:
            job.start(self.packs[k].id)

    def close(self, k: int, results: list) -> None:
        pack = self.packs[k]
        for ret, job, result in zip(pack.returns, pack.jobs, results, strict=True):
            if isinstance(result, BaseException):  # a worker's interrupt is its pack's: the others go on
                ret.return_value = job.close(error=result, stop=self.n_jobs == 1)
            else:
                ret.return_value = job.close(result)
            self.done.add(id(job))
        self.closed[k] = True
        completed = sum(job.record.get("status") == "completed" for _, job in self.ready)
        ended, took = sum(self.closed), time.monotonic() - self.began[0]
        pace = f"; about {duration(took / ended * (len(self.packs) - ended))} to go at this pace"
        if ended == len(self.packs):  # what it took against what it was said to take
            said = f" (estimated {duration(self.estimated[0])})" if self.estimated else ""
            pace = f"; they took {duration(took)}{said}"
        log.info(
            "packed launcher: %d of %d packs ended; %d of the %d jobs to train completed%s",
            ended, len(self.packs), completed, len(self.ready), pace,
        )  # fmt: skip


def launch(launcher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int):
    """Hydra's Launcher.launch for the packed launcher (its hydra_context and config, and its settings: max_pack,
    n_jobs, submit, slurm): every job gets its run directory and .hydra files as with any launcher; the packs train
    here (submit=local) or as SLURM jobs (submit=slurm: headlab.launch.pack_slurm)."""
    from headlab.errors import fail

    hydra_context, config = launcher.hydra_context, launcher.config
    submit, slurm = launcher.submit, launcher.slurm
    most, n_jobs = max_pack(config), at_once(config)  # each checked
    if submit not in ("local", "slurm"):
        fail("hydra.launcher.submit", submit, "one of local, slurm")
    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    signal.signal(signal.SIGTERM, stop_on_sigterm)  # outside Lightning's loops (data, head analysis): an interrupt
    signal.signal(signal.SIGINT, stop_on_ctrl_c)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    returns = open_jobs(hydra_context, config, job_overrides, initial_job_idx)
    ready = [(ret, ret.return_value) for ret in returns if ret.status is JobStatus.COMPLETED]
    ready = [(ret, job) for ret, job in ready if isinstance(job, Job)]  # not those skipped or refused
    packs = plan(ready, most, sweep_dir.name, at_least=n_jobs)
    n_jobs = trained_at_once(config, [pack.mem_gb() for pack in packs], n_jobs)
    said = f"packed launcher: {len(ready)} jobs to train in {len(packs)} pack(s) of at most {most}"
    said += f", {n_jobs} at a time"
    if not packs:  # every job skipped (completed before) or refused: nothing to import torch for
        log.info(said)
        return returns
    if submit == "slurm":
        from headlab.launch.pack_slurm import run_on_slurm

        log.info(said)
        run_on_slurm(packs, slurm)
        for ret, job in ready:  # each pack's SLURM job closed its members' records
            ret.return_value = objective(job.cfg, read_record(job.run_dir) or job.record)
        return returns
    ledger = PackLedger(packs, ready, n_jobs)
    try:
        log.info(said + _estimated(config, packs, n_jobs, ledger))
        with runtime.heavy_imports():  # torch and Lightning, once every job is checked
            from headlab.training.pack.train import train_members

        trained = [(pack.id, pack.members()) for pack in packs]

        console.quiet()  # Hydra's logging was set up anew after the jobs were prepared; Lightning's is now loaded
        if n_jobs == 1:
            for k, (pack_id, members) in enumerate(trained):
                ledger.start(k)
                ledger.close(k, train_members(members, pack_id))
        else:
            from headlab.launch.workers import run_parallel
            from headlab.training.cores import usable_cores

            accelerator = str(ready[0][1].cfg.trainer.get("accelerator"))
            n_gpus = _gpu_count() if accelerator in ("gpu", "cuda", "auto") else 0
            run_parallel(
                trained, train_members, n_jobs, max(1, usable_cores() // n_jobs), n_gpus, ledger.start, ledger.close
            )
    except BaseException as error:  # an interrupt: every job started and not closed records it, a queued one
        # too where no pack had begun (the sweep was preparing: the estimate's data), else it stays queued
        statuses = ("running", *(() if ledger.began else ("queued",)))
        for job in [job for _, job in ready if id(job) not in ledger.done and job.record.get("status") in statuses]:
            with contextlib.suppress(BaseException):  # close re-raises interrupts once recorded
                job.close(error=error)
        if isinstance(error, SystemExit) and not error.code:  # Lightning's SIGTERMException carries no code
            raise SystemExit(128 + signal.SIGTERM) from error
        raise
    return returns


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def _estimated(config, packs: list, n_jobs: int, ledger: PackLedger) -> str:
    """What the launcher says its packs will take, kept in the ledger: its dry run's estimate where the same command
    had one (not measured twice), else timed here (_estimate); "" where neither can be said."""
    known = estimates.kept(config)
    if known and known["packs_seconds"] is not None:
        ledger.estimated.append(known["packs_seconds"])
        return f", about {duration(known['packs_seconds'])} (its dry run of {known['at']})"
    if not (estimated := _estimate(packs, n_jobs)):
        return ""
    seconds, timed, shapes = estimated
    ledger.estimated.append(seconds)
    said = f", about {duration(seconds)} here"
    if timed < shapes:
        said += f" ({timed} of its {shapes} shapes timed, the rest priced alike: timing each would cost more than a"
        said += " tenth of the sweep)"
    return said


def _estimate(packs: list, n_jobs: int) -> tuple[float, int, int] | None:
    """(seconds, shapes timed, shapes) of the packs on this CPU, timed as --dry-run times them while that costs at
    most a tenth of what it prices (dry_run.estimate); None where they train elsewhere, or where a pack cannot be
    built (it says why when it trains, as without an estimate)."""
    from headlab.launch.dry_run import estimate

    if not on_cpu(packs[0].jobs[0].cfg):  # the only device a few timed steps before training tell
        return None
    try:
        return estimate([len(pack.jobs) for pack in packs], [pack.jobs[0].cfg for pack in packs], n_jobs)
    except Exception:
        return None
