"""A sweep's run records read back: every results.json below some directories, or in a run archive
(headlab.stats.archive), with each run's heads.json and learning curve. Failed, missing and corrupt records are
kept apart with the reason, never silently dropped.
"""

import csv
import functools
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from headlab.conventions import as_now
from headlab.files import read_received
from headlab.record import defining_keys, is_finite_number
from headlab.stats import archive

LN2 = math.log(2)  # the largest Jensen-Shannon divergence, in nats
HEAD_KEY = re.compile(r"heads/L\d+/H\d+/(\w+)$")  # one head's statistic, as logged and in W&B summaries


@dataclass
class Runs:
    completed: list[dict] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (where, "status: error"): not completed
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (where, why)


def load_dirs(dirs: list[Path]) -> Runs:
    """The runs below sweep directories (or any directories with results.json below them), results.json files,
    or run archives (headlab.stats.archive)."""
    runs = Runs()
    seen: dict[tuple[int, int], str] = {}  # (device, inode) of each record or archive read -> where it was read
    for root in dirs:
        if archive.is_archive(root):
            if (first := _once(seen, root, str(root))) is not None:
                runs.unreadable.append((str(root), f"the same archive as {first}: read once"))
                continue
            try:
                found = {where: files.get for where, files in archive.read(root).items()}
            except (*archive.UNREADABLE, archive.TooLarge) as error:
                runs.unreadable.append((str(root), f"not a readable archive: {error}"))
                continue
            files = list(found)
        else:
            files = [root] if root.name == "results.json" else sorted(root.rglob("results.json"))
            found = {}
            for path in files:  # a record met again (a directory given twice, overlapping ones, a hard link)
                if (first := _once(seen, path, str(path.parent))) is not None:
                    runs.unreadable.append((str(path.parent), f"the same record as {first}: counted once"))
                else:
                    found[str(path.parent)] = functools.partial(_text, path.parent)
        if not files:
            runs.unreadable.append((str(root), "no results.json below it" if root.exists() else "it does not exist"))
        for where, read in found.items():
            _add_run(runs, where, read)
    return _one_per_run(runs)


def _one_per_run(runs: Runs) -> Runs:
    """Records of the same run (its configuration and seed: headlab.record.same_run), such as a sweep given seed=0,0
    or two sweeps of one arm read together, are one replicate: the first read counts, the others are left out saying
    which it repeats (counted twice, one seed would pass for two: an interval too narrow, a test too strong)."""
    first: dict[frozenset, str] = {}
    kept = []
    for record in runs.completed:
        config = record["config"]
        run = frozenset(
            (k, json.dumps(v, sort_keys=True)) for k in defining_keys(config, config) if (v := config[k]) is not None
        )
        if run in first:
            runs.unreadable.append(
                (record["where"], f"the same run (configuration and seed) as {first[run]}: counted once")
            )
        else:
            first[run] = record["where"]
            kept.append(record)
    runs.completed = kept
    return runs


def _once(seen: dict[tuple[int, int], str], path: Path, where: str) -> str | None:
    """Where the same file (the same device and inode) was read before, or None, noting it as read here."""
    try:
        stat = path.stat()
    except OSError:
        return None
    key = (stat.st_dev, stat.st_ino)
    if key in seen:
        return seen[key]
    seen[key] = where
    return None


def _add_run(runs: Runs, where: str, read) -> None:
    """One run's records, read(name) the text of its results.json, heads.json, metrics.csv (None if absent)."""
    text = read("results.json")
    try:
        record = json.loads(text) if text is not None else None
    except ValueError as error:
        record, why = None, f"not JSON ({error})"
    else:
        why = "no results.json" if text is None else "not a run's record (a JSON object with a status)"
    if not isinstance(record, dict) or "status" not in record:
        runs.unreadable.append((f"{where}/results.json", why))
        return
    status = record["status"]
    missing = [k for k in ("config", "metrics") if not isinstance(record.get(k), dict)]
    if status == "completed" and missing:
        runs.unreadable.append((f"{where}/results.json", f"a completed record without {' or '.join(missing)}"))
    elif status == "completed":
        record["config"] = as_now(record["config"])
        not_numbers = {k: v for k, v in record["metrics"].items() if v is not None and not is_finite_number(v)}
        if not_numbers:  # a diverged model (its other metrics are those of NaN weights: chance) or a forged record
            key, value = next(iter(not_numbers.items()))
            why = f"metric {key} is {value!r}, not a finite number: the run is left out (a diverged model)"
            runs.unreadable.append((f"{where}/results.json", why[:300]))
            return
        record["head_analysis"] = _read_heads(read("heads.json"))  # ("heads": the resolved sizes in results.json)
        if record["head_analysis"] is None:
            runs.unreadable.append((f"{where}/heads.json", "not a head analysis (a JSON object with rows): left out"))
            record["head_analysis"] = {}
        record["curve"] = record.get("curve") if isinstance(record.get("curve"), list) else None
        record["curve"] = record["curve"] or _csv_curve(read("metrics.csv"))
        record["metrics"].update(head_means(_head_scalars(record["head_analysis"].get("rows", []))))
        record["metrics"].update(head_similarity(record["head_analysis"].get("similarity")))
        runs.completed.append({**record, "where": where})
    else:
        runs.failed.append((where, f"{status}: {record['error']}" if record.get("error") else status))


