"""Lightning callbacks."""

import time

import lightning.pytorch as pl


class ThroughputMeter(pl.Callback):
    """Real (non-padding) training tokens per second of training step (forward, backward, optimizer).

    The first step is left out: it pays one-off costs (allocations, lazy initialisation).
    """

    def __init__(self):
        self.tokens, self.seconds, self.steps, self._start = 0, 0.0, 0, 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps += 1
        if self.steps > 1:
            self.seconds += time.perf_counter() - self._start
            self.tokens += int((~batch["padding_mask"]).sum())

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.seconds else None
