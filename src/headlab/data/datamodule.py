"""LightningDataModules: the shared batching of examples, and tasks generated on the fly."""

import hashlib
import logging
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Sampler

from headlab.conventions import IGNORE_INDEX, PAD_ID, SPLITS
from headlab.data.task import Example, Task
from headlab.files import write_json_atomic

log = logging.getLogger("headlab")


def collate(examples: list[Example]) -> dict[str, torch.Tensor]:
    """Pad to the longest sequence of the batch: tokens (B, n) or (B, n, c), padding_mask (B, n), labels."""
    tokens = _padded([t for t, _ in examples], PAD_ID)
    lengths = torch.tensor([len(t) for t, _ in examples])
    padding_mask = torch.arange(tokens.shape[1])[None, :] >= lengths[:, None]  # (B, n), True = padding
    labels = [y for _, y in examples]
    labels = _padded(labels, IGNORE_INDEX) if isinstance(labels[0], np.ndarray) else torch.tensor(labels)
    return {"tokens": tokens, "padding_mask": padding_mask, "labels": labels}


POSITIONAL_ROLES = ["self", "previous", "next", "first", "elsewhere"]


def positional_roles(batch: int, n: int) -> tuple[list[str], np.ndarray]:
    """Each key's position relative to the query: itself, the previous or next token, the first, elsewhere."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    roles = np.select([i == j, j == i - 1, j == i + 1, j == 0], [0, 1, 2, 3], default=4)  # (n, n)
    return list(POSITIONAL_ROLES), np.broadcast_to(roles, (batch, n, n)).copy()


def majority_rate(examples: list[Example]) -> float:
    """The accuracy of always answering the most common label of a split: chance, for a skewed task."""
    labels = np.concatenate([np.atleast_1d(np.asarray(y)) for _, y in examples])
    scored = labels[labels != IGNORE_INDEX]
    return float(np.bincount(scored).max() / len(scored)) if len(scored) else 0.0


def split_digest(examples: list[Example]) -> str:
    """sha256 of a prepared split: every example's token ids (int64), label(s) (int64) and b"|", in order. A split
    whose examples share their shapes (a generated task's) is hashed as one (N, bytes) array, the same bytes."""
    digest = hashlib.sha256()
    if examples and len({(np.shape(t), np.shape(y)) for t, y in examples}) == 1:
        tokens = np.stack([t for t, _ in examples]).astype(np.int64).reshape(len(examples), -1).view(np.uint8)
        labels = np.asarray([y for _, y in examples], dtype=np.int64).reshape(len(examples), -1).view(np.uint8)
        bar = np.full((len(examples), 1), ord("|"), dtype=np.uint8)
        digest.update(np.concatenate([tokens, labels, bar], axis=1).tobytes())
        return digest.hexdigest()
    for tokens, label in examples:
        digest.update(np.ascontiguousarray(tokens, dtype=np.int64).tobytes())
        digest.update(np.asarray(label, dtype=np.int64).tobytes() + b"|")
    return digest.hexdigest()


def _padded(arrays: list[np.ndarray], value: int) -> torch.Tensor:
    """Arrays (n_i, ...) -> (B, max n_i, ...), padded with value; stacked at once when all have one shape (a
    generated task's examples: a whole split collates at once)."""
    if len({a.shape for a in arrays}) == 1:
        return torch.from_numpy(np.stack(arrays))
    return pad_sequence([torch.from_numpy(a) for a in arrays], batch_first=True, padding_value=value)


class SeededSampler(Sampler[int]):
    """A shuffle drawn from the seed and the epoch alone, never from the global random state: a run's data order
    is the same alone, inside a pack, and after a resume. Lightning calls set_epoch before every epoch."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return iter(np.random.default_rng([self.seed, self.epoch]).permutation(self.n).tolist())

    def __len__(self) -> int:
        return self.n


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of similar length (less padding): the sampler's shuffle, sorted within windows of 50 batches, the
    full batches shuffled and the short one (if any) last, so that runs of any seed have batches of the same size
    at every step (a pack stacks them). Lightning sets the epoch of `sampler`: the order follows the seed and the
    epoch alone."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int, window: int = 50):
        self.lengths, self.batch_size, self.window = np.asarray(lengths), batch_size, window
        self.sampler = SeededSampler(len(lengths), seed)

    def __iter__(self):
        order = np.asarray(list(self.sampler), dtype=np.int64)
        span = self.batch_size * self.window
        batches = []
        for start in range(0, len(order), span):
            chunk = order[start : start + span]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches += [chunk[i : i + self.batch_size].tolist() for i in range(0, len(chunk), self.batch_size)]
        full = [b for b in batches if len(b) == self.batch_size]
        shuffle = np.random.default_rng([self.sampler.seed, self.sampler.epoch, 1]).permutation(len(full))
        return iter([full[i] for i in shuffle] + [b for b in batches if len(b) < self.batch_size])

    def __len__(self) -> int:
        return -(-len(self.lengths) // self.batch_size)


class EpochLoader(DataLoader):
    """A DataLoader that a run can resume in the middle of an epoch, exactly.

    Lightning saves its state_dict with each checkpoint: the batches of the current epoch already trained on and
    how many the epoch has (read from the trainer's progress, not counted here: the trainer fetches a batch ahead;
    an epoch may be shorter than the loader, trainer.limit_train_batches). load_state_dict makes the next epoch
    start after them, unless the epoch was over; the order of the batches follows the seed and the epoch alone,
    so the rest of the epoch is the rest a run left alone would see. Its workers' seeds come from its own
    generator: iterating it never draws from the global random state, which holds the dropout stream a resumed
    run must continue. (Lightning itself loads the state too late, once the loader was iterated for the estimate
    of the training steps; the ExactResume callback hands it to the datamodule, which loads it into the loader it
    builds.)
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("generator", torch.Generator().manual_seed(0))  # Lightning may build it again with these
        super().__init__(*args, **kwargs)
        self.skip = 0

    def position(self) -> tuple[int, int, int]:
        """(epoch, batches trained on in it, batches in it): a trainer's, where the datamodule follows one (a method,
        not a lambda of self: a loader in no reference cycle is freed at once, its workers shut down cleanly)."""
        return 0, 0, len(self)

    def state_dict(self) -> dict:
        epoch, batches, in_epoch = self.position()
        return {"epoch": epoch, "trained_batches": batches, "epoch_batches": in_epoch}

    def load_state_dict(self, state: dict) -> None:
        in_epoch = min(len(self), state.get("epoch_batches", len(self)))
        if 0 < state["trained_batches"] < in_epoch:  # else the checkpoint ended an epoch: the next starts afresh
            self.skip = state["trained_batches"]
            for sampler in (self.sampler, getattr(self.batch_sampler, "sampler", None)):
                if hasattr(sampler, "set_epoch"):  # Lightning sets it only after it has drawn the first batch
                    sampler.set_epoch(state["epoch"])

    def __iter__(self):
        batches = super().__iter__()
        for _ in range(self.skip):  # the index lists are cheap; the skipped examples are loaded and dropped
            next(batches)
        self.skip = 0
        return batches


class SplitLoaders:
    """train_dataloader, val_dataloader and test_dataloader from one `_loader(split, shuffle)`: training shuffled."""

    def _loader(self, split: str, shuffle: bool = False) -> DataLoader:
        raise NotImplementedError

    def train_dataloader(self):
        return self._loader("train", shuffle=True)

    def val_dataloader(self):
        return self._loader("val")

    def test_dataloader(self):
        return self._loader("test")

    def ordered_dataloader(self, split: str):
        """Any split in its stored order, unshuffled (the head analysis measures on it)."""
        return self._loader(split)

    train_loader_state: dict | None = None  # a resumed run's EpochLoader state (ExactResume hands it over)

    def _follow(self, loader: "EpochLoader") -> "EpochLoader":
        """The training loader, told where the trainer is in its epoch (for its checkpointed state) and, after a
        resume, started after the batches its epoch had trained on."""
        trainer = getattr(self, "trainer", None)
        if trainer is not None:
            loader.position = lambda: (
                trainer.current_epoch,
                trainer.fit_loop.epoch_loop.batch_progress.current.completed,
                trainer.num_training_batches,
            )
        if self.train_loader_state:
            loader.load_state_dict(self.train_loader_state)
            self.train_loader_state = None
        return loader


class ExampleDataModule(SplitLoaders, pl.LightningDataModule):
    """Train / val / test lists of examples, batched with dynamic padding. Subclasses fill self.splits in setup().

    They also say what the model needs (level, vocab_size, n_classes, max_len) and how ids read (token_strings).
    """

    level = "sequence"

    def __init__(self, batch_size: int = 64, num_workers: int = 0, bucketing: bool = False, seed: int = 0):
        super().__init__()
        self.batch_size, self.num_workers, self.bucketing, self.seed = batch_size, num_workers, bucketing, seed
        self.splits: dict[str, list[Example]] = {}
        self.warnings: list[str] = []  # said once, and recorded in results.json (describe)
        self._digests: dict[str, str] = {}

    def probe_batch(self, n: int, sentences: list[str] | None = None) -> dict[str, torch.Tensor]:
        """The same n validation examples every time (chosen with the seed), then the given sentences."""
        self.setup()
        val = self.splits["val"]
        chosen = np.random.default_rng([self.seed, 3]).permutation(len(val))[:n]
        return collate([val[i] for i in sorted(chosen)] + [(self.encode(s), IGNORE_INDEX) for s in sentences or []])

    def describe(self) -> dict:
        """What results.json records about the data: split sizes, vocabulary, classes, the digest of each prepared
        split (its token ids and labels: a reload of the run checks that it prepares the same), and warnings."""
        if not self._digests:
            self._digests = {role: split_digest(examples) for role, examples in self.splits.items()}
        described = {
            "splits": {role: len(examples) for role, examples in self.splits.items()},
            "vocab_size": self.vocab_size,
            "n_classes": self.n_classes,
            "chance": majority_rate(self.splits.get("test") or self.splits["train"]),
            "digests": {"splits": dict(self._digests)},
        }
        return {**described, "warnings": list(self.warnings)} if self.warnings else described

    def warn(self, message: str) -> None:
        log.warning("data: %s", message)
        self.warnings.append(message)

    def keep_in(self, run_dir) -> None:
        """Save into the run directory what a reload of the run needs beyond its config: data/digests.json, the
        digests a reload checks (generated data is generated again from the seed)."""
        write_json_atomic(Path(run_dir) / "data" / "digests.json", self.describe()["digests"])

    def encode(self, text: str) -> np.ndarray:
        raise ValueError("probe sentences need a text dataset; this task is generated from token ids")

    notation: str | None = None  # how the tokens of this data read (generated tasks), for the head view

    def class_name(self, index: int) -> str:
        return str(index)

    def attention_roles(self, tokens: np.ndarray, padding: np.ndarray) -> tuple[list[str], np.ndarray]:
        """What key j is to query i of each example, by position: (role names, roles (B, n, n) int)."""
        return positional_roles(tokens.shape[0], tokens.shape[1])

    @property
    def relevant_roles(self) -> tuple[str, ...]:
        """The roles of attention_roles a query needs to answer (its `relevant` statistic): none by position."""
        return ()

    @property
    def corruptions(self) -> tuple[str, ...]:
        """The corruptions of a task's inputs for activation patching (headlab.heads.causal), by the role they
        change: none for text, which has no natural minimal change with another answer."""
        return ()

    def token_strings(self, ids: torch.Tensor) -> list[str]:
        raise NotImplementedError

    def _loader(self, split: str, shuffle: bool = False) -> DataLoader:
        examples = self.splits[split]
        common = {"collate_fn": collate, "num_workers": self.num_workers, "persistent_workers": self.num_workers > 0}
        if shuffle and self.bucketing:
            sampler = BucketBatchSampler([len(t) for t, _ in examples], self.batch_size, self.seed)
            loader = EpochLoader(examples, batch_sampler=sampler, **common)
        else:
            sampler = SeededSampler(len(examples), self.seed) if shuffle else None
            loader = EpochLoader(examples, batch_size=self.batch_size, sampler=sampler, **common)
        if shuffle:
            self._follow(loader)
        return loader


class TaskDataModule(ExampleDataModule):
    """A task (headlab.data.task.Task) generated from the run's seed: each split from its own random stream."""

    def __init__(
        self,
        task: Task,
        n_train: int,
        n_val: int,
        n_test: int,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
    ):
        super().__init__(batch_size, num_workers, bucketing=False, seed=seed)
        self.task = task
        self.sizes = dict(zip(SPLITS, (n_train, n_val, n_test), strict=True))

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

    @property
    def notation(self) -> str | None:
        return getattr(self.task, "notation", None)

    def attention_roles(self, tokens: np.ndarray, padding: np.ndarray) -> tuple[list[str], np.ndarray]:
        """The task's own roles where it states them (AssociativeRecall: the keys a query names), else positional."""
        if hasattr(self.task, "attention_roles"):
            return self.task.attention_roles(tokens)
        return super().attention_roles(tokens, padding)

    @property
    def relevant_roles(self) -> tuple[str, ...]:
        """The task's own (AssociativeRecall: the keys a query names), else none."""
        return getattr(self.task, "RELEVANT_ROLES", ())

    @property
    def corruptions(self) -> tuple[str, ...]:
        """The task's own (AssociativeRecall: another value for key a, for key b), else none."""
        return getattr(self.task, "corruptions", ())

    def token_strings(self, ids: torch.Tensor) -> list[str]:
        """Readable tokens of one example: ids (n,) or (n, c); a fused position reads 'k3+v7'."""
        vocab = self.task.vocab()
        if ids.dim() == 1:
            return [vocab[i] for i in ids.tolist()]
        return ["+".join(vocab[i] for i in row if i) for row in ids.tolist()]
