"""A pack: many runs of one architecture (seeds, optimizer settings) trained as one vectorized model, one process.

Every member stays a run: it is built exactly as `headlab.training.run` builds a single run (same seed, same
data, same initialisation), trained by the same AdamW update and schedule with its own hyperparameters, and
writes what a single run writes into its own run directory (results.json fields, best and last checkpoints in
the single run's format, heads.json, its own loggers). One Lightning Trainer drives the pack. On a CPU each member
draws its dropout masks from its own random stream, the one its single run draws from; on a GPU (one batched
computation) the members draw theirs in one batched draw from the pack's stream.

Shapes: E members, B batch, n positions, C classes.
"""

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler

from headlab.analysis.figures import render_heads, render_importance
from headlab.conventions import IGNORE_INDEX, PAD_ID
from headlab.data.datamodule import BucketBatchSampler, SeededSampler, SplitLoaders, collate
from headlab.errors import TrainingError
from headlab.model import count_parameters
from headlab.training import loggers as loggers_
from headlab.training import pack_analysis
from headlab.training.callbacks import AttentionLogger, ExactResume, LearningCurve, ThroughputMeter
from headlab.training.module import HeadLabModule, non_finite_loss, warmup_cosine
from headlab.training.rdrop import disagreement
from headlab.training.results import save_checkpoint_atomic
from headlab.training.run import (
    TRAIN_METRICS,
    build,
    configure_torch,
    instantiate_all,
    instantiate_node,
    model_fields,
)
from headlab.training.sharpness import SharpnessAware
from headlab.training.sweep import usable_cores
from headlab.training.vectorized import PackedAdamW, Stacked, clip_per_member, member_norms

log = logging.getLogger("headlab")
SPLITS = ("train", "val", "test")


class PackSampler(Sampler[torch.Tensor]):
    """Batch i of every member at once, an (E, B) index tensor: row e is what member e's own loader draws (its
    seeded shuffle or bucketing when shuffled, consecutive batches otherwise)."""

    def __init__(self, n: int, batch_size: int, seeds: list[int] | None, lengths: list | None = None):
        self.n, self.batch_size = n, batch_size
        if seeds is None:
            self.members = None
        elif lengths is not None:
            self.members = [BucketBatchSampler(lengths[e], batch_size, seed) for e, seed in enumerate(seeds)]
        else:
            self.members = [BatchSampler(SeededSampler(n, seed), batch_size, drop_last=False) for seed in seeds]

    def set_epoch(self, epoch: int) -> None:
        for batches in self.members or []:
            batches.sampler.set_epoch(epoch)

    def __iter__(self):
        if self.members is None:
            for start in range(0, self.n, self.batch_size):
                yield torch.arange(start, min(self.n, start + self.batch_size))[None, :]  # (1, B): the same for all
            return
        for batches in zip(*self.members, strict=True):
            yield torch.tensor(batches)

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)


class PackSplit(Dataset):
    """A split of every member as padded tensors, (E, N, n_max[, c]) tokens, (E, N) lengths, labels: a batch is one
    gather, cut to its longest example (padded positions are masked, so the values are those of the member's own
    batch)."""

    def __init__(self, datamodules: list, split: str):
        padded = [collate(dm.splits[split]) for dm in datamodules]  # each split padded to its longest example
        n_max = max(p["tokens"].shape[1] for p in padded)
        self.tensors = stack_batches(padded, n_max)
        self.lengths = (~self.tensors["padding_mask"]).sum(-1)  # (E, N)

    def __len__(self) -> int:
        return self.lengths.shape[1]

    def __getitem__(self, index: torch.Tensor) -> dict:  # index (E, B), or (1, B) for every member alike
        rows = torch.arange(self.lengths.shape[0])[:, None]  # (E, 1)
        index = index.expand(len(rows), -1)
        n = int(self.lengths[rows, index].max())
        return {
            k: (v[rows, index, :n] if k != "labels" or v.dim() > 2 else v[rows, index]) for k, v in self.tensors.items()
        }


