"""headlab-status: where sweeps and runs stand, read from their directories alone (while they train, from another
terminal or a cluster's login node): each sweep's jobs by status; every pack or run in training with its step,
epoch, last validation, the time left at its pace and how long ago it last wrote (progress.json); the jobs waiting
their turn; why the others did not complete. It reads records only: no torch, nothing written."""

import argparse
import contextlib
import json
import math
import sys
from datetime import datetime, timezone
from pathlib import Path

from headlab.cli.arguments import positive_number
from headlab.cli.pipe import piped
from headlab.conventions import PROGRESS
from headlab.files import read_received
from headlab.launch.summary import job_ranges
from headlab.printing import duration
from headlab.record import read_record, total_seconds

ORDER = ("completed", "running", "queued", "interrupted", "failed")  # the statuses, in the order they are told
SHOWN = 12  # lines of packs or runs in training per sweep; the rest are counted


@piped
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="headlab-status", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="sweep directories (one job per folder) or run directories")
    parser.add_argument(
        "--stale",
        type=positive_number,
        default=10.0,
        metavar="MINUTES",
        help="a run in training that has not written its progress for longer is flagged as maybe stopped (10)",
    )
    args = parser.parse_args(argv)
    for folder in args.dirs:
        jobs = find_jobs(folder)
        if not jobs:
            print(f"headlab-status: no run records (results.json) in {folder}", file=sys.stderr)
            sys.exit(2)
        print("\n".join(describe(folder, jobs, args.stale * 60, datetime.now(timezone.utc))))


def find_jobs(folder: Path) -> dict[str, dict]:
    """The records of a run directory ({"": record}) or of a sweep's job folders ({job name: record}), each with
    its progress.json (key "progress") where it has one."""
    dirs = [folder] if (folder / "results.json").is_file() else [p.parent for p in folder.glob("*/results.json")]
    jobs = {}
    for run_dir in sorted(dirs, key=lambda d: (len(d.name), d.name)):  # 2 before 10
        record = read_record(run_dir) or {"status": "unreadable"}
        with contextlib.suppress(OSError, ValueError):  # none yet, or none in a run of an older headlab
            record["progress"] = json.loads(read_received(run_dir / PROGRESS))
        jobs["" if run_dir == folder else run_dir.name] = record
    return jobs


def describe(folder: Path, jobs: dict[str, dict], stale_s: float, now: datetime) -> list[str]:
    """The lines for one run, or for a sweep: its jobs counted by status, then a line per pack or job in training,
    and one per status and reason for the jobs neither in training nor completed."""
    if list(jobs) == [""]:  # one run
        record = jobs[""]
        if record.get("status") == "running":
            return [f"{folder}: " + training_line(record, [record], stale_s, now)]
        return [f"{folder}: {record.get('status')}" + (f" ({record['error']})" if record.get("error") else "")]
    by_status: dict[str, list[str]] = {}
    for name, record in jobs.items():
        by_status.setdefault(str(record.get("status")), []).append(name)
    statuses = sorted(by_status, key=lambda s: (ORDER.index(s) if s in ORDER else len(ORDER), s))
    counts = ", ".join(f"{len(by_status[s])} {s}" for s in statuses)
    running = [jobs[n] | {"name": n} for n in by_status.get("running", [])]
    lines = [f"{folder}: {len(jobs)} jobs: {counts}", *_completed_line(jobs, by_status.get("completed", []))]
    lines += _training_lines(running, stale_s, now)
    hints = {
        "queued": "waiting for their turn"
        if any(_last_word(r, now) < stale_s for r in running)
        else "not started (if the sweep has stopped, not waiting for a slot: sweep.resume=true trains them)",
        "interrupted": "sweep.resume=true continues them",
    }
    for status in statuses:
        if status in ("running", "completed"):
            continue
        by_reason: dict[str, list[str]] = {}
        for name in by_status[status]:
            by_reason.setdefault(str(jobs[name].get("error") or ""), []).append(name)
        for reason, names in by_reason.items():
            why = "; ".join(text for text in (reason, hints.get(status)) if text)
            lines.append(f"  {status}: {len(names)} ({job_ranges(names)})" + (f": {why}" if why else ""))
    return lines


