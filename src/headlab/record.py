"""results.json: what a run produced, with everything needed to compare and reproduce it. Its one reader and one
writer, the names of its file and of the metrics read across layers, and when two records are the same run.

Standard library only: the config check, the launchers and the statistics over runs all read records.
"""

import functools
import json
import math
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from headlab.conventions import ANALYSIS_KEYS, PATH_SUFFIXES, REPORTING_GROUPS, as_now, is_launch_key
from headlab.files import read_received, write_json_atomic

RESULTS = "results.json"  # in every run directory, from the moment its job claims it
VAL_ACC_BEST = "val/acc_best"  # the best validation accuracy of the run: what it is selected and summarised on
TEST_ACC = "test/acc"
TEST_LOSS = "test/loss"
TRAIN_METRICS = ("train/acc", "train/loss_epoch")  # the last epoch's, beside val/ and test/
# every metric of a record's "metrics": what a sweep may optimise (sweep.objective)
OBJECTIVES = (VAL_ACC_BEST, "val/acc", "val/loss", TEST_ACC, TEST_LOSS, *TRAIN_METRICS)
PACKAGES = ("headlab", "torch", "lightning", "hydra-core", "torchmetrics", "numpy")


def is_finite_number(value) -> bool:
    """A measurement as a record holds it: a number, not a bool, neither NaN nor infinite (a diverged model's or a
    forged record's are not measurements)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def parse(text: str | None) -> dict | None:
    """A results.json text as a dict; None when it is absent, cut short, or not an object."""
    try:
        record = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def read_record(run_dir: Path) -> dict | None:
    """A run directory's results.json as a dict; None when it is absent, unreadable, cut short, or not an object."""
    try:
        return parse(read_received(Path(run_dir) / RESULTS))
    except (OSError, UnicodeDecodeError):
        return None


def write_record(run_dir: Path, record: dict) -> None:
    """A run directory's results.json, whole or not at all."""
    write_json_atomic(Path(run_dir) / RESULTS, record)


def total_seconds(record: dict) -> float | None:
    """A run's time over all its attempts (duration_s is its last one's); None before its first ends."""
    if record.get("duration_s") is None:
        return None
    return record["duration_s"] + sum(a.get("duration_s") or 0 for a in record.get("attempts") or [])


def flatten(tree: dict, prefix: str = "") -> dict:
    """{'model': {'attention': {'n_heads': 4}}} -> {'model.attention.n_heads': 4}; drops _target_ entries."""
    flat = {}
    for key, value in tree.items():
        if str(key).startswith("_"):
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def defining_keys(before: dict, now: dict) -> list[str]:
    """The keys on which two flat configs of one run must agree: not how the run is started (is_launch_key), not
    where it writes (PATH_SUFFIXES: a run directory may move), reports (REPORTING_GROUPS) or is read
    (ANALYSIS_KEYS), and the choices of config groups only where both record them."""
    return [
        k
        for k in sorted(set(before) | set(now))
        if not is_launch_key(k)
        and not k.endswith(PATH_SUFFIXES)
        and k.split(".")[0] not in (*REPORTING_GROUPS, *ANALYSIS_KEYS)
        and ("." in k or (k in before and k in now))
    ]


def same_run(before: dict | None, now: dict) -> bool:
    """Whether two flat configs are the same run (they agree on defining_keys)."""
    if before is None:
        return False
    before, now = as_now(before), as_now(now)
    return all(before.get(k) == now.get(k) for k in defining_keys(before, now))


def versions() -> dict:
    """Python's and the installed packages' versions, as this process loaded them."""
    return dict(_versions())


@functools.cache  # read once a process: metadata.version searches every distribution (80 jobs: 0.6 s)
def _versions() -> dict:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


@functools.cache  # the code a process runs is the code it loaded
def git_sha() -> str | None:
    """The commit of the headlab source tree, when it is a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None
