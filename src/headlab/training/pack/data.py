"""A pack's data: the members' splits side by side, batch i of every member stacked, each member's batches drawn in
the order its single run draws them.

Shapes: E members, B batch, n positions, c tokens summed per position.
"""

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch.utils.data import BatchSampler, Dataset, Sampler

from headlab.conventions import IGNORE_INDEX, PAD_ID
from headlab.data.datamodule import BucketBatchSampler, EpochLoader, SeededSampler, SplitLoaders, collate


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

    def __init__(self, datamodules: list, shuffle: bool = True):
        super().__init__()
        self.members = datamodules
        self.batch_size = datamodules[0].batch_size
        self.shuffle = shuffle  # False: training batches in their stored order (overfit_batches, debug_limits)
        self.splits = {}

    def _loader(self, split: str, shuffle: bool = False) -> EpochLoader:
        if split not in self.splits:
            self.splits[split] = PackSplit(self.members, split)
        data = self.splits[split]
        first = self.members[0]
        seeds = [dm.seed for dm in self.members] if shuffle and self.shuffle else None
        lengths = data.lengths.tolist() if seeds and first.bucketing else None
        sampler = PackSampler(len(data), self.batch_size, seeds, lengths)
        loader = EpochLoader(data, sampler=sampler, batch_size=None, num_workers=0)
        return self._follow(loader) if shuffle else loader


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
