"""A comparison, from runs and an analysis to a report: the table of means and intervals with its tests and
verdicts (compare.md, compare.csv), the figures, the tables over datasets, the pruning curves and head roles asked
for, and compare.json: the analysis and sources the table was made from, which headlab-compare --check replays."""

import json
from dataclasses import dataclass, field
from pathlib import Path

from headlab.compare import analysis as analysis_
from headlab.compare.analysis import Analysis
from headlab.compare.head_tables import pruning_table, roles_table, write_pruning
from headlab.compare.over_datasets import write_across, write_meta
from headlab.compare.sequential_replay import read_rounds, replay_table, rounds_table, write_rounds
from headlab.compare.tables import write_outputs
from headlab.files import append_text_atomic, write_atomic
from headlab.stats import datasets
from headlab.stats.comparison import check_metrics, compare, pruning_summary, same_value, select_best
from headlab.stats.contrasts import CompareError, Design
from headlab.stats.roles import role_counts
from headlab.stats.runs import Runs

RECORD = "compare.json"  # beside compare.md: {"sources": [...], "analysis": {option: value}, "writes": {...}}


@dataclass
class Report:
    """What a comparison computed and wrote."""

    design: Design
    keys: list[str]
    rows: list[dict]
    n_runs: int
    pooled: list[dict] = field(default_factory=list)  # each contrast pooled over datasets (--meta)
    ranked: dict | None = None  # settings ranked by their gap to each dataset's best (--across)
    roles: list[str] | None = None  # the head roles table's lines (--roles)
    written: list[Path] = field(default_factory=list)


def only(records: list[dict], where: tuple[str, ...]) -> list[dict]:
    """The records whose config has each KEY=VALUE (a value as a command line writes it: true, dot; numbers by
    value, 3e-2 = 0.03); a CompareError naming the values there are where none has it."""
    for condition in where:
        key, _, value = condition.partition("=")
        if not key or not value:
            raise CompareError(f"--where takes KEY=VALUE, got {condition!r}")
        kept = [r for r in records if same_value(r["config"].get(key), value.strip())]
        if not kept:
            there = sorted({_as_written(r["config"].get(key)) for r in records})
            raise CompareError(f"--where {condition}: no run has it; {key} is {', '.join(there)}")
        records = kept
    return records


def report(
    runs: Runs, analysis: Analysis, out: Path, sources: dict, said: list[str] | None = None, plots: bool = True
) -> Report:
    """Compare the completed runs as the analysis states and write the report into out. sources: where the runs
    were read ({"dirs": [...]}, or {"wandb": ENTITY/PROJECT, "group": G}) and where the table also went ({"into",
    "block", "archive"}), recorded in compare.json; said: the command as it was given, compare.md's Command line
    (default: the command that makes this report)."""
    design = analysis.design
    runs.completed = only(runs.completed, analysis.where)
    check_metrics(runs.completed, design, dict(analysis.options).get("metric") or [])
    keys, rows = compare(runs.completed, design)
    replayed = replay_table(rows, keys, design, analysis.sequential) if analysis.sequential else []
    rounds = read_rounds([Path(d) for d in sources.get("dirs") or []])
    replayed += rounds_table(rounds)
    done = Report(design, keys, rows, len(runs.completed))
    done.pooled = datasets.pool(rows, keys, design) if design.meta else []
    done.ranked = datasets.across(rows, keys, design) if design.across else None
    out.mkdir(parents=True, exist_ok=True)
    done.written = write_outputs(out, keys, rows, design, runs, said or command(sources, analysis), plots)
    if done.pooled:
        done.written.append(write_meta(out, done.pooled, design))
    if done.ranked:
        done.written.append(write_across(out, done.ranked, design))
    if rounds:
        done.written.append(write_rounds(out, rounds))
    chosen = select_best(runs.completed, *design.select)[0] if design.select else runs.completed
    more = []
    if analysis.pruning:
        curves = pruning_summary(chosen, keys)
        more += [""] + pruning_table(curves)
        if curves:
            done.written.append(write_pruning(out, curves))
    if replayed:
        more += [""] + replayed
    if analysis.roles:
        done.roles = roles_table(role_counts(chosen, keys, design.solved), design.solved)
        more += [""] + (done.roles or ["Head roles: no run recorded any (heads.json rows without `role`)."])
    if more:
        append_text_atomic(out / "compare.md", "\n".join(more))
    recorded = {"sources": sources, "analysis": analysis_.stated(dict(analysis.options))}
    text = (json.dumps(recorded, indent=2) + "\n").encode()
    write_atomic(out / RECORD, lambda f: f.write(text))
    done.written.insert(2, out / RECORD)
    return done


def command(sources: dict, analysis: Analysis) -> list[str]:
    """The headlab-compare command that makes this report (compare.md's Command line)."""
    words = ["headlab-compare", *map(str, sources.get("dirs") or [])]
    if sources.get("wandb"):
        words += ["--wandb", sources["wandb"], *(["--group", sources["group"]] if sources.get("group") else [])]
    words += analysis_.to_flags(dict(analysis.options))
    for flag in ("out", "into", "block", "archive"):
        if sources.get(flag):
            words += [f"--{flag}", str(sources[flag])]
    return words


def _as_written(value) -> str:
    """A config value as a command line writes it: 0.03, true, null, dot."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
