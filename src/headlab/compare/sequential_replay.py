"""Sweeps in rounds, in compare.md: what a sweep that ran in rounds read at each look (its sequential.json), and a
table's contrasts replayed as a group-sequential design (--sequential K): each arm read against its baseline at K
looks over its seeds in order, as sweep.sequential would have run them (Welch's test at each look's level,
headlab.stats.sequential), beside the same contrast read once on every seed, and how many runs the rounds would
have needed for it."""

import csv
import io
import json
from pathlib import Path

from headlab.escape import markdown_cell
from headlab.files import read_received, write_text_atomic
from headlab.stats import archive, sequential
from headlab.stats.comparison import baselines
from headlab.stats.contrasts import CompareError, Design


def replay_table(rows: list[dict], keys: list[str], design: Design, looks: int) -> list[str]:
    """compare.md's lines: what the rounds would have read and run, then a row per contrast."""
    metric = design.metrics[0]
    if any("folds" in (row.get(metric) or {}) for row in rows):
        raise CompareError("--sequential replays seeds, not folds: these runs are cross-validated")
    read, runs = [], {}  # runs: each group's replicates under the rounds (id of its row -> n)
    for row, base in zip(rows, baselines(rows, keys, design), strict=True):
        mine = _in_order(row.get(metric))
        runs[id(row)] = max(runs.get(id(row), 0), len(mine) if base is None else 0)
        if base is None or row is base or not mine or metric not in base:
            continue
        theirs = _in_order(base[metric])
        sizes = tuple(sequential.look_sizes(min(len(mine), len(theirs)), looks))
        rounds = sequential.run(mine, theirs, sizes, design.effect)
        once = sequential.fixed(mine[: sizes[-1]], theirs[: sizes[-1]], design.effect)
        read.append((row, sizes, rounds, once))
        runs[id(row)] = rounds["replicates"]  # its baseline runs as long as its longest arm
        runs[id(base)] = max(runs.get(id(base), 0), rounds["replicates"])
    if not read:
        return [f"Replayed as if sequential: no arm has a baseline with {metric} to read against."]
    all_runs = sum(len(_in_order(row.get(metric))) for row in rows)
    needed = sum(runs.values())
    same = sum(rounds["reading"] == once["reading"] for _, _, rounds, once in read)
    margin = f" or its repeated interval within ±{design.effect:g}" if design.effect else ""
    lines = [
        f"Replayed as if sequential (--sequential {looks}: sweep.sequential's rounds at {_sizes(read)} seeds, seeds "
        f"in order; Welch's test on {metric} at each look's Lan-DeMets O'Brien-Fleming-like level, an arm stopping "
        f"when significant{margin}): **{needed} of {all_runs} runs** ({needed / all_runs:.0%}), the same reading as "
        f"every seed read once in {same} of {len(read)} contrasts.",
        "",
        f"| {' | '.join(keys)} | stopped at | reading | p (the look's level) | Δ [repeated CI] | all seeds read once |",
        "|" + "---|" * (len(keys) + 5),
    ]
    for row, sizes, rounds, once in read:
        low, high = rounds["interval"]
        lines.append(
            f"| {' | '.join(markdown_cell(row[k]) for k in keys)} | look {rounds['look']} of {len(sizes)} "
            f"({rounds['replicates']} seeds) | {rounds['reading'] or 'undecided'} | {rounds['p']:.3g} "
            f"({rounds['level']:.3g}) | {rounds['difference']:+.4f} [{low:+.4f}, {high:+.4f}] | "
            f"{once['reading'] or 'undecided'} (p {once['p']:.3g}) |"
        )
    return lines


def _in_order(summary: dict | None) -> list[float]:
    """A group's values of a metric in the order of their seeds."""
    if not summary or "values" not in summary:
        return []
    pairs = sorted(zip(summary["seeds"], summary["values"], strict=True), key=lambda sv: (str(type(sv[0])), sv[0]))
    return [value for _, value in pairs]


def _sizes(read: list) -> str:
    sizes = sorted({s for _, sizes, _, _ in read for s in [sizes]})
    return "; ".join(", ".join(map(str, s)) for s in sizes)


ROUNDS_CSV = "compare_rounds.csv"  # beside compare.md: a row per arm a sweep read in rounds (findings read it)
ROUND_FIELDS = ("look", "runs", "reading", "p", "level", "effect", "low", "high")
READINGS = (None, sequential.SIGNIFICANT, sequential.WITHIN_MARGIN, "baseline")  # in a sequential.json


