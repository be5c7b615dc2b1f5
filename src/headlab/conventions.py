"""Facts shared by the data, the model, the analysis, training and the command line, each stated once.

No imports beyond the standard library: the config check reads them before torch is imported.
"""

import os
from pathlib import Path

PAD_ID = 0  # token id of padding everywhere (its embedding is zero and adds nothing to a fused position)
IGNORE_INDEX = -100  # label of positions that are not scored (token-level tasks)
SPLITS = ("train", "val", "test")  # a dataset's splits, in this order

# config keys that say how a run is started, not what it is: they may differ between attempts of one run
RESUME_KEYS = ("resume", "sweep.resume")
# suffixes of config keys that say where a run writes (they differ between runs without defining them)
PATH_SUFFIXES = ("save_dir", "dirpath", "out_dir", "default_root_dir", "resume_from")
# config groups that say where a run reports (csv, W&B, TensorBoard), not what it computes: a run recorded with one
# logger is the same run under another
REPORTING_GROUPS = ("logger",)
PROGRESS = "progress.json"  # in a run directory while it trains: where it stands (training.progress_record)


def cache_root() -> Path:
    """Where headlab keeps what it can rebuild (prepared datasets, compiled kernels): $HEADLAB_CACHE, or
    ~/.cache/headlab."""
    return Path(os.environ.get("HEADLAB_CACHE") or Path.home() / ".cache" / "headlab")
