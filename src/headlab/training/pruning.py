"""A trial of hydra/sweeper=search that its study may prune: after each validation the run reports its monitored
metric to the trial (step: the epoch) and, where the study's pruner says the trial is behind, stops as early
stopping stops (a completed run of fewer epochs; the study records the trial as pruned)."""

import logging

import lightning.pytorch as pl
import optuna

log = logging.getLogger("headlab")

PRUNERS = ("none", "median")


def make_pruner(name: str) -> optuna.pruners.BasePruner:
    """none; median: Optuna's median rule, from the sixth trial on and after each trial's first epoch."""
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1)
    return optuna.pruners.NopPruner()


class TrialPruning(pl.Callback):
    """Reports `monitor` to trial `trial` (id `trial_id`) of the study in `storage`, and stops the run where its
    pruner prunes the trial."""

    def __init__(self, storage: str, study_name: str, trial_id: int, trial: int, pruner: str, monitor: str):
        self.study = optuna.load_study(study_name=study_name, storage=storage, pruner=make_pruner(pruner))
        self.trial, self.number, self.monitor = optuna.trial.Trial(self.study, trial_id), trial, monitor

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        value = trainer.callback_metrics.get(self.monitor)
        if trainer.sanity_checking or value is None:
            return
        prune = False
        if trainer.global_rank == 0:  # one report a validation; every rank stops with it
            self.trial.report(float(value), step=trainer.current_epoch)
            if prune := self.trial.should_prune():
                self.study.tell(self.number, state=optuna.trial.TrialState.PRUNED)
                log.info("search: trial %d pruned after epoch %d (%s %.4f)", self.number, trainer.current_epoch,
                         self.monitor, float(value))  # fmt: skip
        if trainer.strategy.broadcast(prune, src=0):
            trainer.should_stop = True
