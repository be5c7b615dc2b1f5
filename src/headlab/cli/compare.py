"""headlab-compare: a sweep as a table of means and 95% confidence intervals over seeds, with plots.

headlab-compare DIR [DIR ...] reads every results.json below the directories (or, with --wandb ENTITY/PROJECT
--group G, the runs of a W&B group), finds the configuration keys that vary, groups the runs by them (seeds
pooled), and writes compare.md, compare.csv and one PNG per metric into the first directory. Intervals, tests,
solve rates and the correction for many comparisons: headlab.analysis.inference.

Runs of an experiment record its pre-stated analysis (the experiment file's `compare` key): given no analysis
options, headlab-compare applies it. --into FILE puts the table into FILE's block for that experiment
(experiments/RESULTS.md), between <!-- headlab-compare: NAME --> and <!-- /headlab-compare: NAME -->.
--archive FILE.tar.xz writes the runs' records (headlab.cli.run_archive), which headlab-compare reads in place of
the directories: a table recomputes from the archive kept beside it.
"""

import argparse
import csv
import functools
import io
import json
import math
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from headlab.analysis import inference
from headlab.cli import run_archive
from headlab.training.results import PATH_SUFFIXES, RESUME_KEYS, git_sha

# keys that differ between runs without defining the experiment: where files go, and the seed itself
IGNORED_KEYS = ("seed", "data.seed", "callbacks.attention.seed", "compare", *RESUME_KEYS)
METRICS = ("test/acc", "val/acc_best", "val/acc", "test/loss", "val/loss")
IMPROVING_MARGIN = 0.005  # val/acc gained at the last validation (10 of 2,000 examples) that counts as improving
HEAD_KEY = re.compile(r"heads/L\d+/H\d+/(\w+)$")  # one head's statistic, as logged and in W&B summaries


@dataclass
class Runs:
    completed: list[dict] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (where, error)
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (where, why)


def load_dirs(dirs: list[Path]) -> Runs:
    """The runs below sweep directories (or any directories with results.json below them), results.json files,
    or run archives (headlab.cli.run_archive)."""
    runs = Runs()
    for root in dirs:
        if run_archive.is_archive(root):
            found = {where: files.get for where, files in run_archive.read(root).items()}
        else:
            files = [root] if root.name == "results.json" else sorted(root.rglob("results.json"))
            found = {str(path.parent): functools.partial(_text, path.parent) for path in files}
        if not found:
            runs.unreadable.append((str(root), "no results.json below it"))
        for where, read in found.items():
            _add_run(runs, where, read)
    return runs


def _add_run(runs: Runs, where: str, read) -> None:
    """One run's records, read(name) the text of its results.json, heads.json, metrics.csv (None if absent)."""
    text = read("results.json")
    try:
        record = json.loads(text)
        status = record["status"]
    except (TypeError, ValueError, KeyError) as error:
        why = "no results.json" if text is None else f"{type(error).__name__}: {error}"
        runs.unreadable.append((f"{where}/results.json", why))
        return
    missing = [k for k in ("config", "metrics") if not isinstance(record.get(k), dict)]
    if status == "completed" and missing:
        runs.unreadable.append((f"{where}/results.json", f"a completed record without {' or '.join(missing)}"))
    elif status == "completed":
        record["heads"] = _read_heads(read("heads.json"))
        record["curve"] = record.get("curve") or _csv_curve(read("metrics.csv"))
        record["metrics"].update(head_means(_head_scalars(record["heads"].get("rows", []))))
        runs.completed.append({**record, "where": where})
    else:
        runs.failed.append((where, record.get("error", status)))


def _text(run_dir: Path, name: str) -> str | None:
    try:
        return (run_dir / name).read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _csv_curve(text: str | None) -> list[dict]:
    """The learning curve from a CSV logger's metrics.csv, for runs whose results.json has none."""
    try:
        rows = [r for r in csv.DictReader(io.StringIO(text)) if r.get("val/acc")]
        return [{"epoch": int(r["epoch"]), "step": int(r["step"]), "val/acc": float(r["val/acc"])} for r in rows]
    except (TypeError, ValueError, KeyError):
        return []


