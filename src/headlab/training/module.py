"""LightningModule: one Encoder's training alone, on the objective of headlab.training.objective, with AdamW as
headlab.training.optim states it (and, with sam_rho > 0, sharpness-aware steps). headlab-eval tests a checkpoint with
it, and its hyperparameters are what a run's checkpoints record; runs train as packs (headlab.training.pack), which
the tests check against this module trained on Lightning's own loop (tests/lightning_reference.py)."""

from pathlib import Path

import lightning.pytorch as pl
import torch
from torchmetrics.classification import MulticlassAccuracy

from headlab.conventions import IGNORE_INDEX, SPLITS
from headlab.errors import TrainingError
from headlab.model import Encoder
from headlab.training import objective, optim
from headlab.training.kept_predictions import KeptPredictions
from headlab.training.sharpness import SharpnessAware


class HeadLabModule(SharpnessAware, pl.LightningModule):
    """Trains `model`; logs {train,val,test}/loss and /acc (accuracy over scored positions for token tasks)."""

    def __init__(
        self,
        model: Encoder,
        n_classes: int,
        lr: float = 3e-3,
        weight_decay: float = 0.01,
        warmup: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.98),
        sam_rho: float = 0.0,
        rdrop: float = 0.0,
    ):
        super().__init__()
        self.model = model
        self.save_hyperparameters(ignore=["model"], logger=False)  # the loggers get the whole config
        self.hparams["design"] = model.design  # in every checkpoint: a resume under another design is refused
        self._first_bad: torch.Tensor | None = None  # (first step with a non-finite objective or -1, its CE too)
        self.kept = KeptPredictions()  # the test predictions, for results.json
        self.acc = torch.nn.ModuleDict(
            {f"{s}_acc": MulticlassAccuracy(n_classes, average="micro", ignore_index=IGNORE_INDEX) for s in SPLITS}
        )

    def forward(self, batch: dict, **kwargs):
        return self.model(batch["tokens"], batch["padding_mask"], **kwargs)

    def _loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean cross-entropy over scored positions, and the logits (B, C) or (B, n, C)."""
        logits, _ = self(batch)
        loss, _ = objective.cross_entropy(logits[None], batch["labels"][None])  # a member axis of one
        return loss[0], logits

    def _training_loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(objective, cross-entropy, logits of the first pass) of a training batch (objective.training_step)."""

        def forward():  # a member axis of one
            logits, _, balance = self(batch, need_balance=True)
            return logits[None], balance[None]

        step = objective.training_step(forward, batch["labels"][None], self.hparams.rdrop)
        return step.objective[0], step.loss[0], step.logits[0]

    def _log(self, split: str, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        self.acc[f"{split}_acc"](logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        on_step = split == "train"
        self.log(
            f"{split}/loss",
            loss,
            on_step=on_step,
            on_epoch=True,
            prog_bar=True,
            sync_dist=not on_step,
            batch_size=labels.shape[0],
        )
        self.log(f"{split}/acc", self.acc[f"{split}_acc"], on_step=False, on_epoch=True, prog_bar=True)

    def on_fit_start(self):
        global_batch = (
            self.trainer.datamodule.batch_size * self.trainer.world_size * self.trainer.accumulate_grad_batches
        )
        self.global_batch_size = global_batch  # data.batch_size is per device

    def training_step(self, batch, batch_idx):
        if self.ascended:  # sharpness-aware minimisation's second pass: its loss is not the run's
            return self._training_loss(batch)[0]
        self.log("train/lr", self.lr_schedulers().get_last_lr()[0], on_step=True, on_epoch=False)
        self.log("data/global_batch_size", float(self.global_batch_size), on_step=False, on_epoch=True)
        objective, loss, logits = self._training_loss(batch)
        self._log("train", loss, logits, batch["labels"])
        self._watch_loss(objective, loss)
        return objective

    def _watch_loss(self, objective_: torch.Tensor, loss: torch.Tensor) -> None:
        """Stop on a non-finite training objective; checkpoints so far stay as they are. On a CPU every step is
        read. On a GPU reading it would make the host wait for the device at every step: the first bad step (and
        whether its cross-entropy was the non-finite part) is kept on the device and read every
        trainer.log_every_n_steps steps (when Lightning reads the logged metrics anyway) and before any validation,
        so no checkpoint ever holds weights it spoilt."""
        bad = ~torch.isfinite(objective_)
        now = torch.stack([torch.where(bad, self.global_step, -1), (bad & ~torch.isfinite(loss)).long()])  # (2,)
        self._first_bad = now if self._first_bad is None else torch.where(self._first_bad[0] >= 0, self._first_bad, now)
        if loss.device.type == "cpu" or (self.global_step + 1) % self.trainer.log_every_n_steps == 0:
            self._stop_if_diverged()

    def _stop_if_diverged(self) -> None:
        if self._first_bad is not None and int(self._first_bad[0]) >= 0:
            step, in_cross_entropy = self._first_bad.tolist()
            settings = {
                f"optim.{k}": v for k, v in self.hparams.items() if k in ("lr", "weight_decay", "rdrop", "sam_rho")
            }
            settings["trainer.gradient_clip_val"] = self.trainer.gradient_clip_val
            message = objective.non_finite_loss(step, self._last_checkpoint(), bool(in_cross_entropy), settings)
            raise TrainingError(message)

    def on_validation_start(self):
        self._stop_if_diverged()

    def _last_checkpoint(self) -> Path | None:
        for callback in self.trainer.checkpoint_callbacks:
            if callback.dirpath and (Path(callback.dirpath) / "last.ckpt").is_file():
                return Path(callback.dirpath) / "last.ckpt"
        return None

    def validation_step(self, batch, batch_idx):
        self._log("val", *self._loss(batch), batch["labels"])

    def on_test_epoch_start(self):
        self.kept.start()

    def test_step(self, batch, batch_idx):
        loss, logits = self._loss(batch)
        self._log("test", loss, logits, batch["labels"])
        self.kept.add(logits[None], batch["labels"][None])  # a member axis of one

    def sam_rho(self) -> float:
        return self.hparams.sam_rho

    def gradient_norms(self, grads: list[torch.Tensor]) -> torch.Tensor:
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))  # ()

    def configure_optimizers(self):
        groups = optim.parameter_groups(self, self.hparams.weight_decay)
        optimizer = optim.adamw(groups, self.hparams.lr, self.hparams.betas, optim.fused(self.trainer))
        total = self.trainer.estimated_stepping_batches
        warmup = optim.warmup_steps(self.hparams.warmup, total)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: optim.warmup_cosine(s, warmup, total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
