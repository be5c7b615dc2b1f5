"""hydra/launcher=packed: the jobs of a sweep that share an architecture trained as one vectorized model.

The plugin is a thin shell: its settings and their defaults are conf/hydra/launcher/packed.yaml, the work is in
headlab.launch.packs.
"""

from collections.abc import Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class PackedLauncher(Launcher):
    composes_every_job_first = True  # launch composes all its jobs before it prepares one: the sweeper need not

    def __init__(self, max_pack: int, n_jobs: int, submit: str, slurm: dict | None) -> None:
        self.max_pack, self.n_jobs, self.submit, self.slurm = max_pack, n_jobs, submit, slurm
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from headlab.launch.packs import launch

        return launch(self, job_overrides, initial_job_idx)
