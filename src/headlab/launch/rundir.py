"""A run directory belongs to one run. A job claims its directory before it writes anything there: it takes the
directory's lock (a second process writing the same directory is refused), and a new run refuses a directory that
holds another run's records (results.json, checkpoints) in one line; resume= is the way back into a run. A sweep
rerun with sweep.resume=true may take back the directory of its own job (the same config): an incomplete attempt
with a last.ckpt is continued from it, one without is trained again from its first step, in place of the stale
checkpoints of its failed attempt. A sweep's job refused its directory leaves that directory as it was and notes
the refusal in the sweep's journal of refusals (REFUSED), which the sweep's summary counts as a job not completed.
"""

import contextlib
import fcntl
import json
import os
import shutil
from datetime import datetime
from pathlib import Path

from headlab.config.run_config import recorded_config
from headlab.conventions import PROGRESS
from headlab.errors import UsageError
from headlab.files import read_received
from headlab.record import read_record, same_run

LOCK = ".lock"
REFUSED = ".refused"  # in a sweep's folder: "<job dir>\t<reason>" for each job that refused its directory
HYDRA_LOG = "train.log"  # the job's log, which Hydra opens in the directory before headlab runs
_held: dict[Path, int] = {}  # run directory -> the descriptor of its lock, held while this process lives


def lock(run_dir: Path) -> None:
    """Hold the directory's lock for the life of this process; refused while another process holds it."""
    if run_dir in _held:
        return
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise UsageError(f"{run_dir} is being written by another process (pid {holder}); wait for it to end") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _held[run_dir] = fd


def release(run_dir: Path) -> None:
    fd = _held.pop(run_dir, None)
    if fd is not None:
        os.close(fd)


def held_records(run_dir: Path) -> str | None:
    """What of a run the directory holds, in words; None when it holds none."""
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").glob("*.ckpt"))
    if (run_dir / "results.json").exists():
        record = read_record(run_dir)
        status = record.get("status", "?") if record else "unreadable"
        return f"results.json ({status})" + (f" and {len(checkpoints)} checkpoint(s)" if checkpoints else "")
    return f"checkpoints ({', '.join(checkpoints)})" if checkpoints else None


def claim(run_dir: Path, flat_config: dict, resuming: bool, rerun: bool) -> bool:
    """Lock run_dir for this job and check that it may write there; returns whether the directory held nothing
    before (then a job refused before it began removes it again: remove_fresh). resuming: resume= (the run
    continues in its own directory); rerun: sweep.resume=true (the directory of this very job may be taken back)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lock(run_dir)
    fresh = all(p.name in (LOCK, HYDRA_LOG) for p in run_dir.iterdir())
    held = held_records(run_dir)
    if resuming or held is None:
        return fresh
    if rerun and same_run(recorded_config(run_dir), flat_config):
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # its failed attempt's: trained again
        return False
    raise UsageError(
        f"{run_dir} holds another run's records ({held}): choose another directory (hydra.run.dir=..., or "
        f"hydra.sweep.dir=... for a sweep), or continue that run with resume={run_dir}"
    )


def continues(run_dir: Path, flat_config: dict) -> bool:
    """Whether sweep.resume=true continues this job from an earlier, incomplete attempt (same config, last.ckpt)."""
    record = read_record(run_dir) or {}
    incomplete = record.get("status") != "completed"
    last = (run_dir / "checkpoints" / "last.ckpt").is_file()
    return incomplete and last and same_run(recorded_config(run_dir), flat_config)


def earlier_attempts(run_dir: Path, before: dict) -> list[dict]:
    """The attempts a run continued now made before, from the record it had (before): each its `started_at`,
    `status` and `duration_s`; one killed without a word ("running") is counted until its last word in progress.json
    (status "ended without a word"). A member still queued when its sweep stopped never trained: not an attempt."""
    attempts = list(before.get("attempts") or [])
    status, seconds = before.get("status"), before.get("duration_s")
    if status == "queued" or not before.get("started_at"):
        return attempts
    if status == "running":
        status, seconds = "ended without a word", None
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            last = datetime.fromisoformat(json.loads(read_received(run_dir / PROGRESS))["updated_at"])
            seconds = (last - datetime.fromisoformat(before["started_at"])).total_seconds()
            seconds = round(max(seconds, 0), 3) if seconds > -1 else None  # words are to the second; one from
            # an earlier attempt says nothing of this one's time
    return [*attempts, {"started_at": before["started_at"], "status": status, "duration_s": seconds}]


def remove_fresh(run_dir: Path) -> None:
    """Remove the directory a refused job was given (it held nothing else), and its sweep's, if that is empty."""
    release(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        run_dir.parent.rmdir()  # only when empty: a date folder of outputs/


def note_refused(sweep_dir: Path, run_dir: Path, reason: str) -> None:
    """Note in the sweep's journal that the job of run_dir refused it (one short append: safe from many
    processes); the journal is the sweep's, so the refused directory itself is not touched."""
    line = f"{os.path.relpath(run_dir, sweep_dir)}\t{reason.replace(str(run_dir), '<its directory>')}\n"
    with open(sweep_dir / REFUSED, "a", encoding="utf-8") as journal:
        journal.write(line)


def take_refused(sweep_dir: Path) -> dict[Path, str]:
    """The sweep's refused jobs (their directory -> why), and the journal removed: read once, by the sweep's end."""
    journal = sweep_dir / REFUSED
    try:
        lines = journal.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return {}
    journal.unlink()
    return {sweep_dir / name: reason for name, _, reason in (line.partition("\t") for line in lines if line)}


def completed_before(run_dir: Path, flat_config: dict) -> bool:
    """Did this job already complete, with the same configuration? (Resuming a sweep skips it.)"""
    previous = read_record(run_dir) or {}
    return previous.get("status") == "completed" and same_run(previous.get("config"), flat_config)
