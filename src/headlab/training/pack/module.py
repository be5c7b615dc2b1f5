"""A pack's LightningModule: E encoders of one architecture as one model (headlab.training.vectorized), each member
trained on the objective of its single run (headlab.training.objective) with its own AdamW settings.

Shapes: E members, B batch, n positions, c tokens summed per position, C classes.
"""

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

from headlab.training import objective, optim
from headlab.training.kept_predictions import KeptPredictions
from headlab.training.sharpness import SharpnessAware
from headlab.training.vectorized import PackedAdamW, Stacked, clip_per_member, member_norms


class PackedModule(SharpnessAware, pl.LightningModule):
    """E encoders of one architecture as one model: per-member losses, accuracies and AdamW hyperparameters.

    optim: one dict per member (lr, weight_decay, warmup, betas, sam_rho, rdrop), as the single run's HeadLabModule
    takes them; sam_rho and rdrop are the same for all (Stacked members' gradients are each scaled by their own norm).
    streams: each member's CPU random state where its single run starts training (Stacked); compile: model.compile;
    compute: pack.compute (Stacked).
    A member whose training loss turns non-finite is frozen (its learning rate 0) and left out of the loss.
    """

    def __init__(
        self,
        models: list,
        optim: list[dict],
        streams: list[torch.Tensor] | None = None,
        compile: bool = False,
        compute: str = "auto",
    ):
        super().__init__()
        self.stack = Stacked(models, streams, compile, compute)
        object.__setattr__(self, "members", models)  # the members' own Encoders, not submodules: no state of the pack
        self._log_hyperparams = False  # a run's loggers get its config from headlab (loggers.start), not Lightning
        self.optim = optim
        E = len(models)
        self.register_buffer("alive", torch.ones(E, dtype=torch.bool), persistent=False)
        self.register_buffer("diverged_at", torch.full((E,), -1, dtype=torch.long), persistent=False)
        self.register_buffer("diverged_in_loss", torch.zeros(E, dtype=torch.bool), persistent=False)
        self.sums: dict[str, dict[str, torch.Tensor]] = {}  # split -> epoch sums, each (E,)
        self.kept = KeptPredictions()  # each member's test predictions, for its results.json
        self.tested: dict[str, list[float]] = {}  # the test metrics of each member (on_test_epoch_end)

    @property
    def model(self) -> torch.nn.Module:
        """A pack of one's Encoder, as a single run's module holds it (pl_module.model, for a run's own callbacks):
        its parameters and their gradients are views of the pack's (1, P) row, so that what a callback reads is
        what trains, and what it changes in place changes the run."""
        if len(self.members) != 1:
            raise AttributeError(f"a pack of {len(self.members)} members has no one model (pack.stack holds them)")
        model = self.members[0]
        flat = self.stack.flat
        weights = self.stack.views(flat.detach())
        grads = self.stack.views(flat.grad) if flat.grad is not None else {}
        for name, parameter in model.named_parameters():
            parameter.data = weights[name][0]
            parameter.grad = grads[name][0] if grads else None
        for name, buffer in self.stack.stacked_buffers().items():
            model.get_buffer(name).data = buffer[0]
        return model

    def forward(self, batch: dict, need_balance: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """(E, B, C) or (E, B, n, C) logits; with need_balance, and each member's weighted load-balance loss (E,)
        (Encoder.forward). A batch is padded to the longest example of any member's batch; where members run one
        after another (Stacked.one_after_another), each runs on its own batch's positions, as its
        single run does (with length-bucketed text, members' batches differ in length: the padding would multiply
        the work)."""
        tokens, padding = batch["tokens"], batch["padding_mask"]  # (E, B, n[, c]), (E, B, n)
        wanted = {"need_balance": True} if need_balance else {}
        if not self.stack.one_after_another(tokens.device):
            return self.stack(tokens, padding, **wanted)
        n = tokens.shape[2]  # a pack of one's batch is cut to its own longest example already: no read of the
        # device (a GPU's sync at every step) for it
        lengths = (~padding).sum(-1).amax(-1).tolist() if len(tokens) > 1 else [n]  # (E,): each member's longest
        outputs = self.stack.each(
            [t[:, :k] for t, k in zip(tokens, lengths, strict=True)],
            [m[:, :k] for m, k in zip(padding, lengths, strict=True)],
            **wanted,
        )
        logits, balances = zip(*outputs, strict=True) if need_balance else (outputs, None)
        logits = torch.stack([F.pad(x, (0, 0, 0, n - x.shape[1])) if x.dim() == 3 else x for x in logits])
        return (logits, torch.stack(balances)) if need_balance else logits

    def _measure(self, batch: dict) -> dict[str, torch.Tensor]:
        """The epoch sums of an evaluation batch, each (E,) (objective.cross_entropy)."""
        return objective.cross_entropy(self(batch), batch["labels"])[1]

    def _training_step(self, batch: dict) -> objective.Step:
        """The members' objectives (E,), as a single run's (objective.training_step): with optim.rdrop (one for the
        pack) two passes, each member drawing its own dropout masks in each."""
        rdrop = self.optim[0].get("rdrop", 0.0)
        return objective.training_step(lambda: self(batch, need_balance=True), batch["labels"], rdrop)

    def _add(self, split: str, sums: dict) -> None:
        total = self.sums.setdefault(split, {})
        for k, v in sums.items():
            total[k] = total[k] + v if k in total else v

    def epoch_metrics(self, split: str) -> dict[str, torch.Tensor]:
        """{split}/loss and {split}/acc per member (E,) over the epoch so far, over every rank's share of it (DDP:
        called by every rank, inside the loop); the sums start again."""
        sums = self.sums.pop(split, {})
        if not sums:
            return {}
        if self._trainer is not None and self.trainer.world_size > 1:
            sums = {k: self.trainer.strategy.reduce(v, reduce_op="sum") for k, v in sums.items()}
        return {f"{split}/loss": sums["loss"] / sums["examples"], f"{split}/acc": sums["correct"] / sums["scored"]}

    def lr_scale(self, step: int) -> torch.Tensor:
        """The schedule's multiplier of each member's learning rate at a step (warm-up, then cosine decay)."""
        total, warmups = self.schedule
        return torch.tensor([optim.warmup_cosine(step, warmup, total) for warmup in warmups])

    def on_train_start(self):
        self.show_lr(self.optimizers().optimizer, self.global_step)  # its state restored (a resume) or not

    def on_train_batch_start(self, batch, batch_idx):
        self.optimizers().optimizer.scale = self.lr_scale(self.global_step).double()

    def show_lr(self, optimizer: PackedAdamW, step: int) -> None:
        """A pack of one's learning rate at a step where torch's optimizers show theirs, param_groups' "lr" (what
        LearningRateMonitor and a run's own callbacks read), as a single run's schedule leaves it after each step."""
        if len(self.optim) == 1:
            for group in optimizer.param_groups:
                group["lr"] = float(optimizer.lr[0] * self.lr_scale(step)[0])

    def on_train_batch_end(self, outputs, batch, batch_idx):
        """Every member frozen: training stops (read at the logging cadence: no host-device wait at every step)."""
        self.show_lr(self.optimizers().optimizer, self.global_step)
        if self.global_step % self.trainer.log_every_n_steps == 0 and not self.alive.any():
            self.trainer.should_stop = True

    def training_step(self, batch, batch_idx):
        if self.ascended:  # sharpness-aware minimisation's second pass: its losses are not the members'
            return torch.where(self.alive, self._training_step(batch).objective, 0).sum()
        step = self._training_step(batch)
        finite = torch.isfinite(step.objective)
        diverging = self.alive & ~finite
        self.diverged_at = torch.where(diverging, self.global_step, self.diverged_at)
        self.diverged_in_loss |= diverging & ~torch.isfinite(step.loss)
        self.alive &= finite
        self.optimizers().optimizer.alive = self.alive
        self._add("train", {k: torch.where(self.alive, v, 0) for k, v in step.sums.items()})
        self.last_losses = step.loss.detach()
        return torch.where(self.alive, step.objective, 0).sum()  # members' gradients never mix: each sees its own loss

    def validation_step(self, batch, batch_idx):
        self._add("val", self._measure(batch))

    def on_test_epoch_start(self):
        self.kept.start()

    def on_test_epoch_end(self):
        self.tested = {k: v.tolist() for k, v in self.epoch_metrics("test").items()}  # {metric: a value per member}

    def test_step(self, batch, batch_idx):
        logits = self(batch)
        self._add("test", objective.cross_entropy(logits, batch["labels"])[1])
        self.kept.add(logits, batch["labels"])

    def sam_rho(self) -> float:
        return self.optim[0].get("sam_rho", 0.0)  # one for the pack: packs never mix values (pack_key)

    def gradient_norms(self, grads: list[torch.Tensor]) -> torch.Tensor:
        return member_norms(grads)  # (E,)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        """trainer.gradient_clip_val clips each member's gradient norm on its own, as its single run would."""
        if gradient_clip_val:
            clip_per_member([self.stack.flat], float(gradient_clip_val))

    def configure_optimizers(self):
        total = self.trainer.estimated_stepping_batches  # once: Lightning computes it anew on every access
        self.schedule = (total, [optim.warmup_steps(o["warmup"], total) for o in self.optim])
        return self.optimizer(fused=None if optim.fused(self.trainer) else False)

    def optimizer(self, fused: bool | None = None) -> PackedAdamW:
        """The members' AdamW, each with its own settings (fused: PackedAdamW's, as optim.fused rules)."""
        groups = [{"params": [self.stack.flat], "decay": self.stack.decay_mask}]  # optim.decays, as in a single run
        return PackedAdamW(
            groups,
            lr=[o["lr"] for o in self.optim],
            weight_decay=[o["weight_decay"] for o in self.optim],
            betas=[list(o["betas"]) for o in self.optim],
            fused=fused,
        )
