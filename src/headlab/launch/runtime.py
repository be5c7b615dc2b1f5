"""The OmegaConf resolvers headlab's configs use (SLURM resources, the benchmarks' folder), registered in one place,
and YAML files parsed once a process (yaml_once): by each console script before Hydra composes a config, and by
each process that composes or resolves one without it (a SLURM job, a pack's SLURM job). And how a process imports
torch and Lightning (heavy_imports)."""

import contextlib
import gc
import sys
import types

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


@contextlib.contextmanager
def heavy_imports():
    """Around the import of torch, Lightning and headlab's training: Python's cyclic garbage collector held off
    while the block runs, and, where it imported anything, every object then alive frozen out of the collector's
    later passes (gc.freeze). Those modules make over half a million objects that live as long as the process:
    the collector's full passes over them, as they import and again during a run, cost a run of a few seconds a
    third of its CPU time. A process forked afterwards (a pack's worker, a forked rank) finds them frozen too.
    torchmetrics, which Lightning imports, is imported first, without scipy.signal (see below)."""
    modules, enabled = len(sys.modules), gc.isenabled()
    gc.disable()
    try:
        _torchmetrics_without_scipy_signal()
        yield
    finally:
        if len(sys.modules) > modules:
            gc.freeze()
        if enabled:
            gc.enable()


def _torchmetrics_without_scipy_signal() -> None:
    """Import torchmetrics with a placeholder for scipy.signal, then take the placeholder away. torchmetrics imports
    scipy.signal as it imports, only to give it back a name an audio package it does not ship looks for
    (`scipy.signal.hamming`): with the scipy.stats it imports in turn, 0.5 s of the 3.5 s a small run's process
    takes, start to end. headlab uses no torchmetrics metric that reads scipy.signal; the real one imports, as
    before, wherever something asks for it."""
    if "torchmetrics" in sys.modules or "scipy.signal" in sys.modules:
        return
    placeholder = types.ModuleType("scipy.signal", "what torchmetrics' import looks at in place of scipy.signal")
    placeholder.hamming = None  # torchmetrics adds it where it is missing
    sys.modules["scipy.signal"] = placeholder
    try:
        import torchmetrics  # noqa: F401
    finally:
        del sys.modules["scipy.signal"]
