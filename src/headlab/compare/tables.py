"""headlab-compare's outputs: the table (markdown, CSV, the console) and its provenance, rendered
from what headlab.stats.comparison computed."""

import csv
import io
import math
import shlex
from pathlib import Path

from headlab import printing
from headlab.compare.figures import plot, plot_curves
from headlab.conventions import released_name
from headlab.escape import csv_cell, markdown_cell
from headlab.files import write_atomic
from headlab.printing import Column
from headlab.record import git_sha
from headlab.stats import inference
from headlab.stats.comparison import IMPROVING_MARGIN
from headlab.stats.contrasts import Design, difference_interval
from headlab.stats.datasets import setting_keys
from headlab.stats.runs import Runs, mixed_data


def _p(summary: dict) -> str:
    if math.isnan(summary.get("p_value", math.nan)):
        return ""
    text = f" p={summary['p_value']:.3g}" + (f" (Holm {summary['p_holm']:.3g})" if "p_holm" in summary else "")
    if summary.get("verdict"):
        text += f" {summary['verdict']}" + (f" {AT_BUDGET}" if summary.get("at_budget") else "")
        said = _could_detect(summary)
        if "seeds_for_power" in summary:
            needed = summary["seeds_for_power"]
            said.append(f"80% needs {needed if needed else 'more than 10,000'} seeds an arm")
        text += f" ({'; '.join(said)})" if said else ""
    return text


AT_BUDGET = "at this budget"  # beside a verdict whose contrast has a run still improving when training ended
BUDGET_LEGEND = (
    f'"{AT_BUDGET}": a run of either arm was still improving at its last validation (its arm reads "not '
    'converged"), so the contrast says what these epochs bought, not what the arms reach.'
)


def _could_detect(summary: dict) -> list[str]:
    """What the test could detect: its power at the stated margin, else the smallest difference it had 80% power
    to detect (a solve rate's power, at the observed rates, only plans its seeds)."""
    if not math.isnan(summary.get("detectable", math.nan)):
        return [f"detects ±{summary['detectable']:.4f} at 80%"]
    if "power_effect" not in summary or math.isnan(summary["power"]):
        return []
    return [f"power {summary['power']:.2f} at ±{summary['power_effect']:g}"]


def mean_interval(summary: dict) -> str:
    interval = "" if math.isnan(summary["low"]) else f" [{summary['low']:.4f}, {summary['high']:.4f}]"
    return f"{summary['mean']:.4f}{interval}"


def _cell(summary: dict | None, design: Design) -> str:
    if summary is None:
        return ""
    text = mean_interval(summary)
    if not math.isnan(summary["low"]):
        text += f" (sd of logs {summary['std']:.4f})" if summary.get("log") else f" (sd {summary['std']:.4f})"
    if summary.get("is_baseline"):
        text += " (baseline)"
    elif "delta" in summary:
        shown = {k: v for k, v in summary.items() if design.power or k != "seeds_for_power"}
        ratio = f" (x{summary['ratio']:.3f})" if "ratio" in summary else ""
        text += f" Δ {summary['delta']:+.4f}{ratio}" + _p(shown)
    return text


def _reach_cell(reach: dict | None) -> str:
    """Median steps to the threshold [95% CI], or "> budget" where fewer than half the runs reached it."""
    if reach is None:
        return ""
    bound = lambda v: "?" if v is None else f"{v:,}"  # noqa: E731 (?: a bound the runs cannot close)
    median = f"> {reach['budget']:,}" if reach["median"] is None else f"{reach['median']:,}"
    return f"{median} [{bound(reach['low'])}, {bound(reach['high'])}] {reach['k']}/{reach['n']} reached" + _p(reach)


def _improving(improving: tuple[int, int] | None) -> str:
    """How many runs were still improving when training ended, and the arm's verdict."""
    if not improving:
        return ""
    return f"{improving[0]}/{improving[1]} improving: " + ("not converged" if improving[0] else "converged")


def _key_cell(row: dict, key: str, design: Design) -> str:
    """A key's value; a selected value at an edge of its grid says its optimum is not bracketed."""
    edge = row.get("select_grid") if design.select and key == design.select[0] else None
    if not edge:
        return str(row[key])
    return f"{row[key]} (edge of its grid {edge[1][0]}..{edge[1][-1]}: not bracketed)"


def _solved_cell(solved: dict | None) -> str:
    if solved is None:
        return ""
    paired = (
        f" OR {solved['odds_ratio']:.3g} ({solved['only_a']}:{solved['only_b']} seeds)" if "pairs" in solved else ""
    )
    return f"{solved['k']}/{solved['n']} [{solved['low']:.2f}, {solved['high']:.2f}]{paired}" + _p(solved)