def read_rounds(dirs: list[Path]) -> list[tuple[str, dict]]:
    """(where, its sequential.json) of each sweep that ran in rounds (sweep.sequential), from a directory or an
    archive; each arm's row as _round_fields gives it. A received file: one that is not what a sweep writes is a
    CompareError naming it."""
    found = []
    for where, text in _sequential_files(dirs):
        try:
            said = json.loads(text)
            said["rows"] = [_round_fields(arm) for arm in said["arms"]]
            said["looks"] = [int(n) for n in said["looks"]]
            said["alpha"] = float(said["alpha"]) if "alpha" in said else None  # none before it was set
            said["baseline"], said["metric"] = str(said["baseline"]), str(said["metric"])
            said["effect"] = float(said["effect"]) if said.get("effect") is not None else None  # the margin
        except (ValueError, KeyError, TypeError) as error:
            raise CompareError(f"{where}: not a sequential.json a sweep writes ({error})"[:300]) from None
        found.append((where, said))
    return found


def rounds_table(rounds: list[tuple[str, dict]]) -> list[str]:
    """compare.md's lines for the sweeps that ran in rounds (read_rounds): each arm's look, reading and the look's
    test."""
    lines = []
    for where, said in rounds:
        looks = ", ".join(map(str, said["looks"]))
        how = f"baseline {markdown_cell(said['baseline'])}, {markdown_cell(said['metric'])}"
        how += f", alpha {said['alpha']:.3g} an arm" if said["alpha"] is not None else ""
        lines += [
            f"Rounds ({markdown_cell(where)}: looks at {looks} replicates, {how}): read each arm by its round's "
            "reading; the table's test on an arm that stopped early does not hold its level.",
            "",
            "| arm | stopped at | reading | p (the look's level) | Δ [repeated CI] |",
            "|---|---|---|---|---|",
            *(_round_row(row) for row in said["rows"]),
            "",
        ]
    return lines


def write_rounds(out: Path, rounds: list[tuple[str, dict]]) -> Path:
    """compare_rounds.csv: a row per arm of each sweep in rounds: where, the arm's keys, the metric, the margin, and
    its round (ROUND_FIELDS; an arm not read, or the baseline, has only its reading)."""
    keys = list(dict.fromkeys(k for _, said in rounds for row in said["rows"] for k in row["arm"]))
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    writer.writerow(["sweep", *keys, "metric", "margin", *ROUND_FIELDS])
    for where, said in rounds:
        for row in said["rows"]:
            fields = ("" if row[f] is None else row[f] for f in ROUND_FIELDS)
            margin = "" if said["effect"] is None else said["effect"]
            writer.writerow([where, *(row["arm"].get(k, "") for k in keys), said["metric"], margin, *fields])
    write_text_atomic(out / ROUNDS_CSV, table.getvalue())
    return out / ROUNDS_CSV


def _sequential_files(sources: list[Path]) -> list[tuple[str, str]]:
    """(where, text) of each sweep's sequential.json: a directory's, or each archived sweep's."""
    found = []
    for source in sources:
        try:
            if archive.is_archive(source):
                found += list(archive.sweep_records(source, "sequential.json").items())
            elif (source / "sequential.json").is_file():
                found.append((f"{source}/sequential.json", read_received(source / "sequential.json")))
        except (*archive.UNREADABLE, archive.TooLarge) as error:
            raise CompareError(f"{source}: its sequential.json cannot be read ({error})"[:300]) from None
    return found


def _round_fields(arm: dict) -> dict:
    """An arm of a sequential.json as a row: its keys ({key: value}, from "k=v k=v"), and ROUND_FIELDS (None where
    it was not read: the baseline, or an arm no look reached)."""
    if arm["reading"] not in READINGS:
        raise ValueError(f"reading {str(arm['reading'])[:40]!r} is not one of {', '.join(map(str, READINGS))}")
    name = str(arm["arm"])
    keys = dict(part.split("=", 1) for part in name.split(" ") if "=" in part)
    row = {"name": name, "arm": keys, **dict.fromkeys(ROUND_FIELDS), "reading": arm["reading"]}
    if arm["reading"] == "baseline" or arm["look"] is None:
        return row
    low, high = (float(x) for x in arm["interval"])
    return row | {
        "look": int(arm["look"]),
        "runs": len(arm["runs"]),
        "p": float(arm["p"]),
        "level": float(arm["level"]),
        "effect": float(arm["difference"]),
        "low": low,
        "high": high,
    }


def _round_row(row: dict) -> str:
    name = markdown_cell(row["name"])
    if row["look"] is None:
        return f"| {name} | | {markdown_cell(row['reading'] or 'not read')} | | |"
    reading = markdown_cell(row["reading"] or "undecided")
    return (
        f"| {name} | look {row['look']} ({row['runs']} runs) | {reading} | {row['p']:.3g} ({row['level']:.3g}) | "
        f"{row['effect']:+.4f} [{row['low']:+.4f}, {row['high']:+.4f}] |"
    )
