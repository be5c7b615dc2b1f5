"""What a generated task is: the interface TaskDataModule (headlab.data.datamodule) builds its splits from.

A task is any object with these attributes and methods (AssociativeRecall and ListOps are two); a config names
its class under `data.task._target_` with its settings beside it. A task class may also state its rules as a
static `check(**settings, name=...)` that raises headlab.errors.InvalidSetting: its constructor calls it, and
the config check calls it before anything is built (`name` maps a setting to the key it is known by there).
"""

from typing import Protocol

import numpy as np

Example = tuple[np.ndarray, np.ndarray | int]  # token ids (n,) or (n, c), and one label or one per position


class Task(Protocol):
    level: str  # "token" (a label per position, -100 where unscored) or "sequence" (one label per example)
    vocab_size: int  # token ids are in [0, vocab_size); 0 is padding (headlab.conventions.PAD_ID)
    n_classes: int
    max_len: int  # the longest example, in positions

    def vocab(self) -> list[str]:
        """Token strings by id (attention maps, the head view)."""
        ...

    def sample(self, rng: np.random.Generator, n: int) -> list[Example]:
        """n examples drawn from rng alone (a split is reproducible from its seed)."""
        ...


def positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