def table_rows(keys: list[str], rows: list[dict], design: Design) -> tuple[list[str], list[list[str]]]:
    names = [f"{k} (selected on {design.select[1]})" if design.select and k == design.select[0] else k for k in keys]
    folds = any("folds" in (row.get(m) or {}) for row in rows for m in design.metrics)
    interval = "mean over folds [95% corrected t CI]" if folds else "mean [95% bootstrap CI]"
    geometric = "geometric mean [95% bootstrap CI]"
    header = [*names, "runs", *(f"{m} ({geometric if m in design.log else interval})" for m in design.metrics)]
    if design.solved:
        header.append(f"solved ({design.solved[0]} >= {design.solved[1]}; exact 95% CI)")
    if design.reach:
        header.append(f"steps to {''.join(map(str, design.reach))} (Kaplan-Meier median [95% CI]; reached)")
    header += [f"improving at end (last val/acc best by > {IMPROVING_MARGIN})", "params", "FLOPs/token"]
    header.append("train FLOPs (mean)")
    header.append("train tokens/s")
    body = []
    for row in rows:
        speed = f"{row['tokens_per_s']:,.0f}" if row["tokens_per_s"] else ""
        cells = [*(markdown_cell(_key_cell(row, k, design)) for k in keys), str(row["runs"])]
        cells += [_cell(row.get(m), design) for m in design.metrics]
        if design.solved:
            cells.append(_solved_cell(row.get("solved")))
        if design.reach:
            cells.append(_reach_cell(row.get("reach")))
        flops = f"{row['flops_per_token']:,}" if row.get("flops_per_token") else ""
        total = f"{row['train_flops']:.3g}" if row.get("train_flops") else ""
        body.append([*cells, _improving(row["improving"]), str(row["params"] or ""), flops, total, speed])
    # the run's descriptive columns (improving at end .. tokens/s) are left out where no run has them
    shown = [i for i in range(len(header)) if i < len(header) - 5 or any(cells[i] for cells in body)]
    return [header[i] for i in shown], [[cells[i] for i in shown] for cells in body]


def dataset_keys(keys: list[str], rows: list[dict], design: Design) -> tuple[list[str], dict]:
    """Over datasets (--across or --meta): the keys that name a group (the dataset, what varies within it, a key
    chosen per arm by --select) and {dataset: {key: value}} of the keys that only follow it (its files, folds, text
    column; None left out). Otherwise all keys and {}."""
    dataset = design.dataset
    if dataset not in keys:
        return keys, {}
    named = {dataset, *setting_keys(rows, keys, dataset, design), *(design.select or ())[:1]}
    follows = {}
    for row in rows:
        values = {k: row[k] for k in keys if k not in named and row[k] is not None}
        follows.setdefault(str(row[dataset]), values)
    return [k for k in keys if k in named], follows


def follows_lines(follows: dict, design: Design) -> list[str]:
    """compare.md's legend of the keys that only follow the dataset: a line per dataset (none where no key does)."""
    if not any(follows.values()):
        return []
    head = f"Keys that follow {design.dataset} (one value per dataset; compare.csv has them as columns):"
    items = (", ".join(f"{k}={released_name(v)}" for k, v in values.items()) or "none" for values in follows.values())
    return [head, *(markdown_cell(f"- {name}: {item}") for name, item in zip(follows, items, strict=True)), ""]


def print_table(keys: list[str], rows: list[dict], design: Design, n_runs: int) -> None:
    """The table as compare.md has it: on a terminal fitted to the screen (keys by their last part, n_heads; the
    other columns as narrow as their longest word, the metrics' columns sharing the rest; never cut), in a pipe
    or a file whole (headlab.printing)."""
    keys, _ = dataset_keys(keys, rows, design)
    header, body = table_rows(keys, rows, design)
    title = f"{n_runs} runs, grouped by {', '.join(keys) or 'nothing (all alike)'} (compare.md: the legend)"
    columns = []
    for i, column in enumerate(header):
        if i < len(keys):  # model.attention.n_heads (selected on ...) -> n_heads (selected on ...)
            name, _, rest = column.partition(" ")
            column = " ".join((name.rsplit(".", 1)[-1], rest)).strip()
        metric = any(column.startswith(f"{m} (") for m in design.metrics)
        columns.append(Column(column, "fold" if metric else "word"))
    printing.print_table(title, columns, body, width=160)


