"""LightningDataModule for tasks generated on the fly: seeded splits, dynamic padding."""

import lightning.pytorch as pl
import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader

IGNORE = -100  # label of positions that are not scored (token tasks)


def collate(examples: list[tuple[np.ndarray, np.ndarray | int]]) -> dict[str, torch.Tensor]:
    """Pad to the longest sequence of the batch: tokens (B, n) or (B, n, c), padding_mask (B, n), labels."""
    toks = [torch.from_numpy(t) for t, _ in examples]
    tokens = pad_sequence(toks, batch_first=True, padding_value=0)
    lengths = torch.tensor([len(t) for t in toks])
    padding_mask = torch.arange(tokens.shape[1])[None, :] >= lengths[:, None]  # (B, n), True = padding
    labels = [y for _, y in examples]
    if isinstance(labels[0], np.ndarray):
        labels = pad_sequence([torch.from_numpy(y) for y in labels], batch_first=True, padding_value=IGNORE)
    else:
        labels = torch.tensor(labels)
    return {"tokens": tokens, "padding_mask": padding_mask, "labels": labels}


class TaskDataModule(pl.LightningDataModule):
    """Train / val / test splits of a generated task, each from its own stream of the run's seed."""

    def __init__(
        self, task, n_train: int, n_val: int, n_test: int, batch_size: int = 64, num_workers: int = 0, seed: int = 0
    ):
        super().__init__()
        self.task, self.batch_size, self.num_workers, self.seed = task, batch_size, num_workers, seed
        self.sizes = {"train": n_train, "val": n_val, "test": n_test}
        self.splits: dict[str, list] = {}

    @property
    def level(self) -> str:
        """'token' (a label per position) or 'sequence' (one label per example)."""
        return self.task.level

    @property
    def vocab_size(self) -> int:
        return self.task.vocab_size

    @property
    def n_classes(self) -> int:
        return self.task.n_classes

    @property
    def max_len(self) -> int:
        return self.task.max_len

    def setup(self, stage: str | None = None) -> None:
        for i, (split, n) in enumerate(self.sizes.items()):
            if split not in self.splits:
                self.splits[split] = self.task.sample(np.random.default_rng([self.seed, i]), n)

    def probe_batch(self, n: int, sentences: list[str] | None = None) -> dict[str, torch.Tensor]:
        """The same n validation examples every time (chosen with the seed), collated into one batch."""
        if sentences:
            raise ValueError("probe sentences need a text dataset; this task is generated from token ids")
        self.setup()
        val = self.splits["val"]
        chosen = np.random.default_rng([self.seed, len(self.sizes)]).permutation(len(val))[:n]
        return collate([val[i] for i in sorted(chosen)])

    def token_strings(self, ids: torch.Tensor) -> list[str]:
        """Readable tokens of one example: ids (n,) or (n, c); a fused position reads 'k3+v7'."""
        vocab = self.task.vocab()
        if ids.dim() == 1:
            return [vocab[i] for i in ids.tolist()]
        return ["+".join(vocab[i] for i in row if i) for row in ids.tolist()]

    def _loader(self, split: str, shuffle: bool = False) -> DataLoader:
        return DataLoader(
            self.splits[split],
            batch_size=self.batch_size,
            shuffle=shuffle,
            collate_fn=collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self):
        return self._loader("train", shuffle=True)

    def val_dataloader(self):
        return self._loader("val")

    def test_dataloader(self):
        return self._loader("test")
