"""One job of a pack: its config, its run directory, and what its single run would build and write.

Shapes: E members.
"""

from dataclasses import dataclass, field
from pathlib import Path

import lightning.pytorch as pl
import torch
from omegaconf import DictConfig, OmegaConf

from headlab.training import cores, records
from headlab.training.build import build, instantiate_all
from headlab.training.callbacks import LearningCurve
from headlab.training.module import HeadLabModule


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
    checkpoint: dict | None = None  # the last.ckpt it continues from (resume.load)
    start_step: int = 0
    best: dict = field(default_factory=lambda: {"score": None, "path": None, "state": None})
    metrics: dict = field(default_factory=dict)
    wandb: dict | None = None
    stopped: tuple[int, int] | None = None  # (epochs, step) where its early stopping ended it (pack.stopping)
    ended: tuple[int, int] | None = None  # (epochs, step) where its ranks' own processes left the pack (pack.ranks)

    def callback(self, kind):
        return next((c for c in self.callbacks if isinstance(c, kind)), None)

    def position(self, trainer) -> tuple[int, int]:
        """(epochs trained, global step) where its training ended: where it stopped early, else where the pack is
        (in the ranks' own processes, where they were: pack.ranks)."""
        return self.stopped or self.ended or (trainer.current_epoch, trainer.global_step)


def build_member(member: Member) -> None:
    """The member's data and model exactly as its single run builds them: seeded, then built; a member that
        continues an earlier attempt (cfg.resume) reads its data back from its run directory (its last.ckpt:
    resume.load)."""
    resuming = bool(member.cfg.get("resume"))
    pl.seed_everything(member.cfg.seed, workers=True)
    member.datamodule, model = build(member.cfg, member.run_dir / "data" if resuming else None)
    if resuming:
        records.check_same_data(member.run_dir, member.datamodule)
    elif cores.process_rank() == 0:  # the other ranks of a run that re-runs its command write nothing
        member.datamodule.keep_in(member.run_dir)
    member.module = HeadLabModule(model, member.datamodule.n_classes, **OmegaConf.to_container(member.cfg.optim))
    member.callbacks = [*instantiate_all(member.cfg.get("callbacks"), "callbacks"), LearningCurve()]
    member.stream = torch.get_rng_state()  # what its single run's dropout goes on to draw from


def shape_key(member: Member) -> tuple:
    """What must be equal for members to share a vectorized model: every parameter's name and shape."""
    return tuple((n, tuple(p.shape)) for n, p in member.module.model.named_parameters())
