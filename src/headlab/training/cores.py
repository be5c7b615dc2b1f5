"""A job's share of the machine: its cores and torch threads, its GPU among a local sweep's jobs, its rank.

Only Hydra and the standard library are imported here: this runs before torch in every job.
"""

import logging
import os

from hydra.core.hydra_config import HydraConfig

log = logging.getLogger("headlab")
threaded = False  # whether this process has run torch on more than one CPU thread (run.configure_torch sets it)


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (what SLURM, taskset or a container grant), not every
    core of the host; inside a SLURM job no more than SLURM granted the task (SLURM_CPUS_PER_TASK), also where
    SLURM does not confine it (TaskPlugin=task/none)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    granted = os.environ.get("SLURM_CPUS_PER_TASK", "")
    return min(cores, int(granted)) if granted.isdigit() and int(granted) > 0 else cores


def parallel_jobs() -> int:
    """How many jobs of this sweep run at once on this machine (the joblib launcher's n_jobs, else 1: the packed
    launcher's packs are given their threads)."""
    hydra = HydraConfig.get()
    n_jobs = hydra.launcher.get("n_jobs") if "launcher" in hydra else None
    if not isinstance(n_jobs, int):
        return 1
    return n_jobs if n_jobs >= 1 else max(1, usable_cores() + 1 + n_jobs)  # joblib: -1 = all cores


def cpu_threads() -> int:
    """Torch threads for this job: the cores shared out among the jobs running at once."""
    return max(1, usable_cores() // parallel_jobs())


def gpu_for_job(n_gpus: int) -> int:
    """With several jobs at once on a GPU machine, job k gets GPU k mod n_gpus."""
    return HydraConfig.get().job.num % n_gpus if n_gpus else 0


def process_rank() -> int:
    """This process's rank in a multi-process run started by re-running the command (Lightning's DDP
    subprocesses, srun tasks), read as Lightning reads it; 0 for a job's own process. Only rank 0 writes the
    run's records."""
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def rank_start(trainer_cfg) -> str | None:
    """How Lightning starts a run's ranks from this process: "fork" (ddp_fork, ddp_notebook) or "spawn"
    (ddp_spawn); None when this process trains itself (one device, or rank 0 of ddp's relaunched command)."""
    strategy = str(trainer_cfg.get("strategy", "auto"))
    if "spawn" in strategy:
        return "spawn"
    return "fork" if "fork" in strategy or "notebook" in strategy else None


def rank_environment(trainer_cfg) -> dict:
    """The Trainer's plugins for ranks the strategy starts itself (ddp_fork, ddp_spawn): Lightning's own cluster
    environment, which numbers them; inside a SLURM job Lightning would take SLURM's, where every rank it starts reads
    the job's one task as its rank and all would be rank 0 (each then claims the rendezvous port)."""
    if rank_start(trainer_cfg) is None:
        return {}
    from lightning.fabric.plugins.environments import LightningEnvironment

    return {"plugins": [LightningEnvironment()]}


def rank_threads(trainer_cfg, threads: int) -> int:
    """Torch threads for each forked rank. A process forked after torch has run on several OpenMP threads hangs
    at its first parallel operation (GNU libgomp is not fork-safe; seen as DDP ranks asleep after the model
    summary on many-core hosts): the job process prepares on one thread and every rank sets its own, or, when
    an earlier job of this process ran multi-threaded, the ranks run on one thread each."""
    if rank_start(trainer_cfg) != "fork" or not threaded:
        return threads
    if threads > 1:
        log.warning(
            "trainer.strategy=%s: one torch thread per rank, not %d: an earlier job of this process ran torch on "
            "several threads, and ranks forked after that would hang (run such jobs in their own sweep)",
            trainer_cfg.strategy,
            threads,
        )
    return 1


def rank_share(trainer_cfg, threads: int) -> int:
    """A rank's torch threads: a multi-device CPU run's ranks share the job's threads (rank_threads)."""
    devices = trainer_cfg.devices
    ranks_here = devices if trainer_cfg.accelerator == "cpu" and isinstance(devices, int) else 1
    return rank_threads(trainer_cfg, max(1, threads // max(1, ranks_here)))
