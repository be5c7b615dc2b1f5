"""headlab-sync: a sweep's offline W&B runs uploaded in one command, several at a time, and resumable: each run is
one `wandb sync` of its own (W&B's uploader, unchanged), a run it marked synced is skipped the next
time, and one that failed says why and is tried again then."""

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

SYNC_TIMEOUT_S = 3600  # one run's upload; a run that takes longer is reported and tried again next time


@dataclass
class Synced:
    run: Path
    ok: bool
    said: str  # why not, in W&B's last line


def offline_runs(roots: list[Path]) -> list[Path]:
    """Every offline W&B run below the roots (a run directory's wandb/offline-run-*), in order."""
    return sorted({p for root in roots for p in root.rglob("offline-run-*") if p.is_dir() and p.parent.name == "wandb"})


def is_synced(run: Path) -> bool:
    """Whether `wandb sync` uploaded it (it leaves run-<id>.wandb.synced beside the run's log)."""
    return any(run.glob("*.wandb.synced"))


def sync(runs: list[Path], jobs: int) -> list[Synced]:
    """Each run uploaded by its own `wandb sync`, `jobs` at a time."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_sync_one, runs))


def _sync_one(run: Path) -> Synced:
    command = [sys.executable, "-m", "wandb", "sync", str(run)]  # it marks the run synced once uploaded
    try:
        done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=SYNC_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Synced(run, False, f"no end after {SYNC_TIMEOUT_S} s")
    if done.returncode == 0 and is_synced(run):
        return Synced(run, True, "")
    lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    return Synced(run, False, lines[-1] if lines else f"wandb sync exited {done.returncode}")
