"""Faults at chosen moments, on any machine however fast: a callback that sends its own process a signal (SIGTERM,
SIGKILL) at one moment of a run, once (+callbacks.fault._target_=faults.SignalAt), and a task whose data
preparation waits to be signalled (data.task._target_=faults.WaitingTask)."""

import os
import signal
import time
from pathlib import Path

import lightning.pytorch as pl

from headlab.data.recall import AssociativeRecall
from headlab.model.rules import same


class SignalAt(pl.Callback):
    """`signum` at `moment` ('train_batch', 'validation_batch', 'train_end' (just before the head analysis),
    'test_batch', or 'checkpoint': while the checkpoints of the run's `batch`-th validation are being made,
    before any of their files is written), at `epoch` and `batch` where they apply; never again once `once_file`
    exists (a resumed run)."""

    def __init__(self, moment: str, once_file: str, epoch: int = 0, batch: int = 0, signum: int = signal.SIGTERM):
        self.moment, self.once_file, self.epoch, self.batch = moment, Path(once_file), epoch, batch
        self.signum = signum
        self.checkpoints = 0

    def _at(self, moment: str, epoch: int | None = None, batch: int | None = None) -> None:
        here = moment == self.moment and epoch in (None, self.epoch) and batch in (None, self.batch)
        if here and not self.once_file.exists():
            self.once_file.touch()
            os.kill(os.getpid(), self.signum)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._at("train_batch", trainer.current_epoch, batch_idx)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self._at("validation_batch", trainer.current_epoch, batch_idx)

    def on_train_end(self, trainer, pl_module):
        self._at("train_end")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._at("test_batch", None, batch_idx)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self._at("checkpoint", None, self.checkpoints)
        self.checkpoints += 1


class WaitingTask(AssociativeRecall):
    """The default task, whose data preparation touches `marker` and then waits (for a signal): a test that sees
    the marker knows the run is preparing its data."""

    def __init__(self, marker: str, **settings):
        super().__init__(**settings)
        self.marker = Path(marker)

    @staticmethod
    def check(marker=None, name=same, **settings) -> None:
        AssociativeRecall.check(**settings, name=name)

    def sample(self, rng, n):
        self.marker.touch()
        time.sleep(300)
        return super().sample(rng, n)
