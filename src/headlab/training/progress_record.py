"""progress.json: where a run stands while it trains, readable wherever its directory is (another terminal, a
cluster's login node; `headlab-status` reads it). The training process (rank 0) writes it when training starts,
at each validation, and every `every_s` seconds of training, validation and test batches; results.json says how
the run ended. Fields:

  updated_at     when it was written (UTC): a run whose file stops changing has stopped, whatever results.json says
  phase          training, validating, testing or tested (a pack's head analysis follows its test)
  step, steps    optimizer steps taken, and the steps the whole run takes (at most: early stopping may end it sooner)
  epoch, epochs  the epoch under way (from 1) and the last one
  attempt        {started_at, step}: this process's start, from which the pace (and the time left) is read
  val            the last validation's metrics ({epoch, step, tokens, val/acc, val/loss}: the curve's last point)
  val/acc_best   the best val/acc so far
  pack           a pack member's pack id; diverged: a member frozen at a non-finite loss (its numbers are stale)
"""

import logging
import math
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import lightning.pytorch as pl

from headlab.conventions import PROGRESS
from headlab.files import write_json_atomic
from headlab.record import VAL_ACC_BEST
from headlab.training.callbacks import LearningCurve

log = logging.getLogger("headlab")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class ProgressRecord(pl.Callback):
    """Writes progress.json into each run directory of `runs` ((directory, its LearningCurve) pairs: one run's, or
    every member's of a pack, whose `alive(pl_module)` says which members still train)."""

    def __init__(
        self,
        runs: list[tuple[Path, LearningCurve]],
        pack: str | None = None,
        alive: Callable[[pl.LightningModule], list[bool]] | None = None,
        every_s: float = 60.0,
    ):
        self.runs, self.pack, self.alive, self.every_s = runs, pack, alive, every_s
        self._attempt: dict | None = None  # set when training starts: nothing is written before
        self._steps: int | None = None
        self._written = 0.0
        self._failed = False

    def on_train_start(self, trainer, pl_module):
        self._attempt = {"started_at": now(), "step": trainer.global_step}
        steps = trainer.estimated_stepping_batches
        self._steps = int(steps) if math.isfinite(steps) else None
        self.write(trainer, pl_module, "training")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._beat(trainer, pl_module, "training")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._beat(trainer, pl_module, "validating")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._beat(trainer, pl_module, "testing")

    def on_validation_end(self, trainer, pl_module):
        if trainer.state.fn == "fit" and not trainer.sanity_checking:  # the curve has this validation's point now
            self.write(trainer, pl_module, "training")

    def on_train_end(self, trainer, pl_module):
        self.write(trainer, pl_module, "training")

    def on_test_end(self, trainer, pl_module):
        self.write(trainer, pl_module, "tested")  # a pack analyses its members' heads next

    def _beat(self, trainer, pl_module, phase: str) -> None:
        if time.monotonic() - self._written >= self.every_s and not trainer.sanity_checking:
            self.write(trainer, pl_module, phase)

    def write(self, trainer, pl_module, phase: str) -> None:
        self._written = time.monotonic()
        if not trainer.is_global_zero or self._attempt is None:
            return
        alive = self.alive(pl_module) if self.alive else [True] * len(self.runs)
        epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None
        shared = {
            "updated_at": now(),
            "phase": phase,
            "step": trainer.global_step,
            "steps": self._steps,
            "epoch": min(trainer.current_epoch + 1, epochs or math.inf),  # past the last once training ends
            "epochs": epochs,
            "attempt": self._attempt,
        }
        if self.pack:
            shared["pack"] = self.pack
        for (run_dir, curve), training in zip(self.runs, alive, strict=True):
            record = {**shared, "val": curve.points[-1] if curve.points else None}
            accuracies = [p["val/acc"] for p in curve.points if "val/acc" in p]
            record[VAL_ACC_BEST] = max(accuracies) if accuracies else None
            if not training:
                record["diverged"] = True
            try:
                write_json_atomic(run_dir / PROGRESS, record)
            except OSError as error:  # a progress report never stops training
                if not self._failed:
                    log.warning("could not write %s (%s); training goes on", run_dir / PROGRESS, error)
                self._failed = True
