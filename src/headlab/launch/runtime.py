"""The OmegaConf resolvers headlab's configs use (SLURM resources, the benchmarks' folder), registered in one place,
and YAML files parsed once a process (yaml_once): by each console script before Hydra composes a config, and by
each process that composes or resolves one without it (a SLURM job, a pack's SLURM job)."""

from omegaconf import OmegaConf

from headlab.conventions import data_dir
from headlab.launch import yaml_once


def gpus_per_node(accelerator: str, devices) -> int:
    """GPUs a SLURM job must ask for: the trainer's devices when it trains on GPUs, else none."""
    if accelerator not in ("gpu", "cuda"):
        return 0
    return len(devices) if isinstance(devices, list | tuple) else int(devices)


def tasks_per_node(strategy: str, devices):
    """SLURM tasks a job runs on each node: one per device, each a rank, where Lightning takes its ranks from SLURM
    (ddp); one where the strategy starts its ranks itself (ddp_fork, ddp_spawn: each task would start them again)."""
    from headlab.training.cores import rank_start

    return 1 if rank_start({"strategy": strategy}) else devices


def configure() -> None:
    OmegaConf.register_new_resolver("headlab.gpus_per_node", gpus_per_node, replace=True)
    OmegaConf.register_new_resolver("headlab.tasks_per_node", tasks_per_node, replace=True)
    OmegaConf.register_new_resolver("headlab.data_dir", lambda: str(data_dir()), replace=True)
    OmegaConf.register_new_resolver("headlab.or", lambda value, default: value or default, replace=True)
    yaml_once.install()