def stack_batches(batches: list[dict], n: int) -> dict:
    """Batches of the same size, one per member -> (E, B, n[, c]) tokens and padding masks, (E, B[, n]) labels,
    padded to n positions (the padding id, True, and the ignore index)."""

    def pad(t: torch.Tensor, value) -> torch.Tensor:
        widths = [0, 0] * (t.dim() - 2) + [0, n - t.shape[1]]  # the position axis is dim 1
        return F.pad(t, widths, value=value) if n > t.shape[1] else t

    return {
        "tokens": torch.stack([pad(b["tokens"], PAD_ID) for b in batches]),
        "padding_mask": torch.stack([pad(b["padding_mask"], True) for b in batches]),
        "labels": torch.stack(
            [pad(b["labels"], IGNORE_INDEX) if b["labels"].dim() > 1 else b["labels"] for b in batches]
        ),
    }


class PackedData(SplitLoaders, pl.LightningDataModule):
    """The members' data side by side: batch i of a split is batch i of every member, stacked, drawn in the
    order each member's single run would draw it."""

    def __init__(self, datamodules: list):
        super().__init__()
        self.members = datamodules
        self.batch_size = datamodules[0].batch_size
        self.splits = {}

    def _loader(self, split: str, shuffle: bool = False) -> DataLoader:
        if split not in self.splits:
            self.splits[split] = PackSplit(self.members, split)
        data = self.splits[split]
        first = self.members[0]
        seeds = [dm.seed for dm in self.members] if shuffle else None
        lengths = data.lengths.tolist() if shuffle and first.bucketing else None
        sampler = PackSampler(len(data), self.batch_size, seeds, lengths)
        return DataLoader(data, sampler=sampler, batch_size=None, num_workers=0)