_CROSS_VALIDATED = (
    "Cross-validated runs: each fold's value is the mean over its seeds; the interval is Student's t over folds with "
    "Nadeau & Bengio's corrected variance (1/folds + 1/(k-1)) for overlapping training sets (an accuracy's clipped "
    "to [0, 1], which the t interval does not know), and p its paired test over the shared folds."
)


def legend() -> list[str]:
    """The legend a file holding several tables states once (blocks.LEGEND: their blocks leave it out): every
    variant of _verdicts' paragraph, and the cross-validated runs' intervals."""
    return [
        "Verdicts: significant (Holm p < 0.05); with a margin (--effect in the table's Command line), no difference "
        "found where not and the difference's 95% interval lies within ±margin with the test's power there 0.5 or "
        "more, else inconclusive; without one, not significant (no difference can be shown absent), beside it the "
        "smallest difference the test had 80% power to detect. " + _POWER,
        _CROSS_VALIDATED,
    ]


_POWER = (
    "Power: the t-test's (noncentral t), for rank and permutation tests too, over folds the corrected test's (its "
    "corrected variance); test/acc over seeds and test examples (--test examples): the normal approximation at the "
    "two-way bootstrap's standard error, its interval the bootstrap's. Power at the observed difference is never "
    "given (a function of p: Hoenig & Heisey 2001); it only plans a new sweep's seeds (--power; solve rates: "
    "Fisher's, simulated, paired over seeds exact McNemar's). Converged: no run of the arm improved val/acc at its "
    "last validation."
)


def _verdicts(design: Design) -> str:
    x = design.effect
    if x is None:
        return (
            "Verdicts: significant (Holm p < 0.05); not significant (not: without a margin, --effect, no difference "
            f"can be shown absent), beside it the smallest difference the test had 80% power to detect; "
            f"{BUDGET_LEGEND} {_POWER}"
        )
    return (
        f"Verdicts: significant (Holm p < 0.05); no difference found (not, the difference's 95% interval within ±{x} "
        f"and the test's power at ±{x} 0.5 or more); inconclusive (neither); {BUDGET_LEGEND} {_POWER}"
    )


def packing(runs: list[dict]) -> str | None:
    """A line saying that train tokens/s does not compare the runs' speed, where they trained in packs of different
    sizes (a member's rate is its share of its pack's); None where all trained alike (alone counts as a pack of 1)."""
    sizes: dict[int, int] = {}
    for r in runs:
        if (r.get("throughput") or {}).get("train_tokens_per_s"):
            size = (r.get("pack") or {}).get("size") or 1
            sizes[size] = sizes.get(size, 0) + 1
    if len(sizes) < 2:
        return None
    said = ", ".join(f"{size} ({n} run{'s' if n > 1 else ''})" for size, n in sorted(sizes.items()))
    return (
        f"Speed: these runs trained in packs of {said}, and a run's train tokens/s is its share of its pack's rate: "
        "the column does not compare the arms' speed (headlab-bench does)."
    )


def provenance(runs: list[dict], command: list[str], design: Design) -> list[str]:
    """Markdown lines saying how the table was made: the command, headlab's commit now, the commits and hardware
    the runs record, and which statistics made each interval, p-value and verdict."""
    commits: dict[str, int] = {}
    hardware: dict[str, int] = {}
    for r in runs:
        commits[r.get("git_sha") or "unknown"] = commits.get(r.get("git_sha") or "unknown", 0) + 1
        res = r.get("resources") or {}
        name = f"{res.get('accelerator', '?')} x{res.get('devices', '?')}, {res.get('threads', '?')} threads"
        hardware[name] = hardware.get(name, 0) + 1
    folds = any(r["config"].get("data.cv.fold") is not None for r in runs)
    intervals = (
        "Student's t over folds with the corrected variance (Cross-validated runs, below)"
        if folds
        else "95% percentile bootstrap of the mean over seeds (10,000 resamples)"
    )
    return [
        f"Command: `{shlex.join(command)}`",
        f"headlab commit (compare): {git_sha() or 'unknown'}",
        "Runs' commits: " + ", ".join(f"{c} ({n} runs)" for c, n in commits.items()),
        "Runs' hardware: " + ", ".join(f"{h} ({n} runs)" for h, n in hardware.items()),
        f"Intervals: {intervals}; solve rates: exact Clopper-Pearson; p: "
        f"{'the corrected paired t over folds' if folds else design.test_name}, {design.solve_test_name}, "
        f"Holm-adjusted over the comparisons of each column{f' and value of {design.meta}' if design.meta else ''}.",
        *([_verdicts(design)] if design.baseline else []),
        *(
            [f"On the log scale (geometric means; tests on the logs; x: the ratio): {', '.join(design.log)}."]
            if design.log
            else []
        ),
        *([_CROSS_VALIDATED] if folds else []),
        *([speed] if (speed := packing(runs)) else []),
        *(
            [
                "**Mixed data**: runs of one data config read different files, so these numbers are not of one "
                f"dataset: {'; '.join(mixed)}."
            ]
            if (mixed := mixed_data(runs))
            else []
        ),
        "",
    ]