def improving_at_end(curve: list[dict], margin: float = IMPROVING_MARGIN) -> bool:
    """Whether the last validation beat every earlier one by more than margin: training stopped while the run
    was still getting better."""
    return len(curve) > 1 and curve[-1]["val/acc"] > max(p["val/acc"] for p in curve[:-1]) + margin


def _read_heads(text: str | None) -> dict:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return {}  # no head analysis (analysis off, or a run that never got there)


def _head_scalars(rows: list[dict]) -> dict[str, float]:
    return {
        f"heads/L{r['layer']}/H{r['head']}/{k}": v for r in rows for k, v in r.items() if k not in ("layer", "head")
    }


def head_means(metrics: dict) -> dict[str, float]:
    """heads/<stat>: the mean over every head of every layer of heads/L<l>/H<h>/<stat> (entropy, score_std, ...),
    a metric like any other (--metric heads/entropy)."""
    per_stat: dict[str, list[float]] = {}
    for key, value in metrics.items():
        if (match := HEAD_KEY.match(key)) and isinstance(value, int | float) and not isinstance(value, bool):
            per_stat.setdefault(match.group(1), []).append(value)
    return {f"heads/{stat}": sum(values) / len(values) for stat, values in per_stat.items()}


def load_wandb(path: str, group: str | None) -> Runs:
    """Finished runs of a W&B project (ENTITY/PROJECT), optionally one group, through the public API."""
    import wandb

    runs = Runs()
    filters = {"group": group} if group else {}
    for run in wandb.Api(timeout=30).runs(path, filters=filters):
        summary = {k: _summary_value(v) for k, v in dict(run.summary).items()}
        summary = {k: v for k, v in summary.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        metrics = {"val/acc_best": summary.get("val/acc"), **summary, **head_means(summary)}
        record = {"config": dict(run.config), "metrics": metrics, "heads": {}}
        record["where"] = run.url
        if run.state == "finished":
            runs.completed.append(record)
        else:
            runs.failed.append((run.url, run.state))
    return runs


def _summary_value(value):
    """A W&B summary value as a number: metrics defined with summary="max" (or min, last) come back as
    {"max": ...}; media and tables stay what they are (and are left out)."""
    if isinstance(value, dict):
        return next((value[k] for k in ("max", "min", "last", "mean") if k in value), value)
    return value


def _hashable(value):
    return json.dumps(value, sort_keys=True) if isinstance(value, list | dict) else value


def varying_keys(records: list[dict]) -> list[str]:
    """Config keys whose value differs between runs, leaving out the seed and output locations."""
    keys = sorted({k for r in records for k in r["config"]})
    varying = []
    for key in keys:
        if key in IGNORED_KEYS or key.endswith(PATH_SUFFIXES):
            continue
        if len({_hashable(r["config"].get(key)) for r in records}) > 1:
            varying.append(key)
    return varying


def summarise(values: list[float]) -> dict:
    """n, mean, sample standard deviation, and the 95% percentile bootstrap interval of the mean (low, high)."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan
    low, high = inference.bootstrap_interval(values)
    return {"n": n, "mean": mean, "std": std, "low": low, "high": high}


def group_runs(records: list[dict], keys: list[str]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault(tuple(_hashable(r["config"].get(k)) for k in keys), []).append(r)
    return dict(sorted(groups.items(), key=lambda item: [(v is None, str(type(v)), v) for v in item[0]]))


@dataclass
class Design:
    """How to compare: the metrics shown; the group that every other is compared with (baseline KEY, VALUE),
    whether by Welch's or a paired test over seeds, and the keys a row must share with its baseline (within;
    default: every other varying key); what counts as solving the task (metric, threshold); and a key whose best
    value per arm is chosen on a validation metric (select KEY, ON)."""

    metrics: list[str]
    baseline: tuple[str, str] | None = None
    paired: bool = False
    solved: tuple[str, float] | None = None
    select: tuple[str, str] | None = None
    within: list[str] = field(default_factory=list)  # the keys a row shares with its baseline (default: all others)


def compare(records: list[dict], design: Design) -> tuple[list, list]:
    """One row per group: the varying keys' values, each metric summarised over seeds, params, throughput."""
    if design.select:
        records = select_best(records, *design.select)
    keys = varying_keys(records)
    if design.select and design.select[0] not in keys:
        keys.append(design.select[0])  # every arm chose the same value: still shown
    rows = []
    for values, runs in group_runs(records, keys).items():
        row = dict(zip(keys, values, strict=True))
        row["runs"] = len(runs)
        for metric in design.metrics:
            found = [(_seed(r, i), _metric(r, metric)) for i, r in enumerate(runs) if _metric(r, metric) is not None]
            if found:
                seeds, values = (list(column) for column in zip(*found, strict=True))
                row[metric] = {**summarise(values), "values": values, "seeds": seeds}
        if design.solved:
            metric, threshold = design.solved
            found = [r["metrics"][metric] for r in runs if _metric(r, metric) is not None]
            row["solved"] = inference.solve_rate(found, threshold) if found else None
        curves = [r["curve"] for r in runs if r.get("curve")]
        row["improving"] = (sum(map(improving_at_end, curves)), len(curves)) if curves else None
        row["curves"] = curves
        params = [r["params"]["total"] for r in runs if r.get("params")]
        speed = [
            r["throughput"]["train_tokens_per_s"] for r in runs if (r.get("throughput") or {}).get("train_tokens_per_s")
        ]
        row["params"] = params[0] if params else None
        row["tokens_per_s"] = sum(speed) / len(speed) if speed else None
        rows.append(row)
    if design.baseline:
        add_baseline(rows, keys, design)
    return keys, rows


