"""hydra/sweeper=search: an Optuna study whose trials are the sweep's jobs (headlab.launch.search), launched
n_jobs at a time by the sweep's launcher (local, packed or SLURM), until the study holds n_trials trials."""

import logging
from pathlib import Path

from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf

log = logging.getLogger("headlab")


class SearchSweeper(Sweeper):
    def __init__(
        self, direction: str, study_name: str, storage: str | None, n_trials: int, n_jobs: int, seed: int | None,
        pruner: str, params: dict | None = None,
    ):  # fmt: skip
        self.settings = dict(direction=direction, study_name=study_name, storage=storage, seed=seed, pruner=pruner)
        self.n_trials, self.n_jobs, self.params = n_trials, n_jobs, params or {}
        self.config = self.launcher = self.hydra_context = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> list:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from headlab.launch import extras
        from headlab.launch.job import check_sweep

        check_sweep(self.config)
        search = extras.search()  # or one line: the optuna extra is not installed
        packed, objective = getattr(self.launcher, "composes_every_job_first", False), str(self.config.sweep.objective)
        search.check(self.n_trials, self.n_jobs, self.settings["pruner"], packed, self.settings["direction"], objective)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        given = [f"{key}={value}" for key, value in self.params.items()] + list(arguments)
        space = search.space(parser.parse_overrides(given))
        storage, pruner = search.absolute(self.settings["storage"]), self.settings["pruner"]
        if OmegaConf.select(self.config, "sweep.dry_run"):  # nothing asked, nothing stored, nothing trained
            return search.dry_run(self.config, self.hydra_context.config_loader, packed, space, storage,
                                  self.settings["study_name"], self.n_trials, self.n_jobs)  # fmt: skip
        study = search.open_study(self.settings["study_name"], storage, self.settings["direction"], pruner, objective)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        trials = search.Trials(study, space, objective, storage, pruner, self.settings["seed"])
        resume = bool(OmegaConf.select(self.config, "sweep.resume"))
        returns = trials.run(self.launcher.launch, self.n_trials, self.n_jobs, resume)
        search.write_results(sweep_dir / "optimization_results.yaml", study, trials.objective)
        return returns