def _text(run_dir: Path, name: str) -> str | None:
    """A record's text; None when it is absent, unreadable, larger than a record may be or no plain file (a pipe, a
    device, a link: files.read_received, which looks before it reads)."""
    try:
        return read_received(run_dir / name, archive.MAX_RECORD_BYTES)
    except (OSError, UnicodeDecodeError):
        return None


def _csv_curve(text: str | None) -> list[dict]:
    """The learning curve from a CSV logger's metrics.csv, for runs whose results.json has none."""
    try:
        rows = [r for r in csv.DictReader(io.StringIO(text)) if r.get("val/acc")]
        return [{"epoch": int(r["epoch"]), "step": int(r["step"]), "val/acc": float(r["val/acc"])} for r in rows]
    except (TypeError, ValueError, KeyError):
        return []


def _read_heads(text: str | None) -> dict | None:
    """heads.json as a dict; {} without one (analysis off, or a run that never got there); None when it is there
    but not a head analysis."""
    if text is None:
        return {}
    try:
        heads = json.loads(text)
    except ValueError:
        return None
    rows = heads.get("rows", []) if isinstance(heads, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and _is_head_row(r) for r in rows):
        return None
    return heads


def _is_head_row(row: dict) -> bool:
    """A row of a head analysis as headlab writes it: its layer and head indices, and a role that is a name."""
    index = [row.get(k) for k in ("layer", "head")]
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 100_000 for i in index):
        return False
    return "role" not in row or (isinstance(row["role"], str) and len(row["role"]) <= 100)


def _head_scalars(rows: list[dict]) -> dict[str, float]:
    return {
        f"heads/L{r['layer']}/H{r['head']}/{k}": v for r in rows for k, v in r.items() if k not in ("layer", "head")
    }


def head_means(metrics: dict) -> dict[str, float]:
    """heads/<stat>: the mean over every head of every layer of heads/L<l>/H<h>/<stat> (entropy, score_std, ...),
    a metric like any other (--metric heads/entropy)."""
    per_stat: dict[str, list[float]] = {}
    for key, value in metrics.items():
        if (match := HEAD_KEY.match(key)) and is_finite_number(value):
            per_stat.setdefault(match.group(1), []).append(value)
    return {f"heads/{stat}": sum(values) / len(values) for stat, values in per_stat.items()}


def head_similarity(divergence) -> dict[str, float]:
    """heads/similarity: the mean similarity 1 - JS / ln 2 of every pair of distinct heads (heads.json's
    `similarity`, the divergence matrix: 1 = the heads attend alike, 0 = to disjoint keys; low = diverse heads);
    {} without two heads or with a divergence that is not a finite number in [0, ln 2]."""
    if not isinstance(divergence, list) or len(divergence) < 2:
        return {}
    pairs = [row[b] for a, row in enumerate(divergence) if isinstance(row, list) for b in range(a + 1, len(row))]
    if not pairs or not all(is_finite_number(v) and 0 <= v <= LN2 + 1e-6 for v in pairs):
        return {}
    return {"heads/similarity": 1 - sum(pairs) / len(pairs) / LN2}


def mixed_data(records: list[dict]) -> list[str]:
    """Runs with the same data config (the `data` choice and every data.* key but the seed and the fold) whose
    files differ (results.json data.digests.files: each file's sha256, a hub dataset's fingerprint): one line
    per data config and file, saying how many runs read each version. [] when each data config read one."""
    versions: dict[tuple, dict[str, int]] = {}
    names: dict[tuple, str] = {}  # a data config's `data` choice, as it is said
    for r in records:
        config = r.get("config") or {}
        named = tuple(sorted((k, repr(v)) for k, v in config.items() if _names_data(k)))
        names[named] = str(config.get("data", "?"))
        files = (((r.get("data") or {}).get("digests") or {}).get("files")) or {}
        for role, digest in files.items() if isinstance(files, dict) else ():
            seen = versions.setdefault((named, role), {})
            seen[str(digest)] = seen.get(str(digest), 0) + 1
    return [
        f"data={names[named]}: its {role} file has {len(seen)} versions ("
        + ", ".join(f"{digest[:12]} in {n} runs" for digest, n in sorted(seen.items(), key=lambda item: -item[1]))
        + ")"
        for (named, role), seen in versions.items()
        if len(seen) > 1
    ]


def _names_data(key: str) -> bool:
    return key == "data" or (key.startswith("data.") and key not in ("data.seed", "data.cv.fold"))