def _metric(record: dict, metric: str):
    return (record.get("metrics") or {}).get(metric)


def _seed(record: dict, index: int):
    return record["config"].get("seed", index)


def select_best(records: list[dict], key: str, on: str) -> list[dict]:
    """Per arm (the groups of the other varying keys), the runs at the value of `key` whose mean `on` (a
    validation metric) is highest over seeds; the other values' runs are dropped."""
    others = [k for k in varying_keys(records) if k != key]
    if key not in {k for r in records for k in r["config"]}:
        raise SystemExit(f"headlab-compare: --select key {key!r} is not in the runs' configs")
    chosen = []
    for runs in group_runs(records, others).values():
        by_value = group_runs(runs, [key])
        scores = {v: [_metric(r, on) for r in rs if _metric(r, on) is not None] for v, rs in by_value.items()}
        best = max((v for v in scores if scores[v]), key=lambda v: sum(scores[v]) / len(scores[v]), default=None)
        chosen += by_value.get(best, [])
    return chosen


def add_baseline(rows: list[dict], keys: list[str], design: Design) -> None:
    """Difference of each group to the group with key=value and the other keys equal (a selected key may
    differ); Welch's t-test or a paired t-test over shared seeds, Fisher's exact test for solve rates, and Holm's
    correction over all the comparisons of a metric."""
    key, value = design.baseline
    if key not in keys:
        raise SystemExit(f"headlab-compare: --baseline key {key!r} does not vary; varying keys: {', '.join(keys)}")
    others = design.within or [k for k in keys if k != key and (not design.select or k != design.select[0])]
    if unknown := [k for k in design.within if k not in keys]:
        raise SystemExit(
            f"headlab-compare: --within key(s) {', '.join(unknown)} do not vary; varying: {', '.join(keys)}"
        )
    for row in rows:
        bases = [b for b in rows if str(b[key]) == value and all(b[k] == row[k] for k in others)]
        if len(bases) > 1:
            raise SystemExit(
                f"headlab-compare: {len(bases)} groups have {key}={value} and the same {', '.join(others)}: name the "
                "keys that pick one baseline per group with --within"
            )
        base = bases[0] if bases else None
        for metric in design.metrics:
            if base is None or metric not in row or metric not in base:
                continue
            a, b = row[metric], base[metric]
            if row is base:
                p = math.nan
            elif design.paired:
                pairs = [dict(zip(s["seeds"], s["values"], strict=True)) for s in (a, b)]
                p = inference.paired_p(*pairs)
            else:
                p = inference.welch_p(a["values"], b["values"])
            a.update(delta=a["mean"] - b["mean"], p_value=p, is_baseline=row is base)
        if base is not None and row.get("solved") and base.get("solved"):
            row["solved"]["p_value"] = math.nan if row is base else inference.fisher_p(row["solved"], base["solved"])
    for metric in [*design.metrics, "solved"]:
        summaries = [r[metric] for r in rows if isinstance(r.get(metric), dict) and "p_value" in r[metric]]
        for summary, adjusted in zip(summaries, inference.holm([s["p_value"] for s in summaries]), strict=True):
            summary["p_holm"] = adjusted


