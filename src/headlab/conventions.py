"""Facts shared by the data, the model, the analysis and the config check, each stated once.

No imports beyond the standard library: the config check reads CHOICES before torch is imported.
"""

import os
from pathlib import Path

PAD_ID = 0  # token id of padding everywhere (its embedding is zero and adds nothing to a fused position)
IGNORE_INDEX = -100  # label of positions that are not scored (token-level tasks)

# the allowed values of every key that is a choice among names: the model raises with them, the config check
# reports them, docs/configuration.md lists them (a test keeps the three in step)
CHOICES: dict[str, tuple] = {
    "model.norm": ("post", "pre"),
    "model.positional": ("sinusoidal", "learned"),
    "model.readout": (None, "cls", "mean", "max", "token"),
    "model.attention.scoring": ("dot", "additive"),
    "data.tokenizer.kind": ("wordpiece", "bpe"),
}


def cache_root() -> Path:
    """Where headlab keeps what it can rebuild (prepared datasets, compiled kernels): $HEADLAB_CACHE, or
    ~/.cache/headlab."""
    return Path(os.environ.get("HEADLAB_CACHE") or Path.home() / ".cache" / "headlab")