def _completed_line(jobs: dict[str, dict], names: list[str]) -> list[str]:
    """The completed jobs and how long each took over all its attempts (a pack's members: their pack's time): what
    those to come may."""
    took = [t for n in names if (t := total_seconds(jobs[n]))]
    if not took:
        return []
    shortest, longest = duration(min(took)), duration(max(took))
    each = shortest if shortest == longest else f"{shortest} to {longest}"
    return [f"  completed: {len(names)} ({job_ranges(names)}), each in {each}"]


def _training_lines(running: list[dict], stale_s: float, now: datetime) -> list[str]:
    """A line per pack in training (its members train together) or per job of no pack, the first SHOWN of them."""
    groups: dict[str, list[dict]] = {}
    for record in running:
        pack = (record.get("pack") or {}).get("id") or (record.get("progress") or {}).get("pack")
        groups.setdefault(f"pack {pack}" if pack else f"job {record['name']}", []).append(record)
    lines = []
    for label, members in list(groups.items())[:SHOWN]:
        if label.startswith("pack "):
            label += f" ({len(members)} job{'s' * (len(members) > 1)}: {job_ranges([m['name'] for m in members])})"
        lines.append(f"  {label}: {training_line(members[0], members, stale_s, now)}")
    if len(groups) > SHOWN:
        lines.append(f"  and {len(groups) - SHOWN} more in training")
    return lines


def training_line(record: dict, members: list[dict], stale_s: float, now: datetime) -> str:
    """Where a run in training (or a pack, its members) stands, from progress.json; its start where it has none."""
    progress = record.get("progress")
    started = _time(record.get("started_at"))
    if not progress:
        since = f" for {duration((now - started).total_seconds())}" if started else ""
        return f"starting{since} (no {PROGRESS} yet: preparing its data, or written by a headlab without one)"
    step, steps = progress["step"], progress.get("steps")
    parts = [f"step {step:,}" + (f" of {steps:,} ({100 * step / steps:.0f}%)" if steps else "")]
    if progress.get("epochs"):
        parts[0] += f", epoch {progress['epoch']} of {progress['epochs']}"
    if progress.get("phase") in ("validating", "testing"):
        parts[0] += f", {progress['phase']}"
    parts.append(_validation(members))
    attempt = progress.get("attempt", {})
    updated, began = _time(progress.get("updated_at")), _time(attempt.get("started_at"))
    done = step - attempt.get("step", step)
    if steps and updated and began and done > 0 and step < steps:
        left = (updated - began).total_seconds() * (steps - step) / done
        parts.append(f"about {duration(left)} left at its pace")
    if updated:
        ago = (now - updated).total_seconds()
        word = f"last word {duration(ago)} ago"
        if ago > stale_s:
            word += ": longer than --stale, its process may have ended without a word (sweep.resume=true continues it)"
        parts.append(word)
    return "; ".join(p for p in parts if p)


def _last_word(record: dict, now: datetime) -> float:
    """Seconds since a run in training last wrote its progress (or, before its first, since it started)."""
    written = _time((record.get("progress") or {}).get("updated_at")) or _time(record.get("started_at"))
    return (now - written).total_seconds() if written else math.inf


def _validation(members: list[dict]) -> str:
    """The last validation's val/acc: the run's, or over a pack's members still training, mean and range."""
    values = [
        m["progress"]["val"]["val/acc"]
        for m in members
        if (m.get("progress") or {}).get("val") and not m["progress"].get("diverged")
    ]
    diverged = sum(bool((m.get("progress") or {}).get("diverged")) for m in members)
    note = f" ({diverged} diverged)" if diverged else ""
    if not values:
        return f"not validated yet{note}"
    epoch = members[0]["progress"]["val"].get("epoch")
    at = f" after epoch {epoch + 1}" if isinstance(epoch, int) else ""
    if len(values) == 1:
        return f"val/acc {values[0]:.4f}{at}{note}"
    mean = math.fsum(values) / len(values)
    return f"val/acc {mean:.4f} [{min(values):.4f}, {max(values):.4f}]{at}{note}"


def _time(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


if __name__ == "__main__":
    main()