def _p(summary: dict) -> str:
    if math.isnan(summary.get("p_value", math.nan)):
        return ""
    return f" p={summary['p_value']:.3g}" + (f" (Holm {summary['p_holm']:.3g})" if "p_holm" in summary else "")


def _mean_interval(summary: dict) -> str:
    interval = "" if math.isnan(summary["low"]) else f" [{summary['low']:.4f}, {summary['high']:.4f}]"
    return f"{summary['mean']:.4f}{interval}"


def _cell(summary: dict | None) -> str:
    if summary is None:
        return ""
    text = _mean_interval(summary)
    if not math.isnan(summary["low"]):
        text += f" (sd {summary['std']:.4f})"
    if summary.get("is_baseline"):
        text += " (baseline)"
    elif "delta" in summary:
        text += f" Δ {summary['delta']:+.4f}" + _p(summary)
    return text


def _solved_cell(solved: dict | None) -> str:
    if solved is None:
        return ""
    return f"{solved['k']}/{solved['n']} [{solved['low']:.2f}, {solved['high']:.2f}]" + _p(solved)


def table_rows(keys: list[str], rows: list[dict], design: Design) -> tuple[list[str], list[list[str]]]:
    names = [f"{k} (selected on {design.select[1]})" if design.select and k == design.select[0] else k for k in keys]
    header = [*names, "runs", *(f"{m} (mean [95% bootstrap CI])" for m in design.metrics)]
    if design.solved:
        header.append(f"solved ({design.solved[0]} >= {design.solved[1]}; exact 95% CI)")
    header += [f"improving at end (last val/acc best by > {IMPROVING_MARGIN})", "params", "train tokens/s"]
    body = []
    for row in rows:
        speed = f"{row['tokens_per_s']:,.0f}" if row["tokens_per_s"] else ""
        cells = [*(str(row[k]) for k in keys), str(row["runs"]), *(_cell(row.get(m)) for m in design.metrics)]
        if design.solved:
            cells.append(_solved_cell(row.get("solved")))
        improving = f"{row['improving'][0]}/{row['improving'][1]}" if row["improving"] else ""
        body.append([*cells, improving, str(row["params"] or ""), speed])
    return header, body


def provenance(runs: list[dict], command: list[str]) -> list[str]:
    """Markdown lines saying how the table was made: the command, headlab's commit now, and the commits and
    hardware the runs record."""
    commits: dict[str, int] = {}
    hardware: dict[str, int] = {}
    for r in runs:
        commits[r.get("git_sha") or "unknown"] = commits.get(r.get("git_sha") or "unknown", 0) + 1
        res = r.get("resources") or {}
        name = f"{res.get('accelerator', '?')} x{res.get('devices', '?')}, {res.get('threads', '?')} threads"
        hardware[name] = hardware.get(name, 0) + 1
    return [
        f"Command: `{shlex.join(command)}`",
        f"headlab commit (compare): {git_sha() or 'unknown'}",
        "Runs' commits: " + ", ".join(f"{c} ({n} runs)" for c, n in commits.items()),
        "Runs' hardware: " + ", ".join(f"{h} ({n} runs)" for h, n in hardware.items()),
        "Intervals: 95% percentile bootstrap of the mean over seeds (10,000 resamples); solve rates: exact "
        "Clopper-Pearson; p: Welch's t-test (or paired over shared seeds with --paired), Fisher's exact test for "
        "solve rates, Holm-adjusted over the comparisons of each column.",
        "",
    ]


