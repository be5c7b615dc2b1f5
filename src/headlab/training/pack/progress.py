"""A pack's progress as plain lines that start with its id (packs side by side share a console, where bars would
overwrite each other): where its training is and the time left, and its members' metrics as a mean and a range."""

import torch

from headlab.training.pack.member import Member
from headlab.training.progress import PlainProgress


class PackProgress(PlainProgress):
    def __init__(self, members: list[Member], every_s: float, name: str):
        super().__init__(every_s, name)
        self.members = members

    def _metrics(self, trainer, pl_module, prefix: str) -> str:
        """Over the members still training (a diverged one is frozen: its numbers would be stale)."""
        alive = pl_module.alive.tolist()
        if prefix == "train/":  # the last step's loss of each member
            losses = getattr(pl_module, "last_losses", None)
            losses = [] if losses is None else [v for v, a in zip(losses.tolist(), alive, strict=True) if a]
            values = {"train/loss": losses}
        else:  # each member's metrics of this validation (pack.writer has set them)
            members = [m for m, a in zip(self.members, alive, strict=True) if a]
            keys = sorted({k for m in members for k in m.metrics if k.startswith(prefix)})
            values = {k: [m.metrics[k] for m in members if k in m.metrics] for k in keys}
        if not self.name:  # the one run of headlab-train: its numbers, as a run's
            return ", ".join(f"{k} {v[0]:.4f}" for k, v in values.items() if v)
        return ", ".join(_spread(k, v) for k, v in values.items() if v)


def _spread(key: str, values: list[float]) -> str:
    """val/acc 0.9512 (0.8000-1.0000 over 30): the mean and the range over the members."""
    t = torch.tensor(values, dtype=torch.float64)
    return f"{key} {t.mean():.4f} ({t.min():.4f}-{t.max():.4f} over {len(values)})"
