"""What a job of a sweep needs beyond a single run: its share of the machine, resuming, and the sweep's summary.

Only Hydra and the standard library are imported here: this runs before torch in every job.
"""

import logging
import os
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from headlab.training.results import read_record, same_run

log = logging.getLogger("headlab")


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (what SLURM, taskset or a container grant), not every
    core of the host; inside a SLURM job no more than SLURM granted the task (SLURM_CPUS_PER_TASK), also where
    SLURM does not confine it (TaskPlugin=task/none)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    granted = os.environ.get("SLURM_CPUS_PER_TASK", "")
    return min(cores, int(granted)) if granted.isdigit() and int(granted) > 0 else cores


def parallel_jobs() -> int:
    """How many jobs of this sweep run at once on this machine (the joblib launcher's n_jobs, else 1)."""
    hydra = HydraConfig.get()
    n_jobs = hydra.launcher.get("n_jobs") if "launcher" in hydra else None
    if n_jobs is None or n_jobs < 1:
        return 1 if n_jobs is None else max(1, usable_cores() + 1 + n_jobs)  # joblib: -1 = all cores
    return int(n_jobs)


def cpu_threads() -> int:
    """Torch threads for this job: the cores shared out among the jobs running at once."""
    return max(1, usable_cores() // parallel_jobs())


def gpu_for_job(n_gpus: int) -> int:
    """With several jobs at once on a GPU machine, job k gets GPU k mod n_gpus."""
    return HydraConfig.get().job.num % n_gpus if n_gpus else 0


def objective(cfg: DictConfig, record: dict) -> float:
    """What a job returns to its sweeper (Optuna maximises it): sweep.objective of its metrics, NaN if it failed."""
    value = record.get("metrics", {}).get(cfg.sweep.objective) if record.get("status") == "completed" else None
    return float("nan") if value is None else float(value)


def process_rank() -> int:
    """This process's rank in a multi-process run started by re-running the command (Lightning's DDP
    subprocesses, srun tasks), read as Lightning reads it; 0 for a job's own process. Only rank 0 writes the
    run's records."""
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def requeued(run_dir: Path) -> bool:
    """A SLURM job started again (preempted or timed out, then requeued by submitit) in a run directory that
    already holds the checkpoint its first attempt saved when it was signalled."""
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    return restarts.isdigit() and int(restarts) > 0 and (run_dir / "checkpoints" / "last.ckpt").exists()


def completed_before(run_dir: Path, flat_config: dict) -> bool:
    """Did this job already complete, with the same configuration? (Resuming a sweep skips it.)"""
    previous = read_record(run_dir) or {}
    return previous.get("status") == "completed" and same_run(previous.get("config"), flat_config)
