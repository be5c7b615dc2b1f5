"""hydra/launcher=packed: the jobs of a sweep that share an architecture trained as one vectorized model.

The plugin is a thin shell: the work is in headlab.cli.packed.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class PackedLauncherConf:
    _target_: str = "hydra_plugins.headlab_launcher.packed_launcher.PackedLauncher"
    max_pack: int = 64  # members per pack at most; a memory check may split a pack further
    n_jobs: int = 1  # packs trained at once, each in its own process


ConfigStore.instance().store(
    group="hydra/launcher", name="_headlab_packed", node=PackedLauncherConf, provider="headlab"
)


class PackedLauncher(Launcher):
    def __init__(self, max_pack: int = 64, n_jobs: int = 1) -> None:
        self.max_pack, self.n_jobs = max_pack, n_jobs
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from headlab.cli.packed import launch

        return launch(self.hydra_context, self.config, job_overrides, initial_job_idx, self.max_pack, self.n_jobs)