def write_outputs(out: Path, keys: list[str], rows: list[dict], design: Design, runs: Runs, command) -> list[Path]:
    header, body = table_rows(keys, rows, design)
    lines = provenance(runs.completed, command)
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    if runs.failed or runs.unreadable:
        lines += ["", "Left out:"] + [f"- {w}: {e}" for w, e in runs.failed + runs.unreadable]
    (out / "compare.md").write_text("\n".join(lines) + "\n")
    fields = ("mean", "std", "low", "high", "n", "p_value", "p_holm")
    with (out / "compare.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        solved = ["solved_k", "solved_n", "solved_low", "solved_high"] if design.solved else []
        writer.writerow(
            [*keys, "runs", *(f"{m}_{s}" for m in design.metrics for s in fields), *solved]
            + ["improving_k", "improving_n", "params", "tokens_per_s"]
        )
        for row in rows:
            stats_ = [row.get(m, {}).get(s, "") for m in design.metrics for s in fields]
            rate = [(row.get("solved") or {}).get(s, "") for s in ("k", "n", "low", "high")] if design.solved else []
            improving = list(row["improving"] or ("", ""))
            writer.writerow(
                [*(row[k] for k in keys), row["runs"], *stats_, *rate, *improving, row["params"], row["tokens_per_s"]]
            )
    return [
        out / "compare.md",
        out / "compare.csv",
        *plot(out, keys, rows, design.metrics),
        *plot_curves(out, keys, rows),
    ]


def plot_curves(out: Path, keys: list[str], rows: list[dict]) -> list[Path]:
    """compare_curves.png: validation accuracy at each validation, every run thin and each group's mean thick."""
    if not any(row["curves"] for row in rows):
        return []
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    for row in rows:
        if not row["curves"]:
            continue
        length = min(len(c) for c in row["curves"])
        steps = [p["step"] for p in row["curves"][0][:length]]
        for curve in row["curves"]:
            ax.plot([p["step"] for p in curve], [p["val/acc"] for p in curve], lw=0.5, alpha=0.25, color="0.5")
        mean = [sum(c[i]["val/acc"] for c in row["curves"]) / len(row["curves"]) for i in range(length)]
        label = ", ".join(f"{k.rsplit('.', 1)[-1]}={row[k]}" for k in keys) or "all runs"
        ax.plot(steps, mean, lw=2, marker="o", ms=3, label=f"{label} ({len(row['curves'])} runs)")
    ax.set_xlabel("training step")
    ax.set_ylabel("val/acc (each run; mean per group)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    path = out / "compare_curves.png"
    fig.savefig(path, dpi=120)
    return [path]


def plot(out: Path, keys: list[str], rows: list[dict], metrics: list[str]) -> list[Path]:
    """Each metric against the first numeric varying key, one line per combination of the others, 95% CI bars."""
    numeric = [k for k in keys if all(isinstance(r[k], int | float) and not isinstance(r[k], bool) for r in rows)]
    if not numeric:
        return []
    from matplotlib.figure import Figure

    x_key = numeric[0]
    series_keys = [k for k in keys if k != x_key]
    written = []
    for metric in metrics:
        if not any(metric in r for r in rows):
            continue
        fig = Figure(figsize=(6, 4), layout="constrained")
        ax = fig.subplots()
        for label, members in group_runs([{"config": r, **r} for r in rows], series_keys).items():
            members = sorted((m for m in members if metric in m), key=lambda m: m[x_key])
            xs = [m[x_key] for m in members]
            means = [m[metric]["mean"] for m in members]
            below = [0 if math.isnan(m[metric]["low"]) else m[metric]["mean"] - m[metric]["low"] for m in members]
            above = [0 if math.isnan(m[metric]["high"]) else m[metric]["high"] - m[metric]["mean"] for m in members]
            line = ax.errorbar(
                xs,
                means,
                yerr=[below, above],
                marker="o",
                capsize=3,
                label=", ".join(f"{k}={v}" for k, v in zip(series_keys, label, strict=True)) or None,
            )
            for m in members:  # every seed, so that a bimodal outcome shows as such
                ax.scatter(
                    [m[x_key]] * len(m[metric]["values"]),
                    m[metric]["values"],
                    s=10,
                    alpha=0.5,
                    color=line.lines[0].get_color(),
                )
        if all(r[x_key] > 0 for r in rows) and max(r[x_key] for r in rows) / min(r[x_key] for r in rows) >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r[x_key] for r in rows}), [str(v) for v in sorted({r[x_key] for r in rows})])
        ax.set_xlabel(x_key)
        ax.set_ylabel(f"{metric} (mean, 95% CI)")
        ax.grid(alpha=0.3)
        if series_keys:
            ax.legend(fontsize=7)
        path = out / f"compare_{metric.replace('/', '_')}.png"
        fig.savefig(path, dpi=120)
        written.append(path)
    return written


