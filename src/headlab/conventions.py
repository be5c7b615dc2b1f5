"""Facts shared by the data, the model, the analysis, training and the command line, each stated once.

No imports beyond the standard library: the config check reads them before torch is imported.
"""

import os
from pathlib import Path

PAD_ID = 0  # token id of padding everywhere (its embedding is zero and adds nothing to a fused position)
IGNORE_INDEX = -100  # label of positions that are not scored (token-level tasks)
SPLITS = ("train", "val", "test")  # a dataset's splits, in this order


def is_launch_key(key: str) -> bool:
    """Whether a flat config key says how a run or its sweep is started, not what the run computes: resume= and the
    whole sweep group (sweep.resume, .dry_run, .plan, .sequential, and any key it gains later). Such keys may differ
    between attempts of one run, the jobs of one pack and the runs of one arm."""
    return key == "resume" or key.startswith("sweep.")


# suffixes of config keys that say where a run writes (they differ between runs without defining them)
PATH_SUFFIXES = ("save_dir", "dirpath", "out_dir", "default_root_dir", "resume_from")
# config groups that say where a run reports (csv, W&B, TensorBoard), not what it computes: a run recorded with one
# logger is the same run under another
REPORTING_GROUPS = ("logger",)
# keys that say how a run's results are read (an experiment's pre-stated analysis), not what it computes
ANALYSIS_KEYS = ("compare", "confirm", "claims")
# keys added to the config after runs were recorded without them, with the value such a record counts as (a resume,
# a sweep's completed jobs, compare's grouping): the model keys' values those runs had; the causal analysis, which
# changes nothing a run trains, at its default, and how a pack computed at its default (auto: what the CPU and the GPU
# did then), so that an older sweep continues without rerunning its jobs
ADDED_KEYS = {
    "callbacks.attention.causal_batches": 4,
    "model.attention.normalizer": "softmax",
    "model.attention.gate": "none",
    "model.attention.talking_heads": "none",
    "model.attention.differential": False,
    "model.attention.qk_norm": False,
    "model.attention.latent_kv": None,
    "model.attention.value_residual": False,
    "model.attention.mta": None,
    "model.attention.moh": None,
    "pack.compute": "auto",
}
PROGRESS = "progress.json"  # in a run directory while it trains: where it stands (training.progress_record)


def cache_root() -> Path:
    """Where headlab keeps what it can rebuild (prepared datasets, compiled kernels): $HEADLAB_CACHE, or
    ~/.cache/headlab."""
    return Path(os.environ.get("HEADLAB_CACHE") or Path.home() / ".cache" / "headlab")


def as_now(flat: dict) -> dict:
    """A recorded flat config with the keys added since (ADDED_KEYS) at the value it ran with, where it has a
    model and lacks them."""
    if "model.attention.n_heads" not in flat:
        return flat
    return {**{k: v for k, v in ADDED_KEYS.items() if k not in flat}, **flat}


def data_dir() -> Path:
    """Where the released text benchmarks are (conf/data/mr.yaml, ...): $HEADLAB_DATA, else ../shared/data, as an
    absolute path (a run records where its files were)."""
    return Path(os.environ.get("HEADLAB_DATA") or "../shared/data").expanduser().resolve()


def released_name(value):
    """A data file under $HEADLAB_DATA named from there ($HEADLAB_DATA/cr/custrev.all), as every machine names it;
    any other value as it is."""
    if not isinstance(value, str) or not value.startswith("/"):
        return value
    path, root = Path(value).resolve(), data_dir()
    return f"$HEADLAB_DATA/{path.relative_to(root).as_posix()}" if path.is_relative_to(root) else value
