"""A callback that sends its own process a signal (SIGTERM, SIGKILL) at one chosen moment of a run, once: fault
tests use it through the real CLI (+callbacks.fault._target_=faults.SignalAt), so that a signal lands exactly
where they need it, on any machine, however fast."""

import os
import signal
from pathlib import Path

import lightning.pytorch as pl


class SignalAt(pl.Callback):
    """`signum` at `moment` ('train_batch', 'validation_batch', 'train_end' (just before the head analysis) or
    'test_batch'), at `epoch` and `batch` where they apply; never again once `once_file` exists (a resumed run)."""

    def __init__(self, moment: str, once_file: str, epoch: int = 0, batch: int = 0, signum: int = signal.SIGTERM):
        self.moment, self.once_file, self.epoch, self.batch = moment, Path(once_file), epoch, batch
        self.signum = signum

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