def pruning_table(records: list[dict], keys: list[str]) -> list[str]:
    """Markdown per group: accuracy after pruning each fraction of heads (heads.json), mean [95% CI] over seeds, in
    importance order and in each baseline order, with the paired difference importance - baseline and its p."""
    lines = []
    for values, runs in group_runs(records, keys).items():
        analysed = [r["heads"] for r in runs if r.get("heads", {}).get("pruning_curve")]
        if not analysed:
            continue
        curves = [{"importance": h["pruning_curve"], **h.get("pruning_baselines", {})} for h in analysed]
        orders = [o for o in curves[0] if all(o in c for c in curves)]
        baselines = orders[1:]
        title = ", ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True)) or "all runs"
        split = analysed[0].get("pruning_split", "validation")
        header = [
            "heads pruned",
            "fraction",
            *(f"{o} order" for o in orders),
            *(f"importance - {b}" for b in baselines),
        ]
        lines += [
            f"Pruning curve ({title}; {len(curves)} runs; {split} accuracy, mean [95% bootstrap CI]; "
            "differences: mean, paired t-test over runs):",
            "",
            "| " + " | ".join(header) + " |",
        ]
        lines.append("|" + "---|" * len(header))
        for step in range(min(len(c[o]) for c in curves for o in orders)):
            at = {o: [c[o][step]["metric"] for c in curves] for o in orders}
            point = curves[0]["importance"][step]
            cells = [str(point["heads_pruned"]), f"{point['fraction_pruned']:.2f}"]
            cells += [_mean_interval(summarise(at[o])) for o in orders]
            for b in baselines:
                delta = (sum(at["importance"]) - sum(at[b])) / len(curves)
                p = inference.paired_p(dict(enumerate(at["importance"])), dict(enumerate(at[b])))
                cells.append(f"{delta:+.4f}" + ("" if math.isnan(p) else f" p={p:.3g}"))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _design(parser: argparse.ArgumentParser, args) -> Design:
    def pair(text: str | None, sep: str, flag: str):
        if text is None:
            return None
        parts = text.split(sep, 1)
        if len(parts) != 2 or not all(parts):
            parser.error(f"{flag} takes KEY{sep}VALUE, got {text!r}")
        return parts[0].strip(), parts[1].strip()

    solved = pair(args.solved, ">=", "--solved")
    if solved:
        try:
            solved = (solved[0], float(solved[1]))
        except ValueError:
            parser.error(f"--solved takes METRIC>=NUMBER, got {args.solved!r}")
    baseline = pair(args.baseline, "=", "--baseline")
    select = (args.select, args.select_on) if args.select else None
    if args.within and not baseline:
        parser.error("--within needs --baseline")
    return Design(args.metric or list(METRICS[:2]), baseline, args.paired, solved, select, args.within or [])


def experiment_name(records: list[dict]) -> str:
    names = {r["config"].get("experiment") for r in records}
    if len(names) != 1 or None in names:
        raise SystemExit(f"headlab-compare: --into needs the runs of one experiment, not {sorted(map(str, names))}")
    return names.pop()


def splice(path: Path, name: str, text: str) -> None:
    """Put text between the lines <!-- headlab-compare: NAME --> and <!-- /headlab-compare: NAME --> of a
    markdown file (experiments/RESULTS.md), replacing what was there."""
    start, end = f"<!-- headlab-compare: {name} -->", f"<!-- /headlab-compare: {name} -->"
    try:
        document = path.read_text()
    except OSError as error:
        raise SystemExit(f"headlab-compare: --into {path}: {error.strerror}") from None
    if document.count(start) != 1 or document.count(end) != 1 or document.index(start) > document.index(end):
        raise SystemExit(f"headlab-compare: --into {path} needs one block from {start} to {end}")
    head, rest = document.split(start, 1)
    path.write_text(f"{head}{start}\n{text.rstrip()}\n{end}{rest.split(end, 1)[1]}")


