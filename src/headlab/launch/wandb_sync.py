"""headlab-sync: a sweep's offline W&B runs uploaded in one command, several at a time, and resumable: each run is
one `wandb sync` of its own (W&B's uploader, unchanged), a run it marked synced is skipped the next
time, and one that failed says why and is tried again then."""

import os
import stat
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


@dataclass
class Found:
    runs: list[Path]  # offline runs to upload or show, each a real folder of plain files below a root
    left_out: list[str]  # a line each on what looks like a run but is not one to upload (a link out, a pipe)


def offline_runs(roots: list[Path]) -> Found:
    """Every offline W&B run below the roots (a run directory's wandb/offline-run-*), in order, never through a
    link: a received sweep's link to a run elsewhere (another's private run, say) is left out and named, and so
    is a run folder that holds a link or anything but plain files and folders (wandb sync would read through it)."""
    runs, left_out = [], []
    for root in roots:
        for folder, dirs, _files in os.walk(root):  # os.walk does not descend into links
            for name in dirs:
                path = Path(folder, name)
                if not (name == "wandb" or (name.startswith("offline-run-") and Path(folder).name == "wandb")):
                    continue
                if path.is_symlink():
                    left_out.append(f"{path}: left out: a link (to {os.readlink(path)})")
                elif name != "wandb":
                    odd = _not_plain(path)
                    (left_out.append(f"{path}: left out: {odd}") if odd else runs.append(path))
    return Found(sorted(runs), left_out)


def _not_plain(run: Path) -> str | None:
    """What wandb sync would read in a run folder (its run-*.wandb log, the files/ it uploads) that is neither a
    plain file nor a folder (a link, a pipe, a device), if anything. W&B's own logs/ (which it links to its cache)
    are not uploaded."""
    paths = [*run.glob("run-*.wandb")]
    for folder, dirs, files in os.walk(run / "files"):
        paths += [Path(folder, name) for name in dirs + files]
    for path in paths:
        mode = os.lstat(path).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            kind = "a link" if stat.S_ISLNK(mode) else "a pipe" if stat.S_ISFIFO(mode) else "no plain file"
            return f"{path.relative_to(run)} is {kind}"
    return None


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
