"""A job's share of the machine: its cores and torch threads, its GPU among a local sweep's jobs, its rank.

Only Hydra and the standard library are imported here: this runs before torch in every job.
"""

import os

from hydra.core.hydra_config import HydraConfig


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


def process_rank() -> int:
    """This process's rank in a multi-process run started by re-running the command (Lightning's DDP
    subprocesses, srun tasks), read as Lightning reads it; 0 for a job's own process. Only rank 0 writes the
    run's records."""
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key])
    return 0