def few_replicates(keys: list[str], rows: list[dict], design: Design) -> str | None:
    """A warning where an arm has fewer than inference.FEW_REPLICATES seeds (or folds) of a metric: a standard
    deviation from so few may be off by a large factor, and every interval and p-value made from it with it."""
    counts = {}
    for row in rows:
        n = min((row[m]["n"] for m in design.metrics if isinstance(row.get(m), dict) and "n" in row[m]), default=None)
        if n is not None and 1 < n < inference.FEW_REPLICATES:
            counts[", ".join(f"{k}={row.get(k)}" for k in keys) or "all runs"] = n
    if not counts:
        return None
    fewest = min(counts.values())
    low, high = inference.sd_interval_factors(fewest)
    what = "folds" if any("folds" in (row.get(m) or {}) for row in rows for m in design.metrics) else "seeds"
    arms = "; ".join(f"{arm} ({n})" for arm, n in counts.items())
    return (
        f"**Few replicates**: {len(counts)} arm(s) have fewer than {inference.FEW_REPLICATES} {what} of a metric: "
        f"{arms}. A standard deviation from {fewest} values may be {low:.2f} to {high:.1f} times the true one (95%), "
        "and so may every interval, p-value and verdict made from it: read them as rough, and run more."
    )


def write_outputs(
    out: Path, keys: list[str], rows: list[dict], design: Design, runs: Runs, command, plots: bool = True
) -> list[Path]:
    shown, follows = dataset_keys(keys, rows, design)
    header, body = table_rows(shown, rows, design)
    lines = provenance(runs.completed, command, design) + follows_lines(follows, design)
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    if few := few_replicates(shown, rows, design):
        lines += ["", few]
    if runs.failed or runs.unreadable:
        lines += ["", "Left out:"] + [
            f"- {markdown_cell(w)}: {markdown_cell(e)}" for w, e in runs.failed + runs.unreadable
        ]
    table = ("\n".join(lines) + "\n").encode()
    write_atomic(out / "compare.md", lambda f: f.write(table))
    write_atomic(out / "compare.csv", lambda f: f.write(_csv(keys, rows, design).encode()))
    figures = [*plot(out, keys, rows, design), *plot_curves(out, keys, rows, design)] if plots else []
    return [out / "compare.md", out / "compare.csv", *figures]


def _csv(keys: list[str], rows: list[dict], design: Design) -> str:
    """compare.csv's text: a row per group, every statistic of every metric in its own column."""
    fields = (
        "mean", "std", "low", "high", "n", "p_value", "p_holm", "effect", "effect_low", "effect_high", "verdict",
        "power", "detectable", "budget",
    )  # fmt: skip
    rate_fields = ("k", "n", "low", "high", "p_value", "p_holm", "verdict", "budget")
    with io.StringIO(newline="") as f:
        writer = csv.writer(f)
        solved = [f"solved_{s}" for s in rate_fields] if design.solved else []
        writer.writerow(
            [*keys, "runs", *(f"{m}_{s}" for m in design.metrics for s in fields), *solved]
            + ["improving_k", "improving_n", "params", "flops_per_token", "train_flops", "tokens_per_s"]
        )
        for row in rows:
            stats_ = [_as_csv(row.get(m, {})).get(s, "") for m in design.metrics for s in fields]
            rate = [_as_csv(row.get("solved") or {}).get(s, "") for s in rate_fields] if design.solved else []
            improving = list(row["improving"] or ("", ""))
            writer.writerow(
                [*(csv_cell(row[k]) for k in keys), row["runs"], *stats_, *rate, *improving, row["params"]]
                + [row.get("flops_per_token"), row.get("train_flops"), row["tokens_per_s"]]
            )
        return f.getvalue()


def _as_csv(summary: dict) -> dict:
    """A metric's summary as compare.csv gives it: with its difference to the baseline's 95% interval (effect_low,
    effect_high: on the test's scale, logs with --log), and `budget` (AT_BUDGET or empty)."""
    budget = {"budget": AT_BUDGET if summary.get("at_budget") else ""}
    if "se" not in summary:
        return {**summary, **budget}
    low, high = difference_interval(summary)
    return {**summary, "effect_low": low, "effect_high": high, **budget}
