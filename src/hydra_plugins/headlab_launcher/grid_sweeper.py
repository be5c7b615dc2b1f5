"""hydra/sweeper=grid (headlab's default): Hydra's basic sweeper, the grid of the -m overrides (one job per fold
where the config cross-validates and names no fold), then the rounds of sweep.extend (headlab.launch.grid): arms
whose best value of a key is an edge of its grid get one more value beyond, launched as more jobs of the same sweep
by the same launcher (packed, local or SLURM). With sweep.sequential.looks, the grid's seeds run in rounds instead,
and an arm stops once its contrast with the baseline is decided (headlab.stats.sequential).

It holds a BasicSweeper rather than subclassing it: Hydra's plugin scan loads its core plugins' modules again, and
BasicSweeper's own super() call then refuses a subclass of the class as first imported."""

import logging
from pathlib import Path

from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf

log = logging.getLogger("headlab")


class GridSweeper(Sweeper):
    def __init__(self, max_batch_size: int | None = None, params: dict | None = None):
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # the class as Hydra has it now

        self.grid = BasicSweeper(max_batch_size, params)
        self.config = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.grid.setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.config = config
        if getattr(self.grid.launcher, "composes_every_job_first", False):  # the packed launcher: composing each
            self.grid.validate_batch_is_legal = lambda batch: None  # job twice cost ~0.3 s a job (a resume too)
        else:
            self.grid.validate_batch_is_legal = self.composed_first

    def sweep(self, arguments: list[str]):
        from headlab.launch.grid import (
            check_extension,
            check_subdir,
            extension_jobs,
            fold_sweep,
            say_repeats,
            sequential_sweep,
        )
        from headlab.launch.job import check_sweep

        check_sweep(self.config)
        extend = OmegaConf.select(self.config, "sweep.extend")
        if extend and extend.get("key"):  # before any job: a misspelt key costs nothing
            params = OmegaConf.select(self.config, "hydra.sweeper.params")
            check_extension(extend.key, arguments, OmegaConf.to_container(params) if params else None)
        arguments = fold_sweep(self.config, arguments)
        subdir = OmegaConf.to_container(self.config.hydra.sweep, resolve=False).get("subdir")
        say_repeats(jobs := self.jobs(arguments))  # a value given twice: the same run twice
        if "${" not in str(subdir):  # one name for every job: refused before the first one trains
            check_subdir(subdir, len(jobs))
        if OmegaConf.select(self.config, "sweep.dry_run"):
            return self.dry_run(self.jobs(arguments))
        if OmegaConf.select(self.config, "sweep.sequential.looks"):
            sweep_dir, resume = Path(str(self.config.hydra.sweep.dir)), bool(self.config.sweep.get("resume"))
            return sequential_sweep(self.grid.launcher.launch, self.jobs(arguments), self.config.sweep.sequential,
                                    sweep_dir, resume)  # fmt: skip
        returns = self.grid.sweep(arguments)
        if not extend or not extend.get("key"):
            return returns
        sweep_dir, done = Path(str(self.config.hydra.sweep.dir)), sum(len(batch) for batch in returns)
        rounds = int(extend.limit)
        for round_ in range(1, rounds + 2):
            jobs, said = extension_jobs(sweep_dir, extend.key, float(extend.factor), extend.select_on, before=done)
            if not jobs:
                log.info("sweep.extend: every arm's best %s is inside its grid", extend.key)
                break
            if round_ > rounds:
                log.warning("sweep.extend: after %d round(s) some arm's best %s is still an edge", rounds, extend.key)
                break
            if OmegaConf.select(self.config, "sweep.resume"):  # its jobs skip or continue as the grid's do
                jobs = [[*job, "sweep.resume=true"] for job in jobs]
            for line in said:
                log.info("sweep.extend round %d: %s", round_, line)
            returns.append(self.grid.launcher.launch(jobs, initial_job_idx=done))
            done += len(jobs)
        return returns

    def composed_first(self, batch) -> None:
        """Hydra's check that every job of a batch composes, before the first one runs (BasicSweeper composes each
        job for it, and the launcher each again to run it), at one composition a group of jobs that differ only in
        per-member values (headlab.launch.compose); Hydra's basic launcher, which composes each job here as it
        runs it, is given these compositions (hand_over), not composing twice; the local and SLURM launchers compose
        each job in the process that runs it."""
        from headlab.launch.compose import compose_jobs, hand_over

        loader = self.grid.hydra_context.config_loader
        composed = compose_jobs(loader, self.config, batch)
        if type(self.grid.launcher).__name__ == "BasicLauncher":  # by name: Hydra's plugin scan reloads its class
            kept = {tuple(job): cfg for job, cfg in zip(batch, composed, strict=True)}
            hand_over(loader, "load_sweep_config", kept, lambda master_config, overrides: tuple(overrides))

    def jobs(self, arguments: list[str]) -> list[list[str]]:
        """Each job's overrides, as the basic sweeper makes them from the sweeper's params and the arguments."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parser = OverridesParser.create(config_loader=self.grid.hydra_context.config_loader)
        batches = self.grid.split_arguments(parser.parse_overrides(self.grid._parse_config() + arguments), None)
        return [list(job) for batch in batches for job in batch]

    def dry_run(self, jobs: list[list[str]]) -> list:
        """Say what the sweep would run and about how long it takes here (headlab.launch.dry_run); run nothing."""
        from headlab.launch import dry_run

        packed = getattr(self.grid.launcher, "composes_every_job_first", False)
        return dry_run.say(jobs, self.config, self.grid.hydra_context.config_loader, packed)
