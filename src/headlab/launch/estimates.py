"""A dry run's estimate kept for the command it priced, and said beside what that command took.

`--dry-run` keeps its expected seconds in $HEADLAB_CACHE/estimates (one small file), keyed by what decides the jobs
and how they run: the command's own overrides less the dry run's, the sweeper's parameters, the launcher's settings
and the cores this process may use. The same command run after it (a sweep, or a single run) says when it ends what
it took, start to exit, against that estimate. Nothing is measured for this: a sweep with no dry run before it says
what it took, and a single run its outcome (which says its time) alone.
"""

import contextlib
import hashlib
import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from headlab.conventions import cache_root
from headlab.errors import DiskFull
from headlab.files import write_json_atomic
from headlab.printing import duration

DRY_RUN_ONLY = ("sweep.dry_run=", "sweep.plan.")  # overrides that shape the dry run, not the command it prices


def _key(config: DictConfig) -> str:
    from headlab.training.cores import usable_cores

    overrides = sorted(o for o in config.hydra.overrides.task if not o.startswith(DRY_RUN_ONLY))
    sweeper, launcher = (OmegaConf.to_container(config.hydra[k], resolve=False) for k in ("sweeper", "launcher"))
    said = json.dumps([overrides, sweeper, launcher, usable_cores()], sort_keys=True, default=str)
    return hashlib.sha256(said.encode()).hexdigest()[:24]


def _path(config: DictConfig) -> Path:
    return cache_root() / "estimates" / f"{_key(config)}.json"


def keep(config: DictConfig, seconds: float, packs_seconds: float) -> None:
    """Keep a dry run's estimate (seconds, start to exit; packs_seconds, its jobs or packs alone, which the packed
    launcher says when it starts instead of measuring them again) for the command it priced; a cache that cannot be
    written loses only these lines."""
    made = {
        "seconds": round(seconds, 3),  # a tiny run's few hundredths of a second kept, not rounded to none
        "packs_seconds": round(packs_seconds, 3),
        "at": datetime.now().isoformat(timespec="minutes"),
    }
    with contextlib.suppress(OSError, DiskFull):
        write_json_atomic(_path(config), made)


def kept(config: DictConfig) -> dict | None:
    """{seconds, packs_seconds, at} of the dry run of this command (packs_seconds None where an older headlab kept
    none), or None (none made here, or not readable as one)."""
    try:
        found = json.loads(_path(config).read_text())
        packs = found.get("packs_seconds")
        return {"seconds": float(found["seconds"]), "packs_seconds": packs and float(packs), "at": str(found["at"])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def process_seconds() -> float | None:
    """How long this process has run, where it is headlab-train's own (Linux's /proc says when it started); None
    inside another program (the command's function called from a test) or where the system does not say."""
    main = str(getattr(sys.modules.get("__main__"), "__file__", ""))
    if not main.endswith(("headlab-train", os.path.join("headlab", "cli", "train.py"))):
        return None
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))


class Stopwatch:
    """What a command took, start to exit: this process's age where it is headlab-train's, else the time since the
    stopwatch was made (when the sweep or run began)."""

    def __init__(self):
        self.began = time.monotonic()

    def line(self, config: DictConfig, what: str, alone: bool = True) -> str | None:
        """'<what> took 62 s start to exit (its dry run of 2026-12-04T00:58 estimated 58 s, took / estimated
        1.07)'; without a dry run's estimate, '<what> took 62 s start to exit' where alone, else None (a single
        run's outcome line says its time already)."""
        took = process_seconds()
        took = time.monotonic() - self.began if took is None else took
        said = f"{what} took {duration(took)} start to exit"
        estimate = kept(config)
        if estimate is None:
            return said if alone else None
        ratio = f", took / estimated {took / estimate['seconds']:.2f}" if estimate["seconds"] > 0 else ""
        return f"{said} (its dry run of {estimate['at']} estimated {duration(estimate['seconds'])}{ratio})"