def pre_stated(records: list[dict], args, parser: argparse.ArgumentParser) -> list[str]:
    """The headlab-compare arguments the runs' experiment states (its `compare` key), when the command line gives
    no analysis options of its own; [] otherwise."""
    analysis = ("metric", "baseline", "within", "paired", "solved", "select", "pruning")
    if any(getattr(args, a) != parser.get_default(a) for a in analysis):
        return []
    stated = {tuple(r["config"].get("compare") or ()) for r in records}
    return list(stated.pop()) if len(stated) == 1 else []


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="headlab-compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="*", type=Path, help="sweep directories, or any directories with results.json")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="read runs from W&B instead of directories")
    parser.add_argument("--group", help="with --wandb: the W&B group (sweep or experiment)")
    parser.add_argument("--metric", action="append", help=f"metrics to show (default: {', '.join(METRICS[:2])})")
    parser.add_argument("--baseline", metavar="KEY=VALUE", help="add each group's difference to this group")
    parser.add_argument(
        "--within", metavar="KEY", action="append", help="with --baseline: compare only with the baseline of equal KEY"
    )
    parser.add_argument("--paired", action="store_true", help="with --baseline: paired t-test over shared seeds")
    parser.add_argument("--solved", metavar="METRIC>=X", help="solve rate per group with its exact interval")
    parser.add_argument("--select", metavar="KEY", help="per arm, keep the value of KEY best on --select-on")
    parser.add_argument("--select-on", default="val/acc_best", help="validation metric for --select")
    parser.add_argument("--out", type=Path, help="where to write (default: the first directory)")
    parser.add_argument("--pruning", action="store_true", help="add the pruning curves of heads.json per group")
    parser.add_argument("--into", type=Path, metavar="FILE", help="also put compare.md into FILE's experiment block")
    parser.add_argument(
        "--archive", type=Path, metavar="FILE.tar.xz", help="also archive the runs' records, which this reads as a DIR"
    )
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if not args.dirs and not args.wandb:
        parser.error("give sweep directories or --wandb ENTITY/PROJECT")
    if args.archive and (args.wandb or not all(d.is_dir() for d in args.dirs)):
        parser.error("--archive archives sweep directories: give directories only")
    design = _design(parser, args)  # bad options fail before any run is read
    runs = load_wandb(args.wandb, args.group) if args.wandb else load_dirs(args.dirs)
    for where, why in runs.unreadable:
        print(f"headlab-compare: skipped {where}: {why}", file=sys.stderr)
    for where, error in runs.failed:
        print(f"headlab-compare: failed run {where}: {error}", file=sys.stderr)
    if not runs.completed:
        raise SystemExit("headlab-compare: no completed runs to compare")
    if stated := pre_stated(runs.completed, args, parser):
        print(f"headlab-compare: the experiment's pre-stated analysis: {shlex.join(stated)}", file=sys.stderr)
        argv = [*argv, *stated]
        args = parser.parse_args(argv)
        design = _design(parser, args)
    keys, rows = compare(runs.completed, design)
    out = args.out or (args.dirs[0] if args.dirs and args.dirs[0].is_dir() else Path.cwd())
    out.mkdir(parents=True, exist_ok=True)
    written = write_outputs(out, keys, rows, design, runs, ["headlab-compare", *argv])
    if args.pruning:
        chosen = select_best(runs.completed, *design.select) if design.select else runs.completed
        with (out / "compare.md").open("a") as f:
            f.write("\n" + "\n".join(pruning_table(chosen, keys)))
    if args.archive:
        written.append(args.archive)
        print(f"archived {run_archive.write(args.archive, args.dirs)} runs' records", file=sys.stderr)
    if args.into:
        splice(args.into, experiment_name(runs.completed), (out / "compare.md").read_text())

    from rich.console import Console
    from rich.table import Table

    header, body = table_rows(keys, rows, design)
    table = Table(title=f"{len(runs.completed)} runs, grouped by {', '.join(keys) or 'nothing (all alike)'}")
    for column in header:
        table.add_column(column)
    for row in body:
        table.add_row(*row)
    Console(width=max(Console().width, 160)).print(table)
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)


if __name__ == "__main__":
    main()
