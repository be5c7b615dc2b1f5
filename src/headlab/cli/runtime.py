"""What headlab's command-line tools set up in the process before Hydra composes a config: made in one place.

configure() registers the OmegaConf resolvers that headlab's configs use (SLURM resources, the benchmarks' folder) and
headlab's launchers with Hydra (Hydra's own scan of the hydra_plugins namespace misses them in an editable
install). Called when headlab.cli.train is imported, so that a SLURM job unpickling its task has them too.
"""

import os
from pathlib import Path

from omegaconf import OmegaConf


def gpus_per_node(accelerator: str, devices) -> int:
    """GPUs a SLURM job must ask for: the trainer's devices when it trains on GPUs, else none."""
    if accelerator not in ("gpu", "cuda"):
        return 0
    return len(devices) if isinstance(devices, list | tuple) else int(devices)


def data_dir() -> str:
    """Where the released text benchmarks are (conf/data/mr.yaml, ...): $HEADLAB_DATA, else ../shared/data, as an
    absolute path (a run records where its files were)."""
    return str(Path(os.environ.get("HEADLAB_DATA") or "../shared/data").expanduser().resolve())


def configure() -> None:
    from hydra.core.plugins import Plugins

    from hydra_plugins.headlab_launcher.grid_sweeper import GridSweeper
    from hydra_plugins.headlab_launcher.packed_launcher import PackedLauncher
    from hydra_plugins.headlab_launcher.slurm_launcher import SlurmLauncher

    Plugins.instance().register(GridSweeper)
    Plugins.instance().register(PackedLauncher)
    Plugins.instance().register(SlurmLauncher)
    OmegaConf.register_new_resolver("headlab.gpus_per_node", gpus_per_node, replace=True)
    OmegaConf.register_new_resolver("headlab.data_dir", data_dir, replace=True)
    OmegaConf.register_new_resolver("headlab.or", lambda value, default: value or default, replace=True)