class PackedModule(SharpnessAware, pl.LightningModule):
    """E encoders of one architecture as one model: per-member losses, accuracies and AdamW hyperparameters.

    optim: one dict per member (lr, weight_decay, warmup, betas, sam_rho, rdrop), as the single run's HeadLabModule
    takes them; sam_rho and rdrop are the same for all (Stacked members' gradients are each scaled by their own norm).
    streams: each member's CPU random state where its single run starts training (Stacked).
    A member whose training loss turns non-finite is frozen (its learning rate 0) and left out of the loss.
    """

    def __init__(self, models: list, optim: list[dict], streams: list[torch.Tensor] | None = None):
        super().__init__()
        self.stack = Stacked(models, streams)
        self.optim = optim
        E = len(models)
        self.register_buffer("alive", torch.ones(E, dtype=torch.bool), persistent=False)
        self.register_buffer("diverged_at", torch.full((E,), -1, dtype=torch.long), persistent=False)
        self.sums: dict[str, dict[str, torch.Tensor]] = {}  # split -> epoch sums, each (E,)

    def forward(self, batch: dict) -> torch.Tensor:
        """(E, B, C) or (E, B, n, C) logits. A batch is padded to the longest example of any member's batch; on the
        CPU, where members run one after another, each runs on its own batch's positions, as its single run does
        (with length-bucketed text, members' batches differ in length: the padding would multiply the work)."""
        tokens, padding = batch["tokens"], batch["padding_mask"]  # (E, B, n[, c]), (E, B, n)
        if tokens.device.type != "cpu":
            return self.stack(tokens, padding)
        n = tokens.shape[2]
        lengths = (~padding).sum(-1).amax(-1).tolist()  # (E,): each member's longest example
        logits = self.stack.each(
            [t[:, :k] for t, k in zip(tokens, lengths, strict=True)],
            [m[:, :k] for m, k in zip(padding, lengths, strict=True)],
        )
        return torch.stack([F.pad(x, (0, 0, 0, n - x.shape[1])) if x.dim() == 3 else x for x in logits])

    def _measure(self, batch: dict) -> tuple[torch.Tensor, dict, torch.Tensor]:
        """Per-member mean loss (E,) as F.cross_entropy gives a single run, the epoch sums it adds to, and the
        logits (E, N, C) over the N = B or B n positions."""
        logits = self(batch)
        E, C = logits.shape[0], logits.shape[-1]
        labels = batch["labels"].reshape(E, -1)  # (E, N)
        logits = logits.reshape(E, -1, C)  # (E, N, C)
        token_losses = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=IGNORE_INDEX, reduction="none")
        scored = labels != IGNORE_INDEX  # (E, N)
        losses = token_losses.sum(1) / scored.sum(1).clamp(min=1)  # (E,)
        B = batch["labels"].shape[1]
        sums = {
            "loss": losses.detach() * B,  # weighted by batch size, as Lightning averages a logged epoch value
            "examples": torch.full_like(losses, B).detach(),
            "correct": ((logits.argmax(-1) == labels) & scored).sum(1).float(),
            "scored": scored.sum(1).float(),
        }
        return losses, sums, logits

    def _training_losses(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Per-member (objective, cross-entropy), each (E,), and the first pass's epoch sums, as HeadLabModule's
        _training_loss: with optim.rdrop (one for the pack) two passes, each member's own dropout masks in each."""
        losses, sums, logits = self._measure(batch)
        rdrop = self.optim[0].get("rdrop", 0.0)
        if not rdrop:
            return losses, losses, sums
        second, _, other = self._measure(batch)
        scored = batch["labels"].reshape(logits.shape[:2]) != IGNORE_INDEX  # (E, N)
        losses = (losses + second) / 2
        sums["loss"] = losses.detach() * sums["examples"]
        return losses + rdrop * disagreement(logits, other, scored), losses, sums

    def _add(self, split: str, sums: dict) -> None:
        total = self.sums.setdefault(split, {})
        for k, v in sums.items():
            total[k] = total[k] + v if k in total else v

    def epoch_metrics(self, split: str) -> dict[str, torch.Tensor]:
        """{split}/loss and {split}/acc per member (E,) over the epoch so far; the sums start again."""
        sums = self.sums.pop(split, {})
        if not sums:
            return {}
        return {f"{split}/loss": sums["loss"] / sums["examples"], f"{split}/acc": sums["correct"] / sums["scored"]}

    def lr_scale(self, step: int) -> torch.Tensor:
        """The schedule's multiplier of each member's learning rate at a step (warm-up, then cosine decay)."""
        total, warmups = self.schedule
        return torch.tensor([warmup_cosine(step, warmup, total) for warmup in warmups])

    def on_train_batch_start(self, batch, batch_idx):
        self.optimizers().optimizer.scale = self.lr_scale(self.global_step).double()

    def training_step(self, batch, batch_idx):
        if self.ascended:  # sharpness-aware minimisation's second pass: its losses are not the members'
            return torch.where(self.alive, self._training_losses(batch)[0], 0).sum()
        objectives, losses, sums = self._training_losses(batch)
        finite = torch.isfinite(objectives)
        self.diverged_at = torch.where(self.alive & ~finite, self.global_step, self.diverged_at)
        self.alive &= finite
        self.optimizers().optimizer.alive = self.alive
        self._add("train", {k: torch.where(self.alive, v, 0) for k, v in sums.items()})
        self.last_losses = losses.detach()
        return torch.where(self.alive, objectives, 0).sum()  # members' gradients never mix: each sees its own loss

    def validation_step(self, batch, batch_idx):
        self._add("val", self._measure(batch)[1])

    def test_step(self, batch, batch_idx):
        self._add("test", self._measure(batch)[1])

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
        self.schedule = (total, [max(1, int(o["warmup"] * total)) for o in self.optim])
        groups = [{"params": [self.stack.flat], "decay": self.stack.decay_mask}]  # matrices decay, as in a single run
        return PackedAdamW(
            groups,
            lr=[o["lr"] for o in self.optim],
            weight_decay=[o["weight_decay"] for o in self.optim],
            betas=[list(o["betas"]) for o in self.optim],
        )


@dataclass
class Member:
    """One job of the pack: its config (resolved), run directory, and what its run writes."""

    cfg: DictConfig
    run_dir: Path
    flat_config: dict
    index: int = 0
    loggers: list = field(default_factory=list)
    callbacks: list = field(default_factory=list)
    module: HeadLabModule | None = None
    datamodule: object = None
    stream: torch.Tensor | None = None  # the CPU random state its single run starts training from
    best: dict = field(default_factory=lambda: {"score": None, "path": None, "state": None})
    metrics: dict = field(default_factory=dict)
    wandb: dict | None = None

    def callback(self, kind):
        return next((c for c in self.callbacks if isinstance(c, kind)), None)


class MemberOutputs(pl.Callback):
    """Writes what each member's single run would: its metrics to its own loggers, best and last checkpoints in
    the single run's format (loadable by resume= and headlab-heads), attention logging, and on an interrupt its
    last checkpoint where training stopped."""

    def __init__(self, members: list[Member], pack_id: str, meter: ThroughputMeter):
        self.members, self.pack_id, self.meter = members, pack_id, meter
        self._pool = None

    def _alive(self, pl_module) -> list[bool]:
        return pl_module.alive.tolist()

    def on_train_epoch_end(self, trainer, pl_module):
        metrics = {k: v.tolist() for k, v in pl_module.epoch_metrics("train").items()}
        metrics["train/loss_epoch"] = metrics.pop("train/loss")  # logged on step and epoch, as Lightning names it
        rate = self.meter.rate
        for member, alive in zip(self.members, self._alive(pl_module), strict=True):
            if alive:
                values = {k: v[member.index] for k, v in metrics.items()}
                member.metrics.update({k: v for k, v in values.items() if k in TRAIN_METRICS})
                if rate:
                    values["perf/train_tokens_per_s"] = rate / len(self.members)  # this member's share
                for logger in member.loggers:
                    logger.log_metrics({**values, "epoch": trainer.current_epoch}, step=trainer.global_step - 1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step % trainer.log_every_n_steps or not any(m.loggers for m in self.members):
            return
        losses = pl_module.last_losses.tolist()
        lrs = (pl_module.optimizers().optimizer.lr * pl_module.optimizers().optimizer.scale).tolist()
        for member in self.members:
            for logger in member.loggers:
                values = {"train/loss_step": losses[member.index], "train/lr": lrs[member.index]}
                logger.log_metrics(values, step=trainer.global_step - 1)

    def on_validation_epoch_end(self, trainer, pl_module):
        metrics = {k: v.tolist() for k, v in pl_module.epoch_metrics("val").items()}
        if trainer.sanity_checking:
            return
        snapshots = []
        for member, alive in zip(self.members, self._alive(pl_module), strict=True):
            if not alive:
                continue
            values = {k: v[member.index] for k, v in metrics.items()}
            member.metrics.update(values)
            member.callback(LearningCurve).add(trainer.current_epoch, trainer.global_step, values)
            for logger in member.loggers:
                logger.log_metrics({**values, "epoch": trainer.current_epoch}, step=trainer.global_step - 1)
            attention = member.callback(AttentionLogger)
            if attention and attention.is_due(trainer.current_epoch, trainer.max_epochs):
                model = self.member_model(member, pl_module)
                step, device = trainer.global_step, pl_module.device
                snapshot = attention.log_heads(model, member.datamodule, member.loggers, step, device, media=False)
                if snapshot is not None:
                    snapshots.append((member, snapshot))
        if snapshots:  # matplotlib is most of the logging: the members' figures are drawn in parallel
            started = time.perf_counter()
            for (member, snapshot), pngs in zip(
                snapshots, self.render_pool().map(render_heads, [s for _, s in snapshots]), strict=True
            ):
                AttentionLogger.log_media(member.loggers, snapshot, pngs)
            log.info(
                "pack %s: figures of %d members in %.1f s", self.pack_id, len(snapshots), time.perf_counter() - started
            )

    def render_pool(self):
        """Worker processes for figures, started once per pack (forkserver: clean children, matplotlib preloaded)."""
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["headlab.analysis.figures"])
            workers = max(1, min(len(self.members), usable_cores() - 1))
            self._pool = ProcessPoolExecutor(workers, mp_context=context)
        return self._pool

    def render_importance(self, jobs: list[tuple[Member, dict]]) -> None:
        """The members' importance figures (AttentionLogger.publish's jobs), rendered in parallel, then logged."""
        if not jobs:
            return
        started = time.perf_counter()
        rendered = [self.render_pool().submit(render_importance, **job["figures"]) for _, job in jobs]
        for (member, job), pngs in zip(jobs, rendered, strict=True):
            AttentionLogger.log_importance_media(member.loggers, job, pngs.result())
        log.info(
            "pack %s: importance figures of %d members in %.1f s",
            self.pack_id,
            len(jobs),
            time.perf_counter() - started,
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        pack_checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        for member, alive in zip(self.members, self._alive(pl_module), strict=True):
            if alive:
                self.save(member, pl_module, trainer, pack_checkpoint)
            for logger in member.loggers:
                logger.save()

    def on_exception(self, trainer, pl_module, exception):
        if isinstance(exception, KeyboardInterrupt | SystemExit):  # Ctrl-C, SIGTERM: last.ckpt where it stopped
            pack_checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            for member, alive in zip(self.members, self._alive(pl_module), strict=True):
                if alive:
                    self.save(member, pl_module, trainer, pack_checkpoint, best=False)

    @staticmethod
    def member_model(member: Member, pl_module: PackedModule):
        """The member's own Encoder holding its current weights (from the stack)."""
        model = member.module.model
        model.load_state_dict(pl_module.stack.member_state(member.index))
        return model.to(pl_module.device)

    def save(self, member: Member, pl_module, trainer, pack_checkpoint: dict, best: bool = True) -> None:
        """checkpoints/last.ckpt, and best-epoch{E}-step{S}.ckpt when val/acc improved (the previous best goes)."""
        state = pl_module.stack.member_state(member.index)
        directory = member.run_dir / "checkpoints"
        score = member.metrics.get("val/acc")
        improved = best and score is not None and (member.best["score"] is None or score > member.best["score"])
        if improved:
            old = member.best["path"]
            path = directory / f"best-epoch{trainer.current_epoch}-step{trainer.global_step}.ckpt"
            member.best = {"score": score, "path": path, "state": {k: v.cpu() for k, v in state.items()}}
        self._update_checkpoint_callbacks(member, directory)
        checkpoint = member_checkpoint(member, pl_module, pack_checkpoint, state)
        if improved:
            save_checkpoint_atomic(checkpoint, member.best["path"])
            if old is not None and old != member.best["path"]:
                old.unlink(missing_ok=True)
        save_checkpoint_atomic(checkpoint, directory / "last.ckpt")

    @staticmethod
    def _update_checkpoint_callbacks(member: Member, directory: Path) -> None:
        """Set the member's ModelCheckpoint callbacks as if they had saved these files: their state goes into the
        checkpoint, so that a resumed single run keeps tracking its best."""
        from lightning.pytorch.callbacks import ModelCheckpoint

        for callback in member.callbacks:
            if not isinstance(callback, ModelCheckpoint):
                continue
            callback.dirpath = str(directory)
            if callback.monitor is None:
                callback.best_model_path = callback.last_model_path = str(directory / "last.ckpt")
            elif member.best["path"] is not None:
                score = torch.tensor(member.best["score"])
                callback.best_model_path = callback.kth_best_model_path = str(member.best["path"])
                callback.best_model_score = callback.kth_value = score
                callback.best_k_models = {str(member.best["path"]): score}
                callback.current_score = torch.tensor(member.metrics["val/acc"])


def member_checkpoint(member: Member, pl_module: PackedModule, pack_checkpoint: dict, state: dict) -> dict:
    """The checkpoint the member's single run would have written at this point: the pack's loop state, the
    member's weights, its AdamW state and learning-rate schedule, its callbacks' state."""
    e, step = member.index, pack_checkpoint["global_step"]
    skip = ("state_dict", "optimizer_states", "lr_schedulers", "callbacks", "hyper_parameters", "hparams_name")
    checkpoint = {k: v for k, v in pack_checkpoint.items() if k not in skip}
    if "random_state" in checkpoint and pl_module.stack.streams is not None:  # its own stream, where it is now
        checkpoint["random_state"] = {**checkpoint["random_state"], "torch": pl_module.stack.streams[e].clone()}
    checkpoint["state_dict"] = {f"model.{name}": tensor.cpu() for name, tensor in state.items()}
    checkpoint["hyper_parameters"] = dict(member.module.hparams)
    module = member.module
    optimizer = torch.optim.AdamW(module.parameter_groups(), lr=module.hparams.lr, betas=tuple(module.hparams.betas))
    scale = float(pl_module.lr_scale(step)[e])
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: scale)
    solo = optimizer.state_dict()
    moments = pl_module.optimizers().optimizer.state.get(pl_module.stack.flat)
    if moments:
        exp_avg, exp_avg_sq = (pl_module.stack.member_state(e, moments[k]) for k in ("exp_avg", "exp_avg_sq"))
        order = [n for n, p in module.model.named_parameters() if p.dim() >= 2]
        order += [n for n, p in module.model.named_parameters() if p.dim() < 2]
        for i, name in enumerate(order):
            solo["state"][i] = {
                "step": torch.tensor(float(moments["step"])),
                "exp_avg": exp_avg[name].cpu(),
                "exp_avg_sq": exp_avg_sq[name].cpu(),
            }
    schedule_state = schedule.state_dict()
    schedule_state.update(last_epoch=step, _step_count=step + 1)
    checkpoint["optimizer_states"] = [solo]
    checkpoint["lr_schedulers"] = [schedule_state]
    checkpoint["callbacks"] = {c.state_key: c.state_dict() for c in member.callbacks if c.state_dict()}
    return checkpoint


def measure_heads(module: PackedModule, members: list[Member]) -> list[dict | None]:
    """Each member's head importance and pruning curves (AttentionLogger.measure), measured for all members at
    once where their analysis batches stack (pack_analysis), else one member after another; None where its run
    measures no importance."""
    analysts = [m.callback(AttentionLogger) for m in members]
    if not all(a and a.importance for a in analysts):
        return [None] * len(members)
    device = module.device
    batches = [a.analysis_batches(m.datamodule, device) for a, m in zip(analysts, members, strict=True)]
    stacked = [stack_split([b[i] for b in batches]) for i in (0, 1)]
    if None in stacked:
        return [
            a.measure(MemberOutputs.member_model(m, module), m.datamodule, device)
            for a, m in zip(analysts, members, strict=True)
        ]
    return pack_analysis.measure_members(module.stack, analysts, batches, stacked)


def stack_split(per_member: list[list[dict]]) -> list[dict] | None:
    """Members' batches of a split stacked, batch i of every member as one (E, B, ...) batch; None when the
    members have different numbers of batches or batch sizes."""
    if len({len(batches) for batches in per_member}) != 1:
        return None
    out = []
    for batches in zip(*per_member, strict=True):
        if len({len(b["labels"]) for b in batches}) != 1:
            return None
        out.append(stack_batches(list(batches), max(b["padding_mask"].shape[1] for b in batches)))
    return out


def pack_fields(member: Member, rate: float | None, trainer, fit_seconds: float, size: int, pack_id: str) -> dict:
    """The results.json fields a member's single run would own, plus where it was packed (rate: the pack's
    training tokens/s)."""
    return {
        "metrics": dict(member.metrics),
        **model_fields(member.module.model, member.datamodule),
        "throughput": {
            "train_tokens_per_s": rate / size if rate else None,  # the member's share of the pack's rate
            "pack_train_tokens_per_s": rate,
            "fit_s": round(fit_seconds, 3),
        },
        "resources": {"threads": torch.get_num_threads(), "devices": 1, "accelerator": member.cfg.trainer.accelerator},
        "checkpoints": {
            "best": str(member.best["path"]) if member.best["path"] else None,
            "last": str(member.run_dir / "checkpoints" / "last.ckpt"),
        },
        "epochs": trainer.current_epoch,
        "global_step": trainer.global_step,
        "pack": {"id": pack_id, "size": size, "index": member.index},
        "curve": member.callback(LearningCurve).points,
    }


def member_config(member: Member, pack_id: str, size: int) -> dict:
    """What the member's loggers get as its config: its single run's, and the pack it trained in."""
    facts = loggers_.run_facts(model_fields(member.module.model, member.datamodule), member.flat_config)
    return {**member.flat_config, **facts, "pack.id": pack_id, "pack.size": size}


def build_member(member: Member) -> None:
    """The member's data and model exactly as its single run builds them: seeded, then built."""
    pl.seed_everything(member.cfg.seed, workers=True)
    member.datamodule, model = build(member.cfg)
    member.module = HeadLabModule(model, member.datamodule.n_classes, **OmegaConf.to_container(member.cfg.optim))
    member.callbacks = [*instantiate_all(member.cfg.get("callbacks"), "callbacks"), LearningCurve()]
    member.stream = torch.get_rng_state()  # what its single run's dropout goes on to draw from


def shape_key(member: Member) -> tuple:
    """What must be equal for members to share a vectorized model: every parameter's name and shape."""
    return tuple((n, tuple(p.shape)) for n, p in member.module.model.named_parameters())


def members_that_fit(members: list[Member]) -> int:
    """How many members of this architecture fit in the memory of the device they train on, by an estimate:
    20 bytes a parameter (weights, gradients, AdamW's two moments and scratch tensor; 24 with optim.sam_rho, whose
    ascent is kept through the second pass) and, per layer and position
    of a batch, about 20 fp32 tensors as wide as d_model plus three rows of attention weights per head (twice that
    with optim.rdrop, whose two passes are kept for one backward); 70% of what is free."""
    model, data = members[0].module.model, members[0].datamodule
    n, attn = data.max_len + model.attention_offset, model.blocks[0].attn
    activations = 4 * data.batch_size * model.n_layers * n * (20 * model.head.in_features + 3 * attn.n_heads * n)
    activations *= 2 if members[0].cfg.optim.get("rdrop") else 1
    per_param = 24 if members[0].cfg.optim.get("sam_rho") else 20
    per_member = per_param * count_parameters(model)["total"] + activations
    if members[0].cfg.trainer.accelerator in ("gpu", "cuda") and torch.cuda.is_available():
        free = torch.cuda.mem_get_info()[0]
    else:
        import os

        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return max(1, int(0.7 * free // per_member))


def train_pack(members: list[Member], pack_id: str, progress: bool = True) -> list[dict | BaseException]:
    """Train built members (build_member) of one shape as one model; return each member's results.json fields,
    or the error that ended it. progress=False: no progress bar (packs trained side by side share a console)."""
    configure_torch(members[0].cfg, torch.get_num_threads())
    for index, member in enumerate(members):
        member.index = index
    size = len(members)
    pl.seed_everything(members[0].cfg.seed, workers=True)
    module = PackedModule(
        [m.module.model for m in members], [m.module.hparams for m in members], [m.stream for m in members]
    )
    for member in members:
        member.loggers = instantiate_all(member.cfg.get("logger"), "logger")
    with ThreadPoolExecutor(8) as pool:  # W&B runs start in about 0.3 s each, mostly waiting on its service
        configs = [member_config(m, pack_id, size) for m in members]
        starts = [pool.submit(loggers_.start, m.loggers, c) for m, c in zip(members, configs, strict=True)]
        for started in starts:
            started.result()
    meter = ThroughputMeter()
    outputs = MemberOutputs(members, pack_id, meter)
    bars = [c for c in members[0].callbacks if isinstance(c, pl.callbacks.ProgressBar)] if progress else []
    trainer = instantiate_node(
        members[0].cfg.trainer,
        "trainer",
        callbacks=[meter, outputs, ExactResume(), *bars],
        logger=False,
        enable_checkpointing=False,
        **({} if progress else {"enable_progress_bar": False}),
    )
    failed = True
    try:
        started = time.perf_counter()
        trainer.fit(module, datamodule=PackedData([m.datamodule for m in members]))
        fit_seconds = time.perf_counter() - started
        for member in members:  # test each member's best checkpoint, as its single run does
            if member.best["state"] is not None:
                module.stack.load_member(member.index, member.best["state"])
        results = []
        if all(m.datamodule.splits.get("test") for m in members):
            trainer.test(module, datamodule=PackedData([m.datamodule for m in members]), verbose=False)
            test = {k: v.tolist() for k, v in module.epoch_metrics("test").items()}
        else:
            test = {}
        diverged = module.diverged_at.tolist()
        measured, jobs = measure_heads(module, members), []
        for member in members:
            if diverged[member.index] >= 0:
                last = member.run_dir / "checkpoints" / "last.ckpt"
                message = non_finite_loss(diverged[member.index], last if last.is_file() else None)
                results.append(TrainingError(f"{message} (the other members of its pack went on)"))
                continue
            if member.best["score"] is not None:
                member.metrics["val/acc_best"] = member.best["score"]
            member.metrics.update({k: v[member.index] for k, v in test.items()})
            for logger in member.loggers:
                logger.log_metrics({k: v[member.index] for k, v in test.items()}, step=trainer.global_step)
            attention = member.callback(AttentionLogger)
            if attention:  # on the weights its test evaluated, as a single run's
                model = outputs.member_model(member, module)
                checkpoint = member.best["path"] if member.best["state"] is not None else None
                job = attention.publish(
                    model, member.datamodule, member.loggers, module.device, trainer.global_step, checkpoint,
                    measured[member.index], media=False,
                )  # fmt: skip
                if job:
                    jobs.append((member, job))
            results.append(pack_fields(member, meter.rate, trainer, fit_seconds, size, pack_id))
        outputs.render_importance(jobs)
        failed = False
    finally:
        outputs.close()
        with ThreadPoolExecutor(8) as pool:  # W&B runs finish while they flush: in parallel
            identities = list(
                pool.map(
                    lambda m: loggers_.finish(m.loggers, failed, m.metrics, configs[m.index], trainer.global_step),
                    members,
                )
            )
        for member, identity in zip(members, identities, strict=True):
            member.wandb = identity
    for member, result in zip(members, results, strict=True):
        if isinstance(result, dict):
            result["wandb"] = member.wandb
    return results
