"""A pack's progress: as plain lines that start with its id (packs side by side share a console, where bars would
overwrite each other): where its training is and the time left, and its members' metrics as a mean and a range;
or, alone on a terminal, as the rich bar showing its members' metrics (a pack of one: its run's)."""

import torch

from headlab.training.pack.member import Member
from headlab.training.progress import PlainProgress, ProgressBar


class PackProgress(PlainProgress):
    def __init__(self, members: list[Member], every_s: float, name: str):
        super().__init__(every_s, name)
        self.members = members

    def _metrics(self, trainer, pl_module, prefix: str) -> str:
        values = member_values(self.members, pl_module, prefix)
        if not self.name:  # the one run of headlab-train: its numbers, as a run's
            return ", ".join(f"{k} {v[0]:.4f}" for k, v in values.items() if v)
        return ", ".join(_spread(k, v) for k, v in values.items() if v)


def _spread(key: str, values: list[float]) -> str:
    """val/acc 0.9512 (0.8000-1.0000 over 30): the mean and the range over the members."""
    t = torch.tensor(values, dtype=torch.float64)
    return f"{key} {t.mean():.4f} ({t.min():.4f}-{t.max():.4f} over {len(values)})"


class PackBar(ProgressBar):
    """The rich bar of a pack alone on a terminal: the last training loss and the latest validation's metrics,
    each member's where the pack is one run, else their mean over the members still training."""

    def __init__(self, members: list[Member], every_n_steps: int):
        super().__init__(every_n_steps)
        self.members = members

    def read_metrics(self, trainer, pl_module) -> dict:
        values = {**member_values(self.members, pl_module, "train/"), **member_values(self.members, pl_module, "val/")}
        return {k: sum(v) / len(v) for k, v in values.items() if v}


def member_values(members: list[Member], pl_module, prefix: str) -> dict[str, list[float]]:
    """{metric: a value per member still training} (a diverged or stopped one is frozen: its numbers would be stale):
    the last step's loss (prefix train/), the metrics of the latest validation (val/) as pack.writer set them, or of
    the test (test/: PackedModule.tested), which tests every member but the diverged ones."""
    alive = pl_module.alive.tolist()
    if prefix == "train/":
        losses = getattr(pl_module, "last_losses", None)
        return {"train/loss": [] if losses is None else [v for v, a in zip(losses.tolist(), alive, strict=True) if a]}
    living = [m for m, a in zip(members, alive, strict=True) if a]
    if prefix == "test/":
        tested = [m for m, d in zip(members, pl_module.diverged_at.tolist(), strict=True) if d < 0]
        return {k: [v[m.index] for m in tested] for k, v in sorted(pl_module.tested.items())}
    keys = sorted({k for m in living for k in m.metrics if k.startswith(prefix)})
    return {k: [m.metrics[k] for m in living if k in m.metrics] for k in keys}
