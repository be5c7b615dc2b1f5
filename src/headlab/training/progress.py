"""The progress bar: Lightning's rich bar, without a host-device synchronisation at every batch."""

from lightning.pytorch.callbacks import RichProgressBar


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
            self._shown, self._read_at = super().get_metrics(trainer, pl_module), step
        return self._shown

    def on_train_epoch_end(self, trainer, pl_module):
        self._read_at = None
        super().on_train_epoch_end(trainer, pl_module)

    def on_validation_end(self, trainer, pl_module):
        self._read_at = None
        super().on_validation_end(trainer, pl_module)
