"""Progress while a run trains: Lightning's rich bar on a terminal (without a host-device synchronisation at every
batch), plain lines every few seconds and at every validation where output goes to a file or a batch job's log."""

import logging
import math
import sys
import time

from lightning.pytorch.callbacks import ProgressBar as LightningProgressBar
from lightning.pytorch.callbacks import RichProgressBar

log = logging.getLogger("headlab")


def progress_bar(every_n_steps: int = 50, every_s: float = 30.0) -> LightningProgressBar:
    """The progress bar for where the output goes: a terminal gets the rich bar (metrics read every n steps), a
    file or a pipe plain lines (every every_s seconds, and at each validation and test)."""
    return ProgressBar(every_n_steps) if sys.stdout.isatty() else PlainProgress(every_s)


def none_without_a_bar(callbacks: list, trainer_config) -> dict:
    """Trainer arguments for callbacks without a progress bar (callbacks.progress_bar=null): Lightning's own bar
    is turned off, which it would otherwise put in its place (reading the metrics at every batch)."""
    if any(isinstance(c, LightningProgressBar) for c in callbacks) or "enable_progress_bar" in trainer_config:
        return {}
    return {"enable_progress_bar": False}


class ProgressBar(RichProgressBar):
    """Lightning's RichProgressBar reads the logged metrics after every batch, and each read turns device tensors
    into numbers: on a GPU the host waits for the device at every step. This one reads them every `every_n_steps`
    optimizer steps and whenever an epoch or a validation ends (their metrics are final then)."""

    def __init__(self, every_n_steps: int = 50, **kwargs):
        super().__init__(**kwargs)
        self.every_n_steps = every_n_steps
        self._shown: dict = {}
        self._read_at: int | None = None  # the global step of the last read; None: read at the next update

    def get_metrics(self, trainer, pl_module) -> dict:
        step = trainer.global_step
        if self._read_at is None or step - self._read_at >= self.every_n_steps:
            self._shown, self._read_at = self.read_metrics(trainer, pl_module), step
        return self._shown

    def read_metrics(self, trainer, pl_module) -> dict:
        """The metrics shown until the next read: the logged ones (a pack's bar shows its members')."""
        return super().get_metrics(trainer, pl_module)

    def on_train_epoch_end(self, trainer, pl_module):
        self._read_at = None
        super().on_train_epoch_end(trainer, pl_module)

    def on_validation_end(self, trainer, pl_module):
        self._read_at = None
        super().on_validation_end(trainer, pl_module)


class PlainProgress(LightningProgressBar):
    """Progress as plain log lines: the batch and the training metrics every `every_s` seconds, with the time left
    at this attempt's pace, and the metrics of every validation and of the test, each with the time since training
    started; `name` (a pack's id) starts each line."""

    def __init__(self, every_s: float = 30.0, name: str = ""):
        super().__init__()
        self.every_s, self.name, self._enabled = every_s, name, True
        self._started = self._said = time.monotonic()  # until training starts (a test in ranks forked after it)
        self._first_step = 0

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def _line(self, trainer, text: str) -> None:
        if self._enabled and trainer.is_global_zero and not trainer.sanity_checking:
            log.info("%s%s (%.0f s)", f"{self.name}: " if self.name else "", text, time.monotonic() - self._started)
            self._said = time.monotonic()

    def _metrics(self, trainer, pl_module, prefix: str) -> str:
        metrics = self.get_metrics(trainer, pl_module)
        return " ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k.startswith(prefix) and isinstance(v, float))

    def _left(self, trainer) -> str:
        """The time left to the last step, at the pace of this attempt's steps so far (validations included)."""
        done, total = trainer.global_step - self._first_step, trainer.estimated_stepping_batches
        if done <= 0 or not math.isfinite(total):
            return ""
        seconds = (time.monotonic() - self._started) * max(0, total - trainer.global_step) / done
        return f", about {seconds / 60:.0f} min left" if seconds >= 60 else f", about {max(1, round(seconds))} s left"

    def on_train_start(self, trainer, pl_module):
        self._started = self._said = time.monotonic()
        self._first_step = trainer.global_step  # a resumed run: its pace from here

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if time.monotonic() - self._said >= self.every_s:
            epoch = f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}"
            step = f"batch {batch_idx + 1}/{trainer.num_training_batches}"
            metrics = self._metrics(trainer, pl_module, "train/")
            self._line(trainer, f"{epoch} {step}{self._left(trainer)}" + (f": {metrics}" if metrics else ""))

    def on_validation_end(self, trainer, pl_module):
        epoch = f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}"
        self._line(trainer, f"{epoch} validated: {self._metrics(trainer, pl_module, 'val/')}".rstrip(": "))

    def on_test_end(self, trainer, pl_module):
        self._line(trainer, f"tested: {self._metrics(trainer, pl_module, 'test/')}".rstrip(": "))
