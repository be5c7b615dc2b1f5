"""headlab-compare's readings over several datasets, rendered from headlab.stats.datasets: each contrast pooled
over the datasets (--meta: a table below compare.md's, and compare_meta.csv) and settings ranked across them
(--across: the same, and compare_across.csv)."""

import csv
import io
import math
from pathlib import Path

from headlab.escape import csv_cell, markdown_cell
from headlab.files import append_text_atomic, write_text_atomic
from headlab.stats import power
from headlab.stats.contrasts import Design
from headlab.stats.datasets import leave_one_out
from headlab.stats.power import ALPHA

FEWEST_TO_SHOW_NONE = 3  # datasets a pooled "no difference found" needs unless each alone shows none


def meta_verdict(result: dict, effect: float | None) -> str:
    """A pooled contrast: significant (Holm p < 0.05); else, given the smallest effect that matters, no difference
    found where the whole interval lies within it, the pooled test had power 0.5 or more there (the rule of every
    other contrast), and either FEWEST_TO_SHOW_NONE datasets were pooled or each dataset alone found no difference
    (two nearly agreeing estimates give a tau² of 0 and a spread that says little); inconclusive where not; without
    a margin, not significant."""
    if math.isnan(result["p_holm"]):
        return "too few datasets"
    if result["p_holm"] < ALPHA:
        return "significant"
    if effect is None:
        return "not significant"
    within = -effect < result["low"] and result["high"] < effect
    powered = power.pooled_power(effect, result["se"], result["k"]) >= 0.5
    each = result["k"] >= FEWEST_TO_SHOW_NONE or all(
        v == "no difference found" for v in result.get("verdicts", {}).values()
    )
    return "no difference found" if within and powered and each else "inconclusive"


def meta_table(pooled: list[dict], design: Design) -> list[str]:
    """Markdown: each arm's contrast pooled over the values of design.meta (comparison.pool)."""
    key = design.meta
    at = (
        f"; no difference found: not significant, the interval within ±{design.effect}, the pooled test's power "
        f"there 0.5 or more, and {FEWEST_TO_SHOW_NONE} or more values pooled or each value alone finding none; "
        "else inconclusive"
        if design.effect
        else ""
    )
    lines = [
        f"Pooled over the values of {key} (a random-effects meta-analysis of k values: each value's difference "
        "weighted by its standard error (Welch's, paired over seeds, or corrected over folds) and the between-value "
        "variance tau² (DerSimonian-Laird); the mean's 95% interval and t-test by Hartung-Knapp-Sidik-Jonkman on "
        "k - 1 df, its variance never below DerSimonian-Laird's (the usual truncation), Holm-adjusted over the arms "
        f"of a metric{at}; I² and Cochran's Q for heterogeneity; the 95% prediction interval for a new value on "
        "k - 2 df; log-scale metrics: differences of logs):",
        "",
        f"| arm | metric | k | pooled Δ [95% CI] | p (Holm) | tau | I² | Q (p) | 95% prediction interval | "
        f"per {key}: Δ (se) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    number = lambda v: "" if math.isnan(v) else f"{v:+.4f}"  # noqa: E731
    for r in pooled:
        arm = ", ".join(f"{k}={v}" for k, v in r["arm"].items()) or "all"
        each = "; ".join(f"{d} {e:+.4f} ({se:.4f})" for d, (e, se) in r["datasets"].items())
        each += "".join(f"; {d} left out (no standard error: one run or fold, or all alike)" for d in r["left_out"])
        interval = f"[{number(r['low'])}, {number(r['high'])}]" if not math.isnan(r["low"]) else ""
        predicted = f"[{number(r['pred_low'])}, {number(r['pred_high'])}]" if not math.isnan(r["pred_low"]) else ""
        p = (
            ""
            if math.isnan(r["p_value"])
            else f"{r['p_value']:.3g} ({r['p_holm']:.3g}) {meta_verdict(r, design.effect)}"
        )
        heterogeneity = "" if math.isnan(r["q"]) else f"{r['q']:.2f} ({r['q_p']:.3g})"
        tau = "" if math.isnan(r["tau2"]) else f"{math.sqrt(r['tau2']):.4f}"
        i2 = "" if math.isnan(r["i2"]) else f"{100 * r['i2']:.0f}%"
        cells = [arm, r["metric"], str(r["k"]), f"{number(r['effect'])} {interval}", p, tau, i2, heterogeneity]
        lines.append("| " + " | ".join([*cells, predicted, each]) + " |")
    return [*lines, ""]


def write_meta(out: Path, pooled: list[dict], design: Design) -> Path:
    """The pooled table appended to compare.md, and compare_meta.csv (one row per arm and metric)."""
    append_text_atomic(out / "compare.md", "\n" + "\n".join(meta_table(pooled, design)))
    fields = (
        "k",
        "effect",
        "se",
        "low",
        "high",
        "p_value",
        "p_holm",
        "tau2",
        "i2",
        "q",
        "q_p",
        "pred_low",
        "pred_high",
    )
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    arm_keys = list(pooled[0]["arm"])
    writer.writerow([*arm_keys, "metric", *fields, "verdict", "datasets"])
    for r in pooled:
        each = ";".join(f"{d}={e!r}:{se!r}" for d, (e, se) in r["datasets"].items())
        verdict = meta_verdict(r, design.effect)
        writer.writerow([*r["arm"].values(), r["metric"], *(r[k] for k in fields), verdict, each])
    write_text_atomic(out / "compare_meta.csv", table.getvalue())
    return out / "compare_meta.csv"


def across_table(ranked: dict, design: Design) -> list[str]:
    """Markdown: each setting's mean per dataset and its gap to that dataset's best, its worst gap and mean rank,
    for every metric (datasets.across); the setting chosen on the first metric is marked."""
    key, first, datasets = design.across, ranked["metric"], ranked["datasets"]
    chosen = ranked["chosen"]
    lines = [
        f"Settings across the values of {key} (k = {len(datasets)}): each setting's mean per {key} value (its "
        f"interval) and its gap to that value's best setting, the one best on {first}, in the same metric (0: that "
        "setting; lower is better for a loss; below 0 where a setting beats it on a metric it was not chosen on), "
        "with the gap's 95% t interval (corrected over folds where the data cross-validates; otherwise "
        f"{'paired over shared seeds' if design.over_shared_seeds else 'Welch'}); "
        f"worst: the largest gap; rank: the mean rank (1: the best mean). Chosen on {first}: the setting, run on every "
        "value, with the smallest worst gap (ties: the better rank); the other metrics are read at it. Choose on "
        "validation and read test: gaps on the metric a best was chosen on flatter it."
        + (
            f" Target: within {design.effect} of a dataset's best, met where the gap's interval ends at most "
            f"{design.effect} above 0, missed where the gap exceeds {design.effect}, inconclusive between."
            if design.effect is not None
            else ""
        ),
        "",
    ]
    reach = [f"target (gap ≤ {design.effect})"] if design.effect is not None else []
    for metric in design.metrics:
        lines += [
            f"| setting ({metric}) | worst gap | mean rank | " + " | ".join([*reach, *map(str, datasets)]) + " |",
            "|" + "---|" * (3 + len(reach) + len(datasets)),
        ]
        for index, s in enumerate(ranked["settings"]):
            entry = s.get(metric)
            if not entry:
                continue
            name = _setting_name(s["setting"])
            mark = " **(chosen)**" if index == chosen else ""
            cells = [f"{name}{mark}", _number(entry["worst"]), _number(entry["rank"], ".2f")]
            if reach:
                cells.append(_targets(entry.get("targets", {}), len(datasets)))
            for d in datasets:
                if d not in entry["means"]:
                    cells.append("not run")
                    continue
                low, high = entry["intervals"][d]
                interval = "" if math.isnan(low) else f" [{low:.4f}, {high:.4f}]"
                g_low, g_high = entry["gap_intervals"][d]
                g_interval = "" if math.isnan(g_low) else f" [{g_low:+.4f}, {g_high:+.4f}]"
                cells.append(f"{entry['means'][d]:.4f}{interval} (gap {entry['gaps'][d]:.4f}{g_interval})")
            lines.append("| " + " | ".join(cells) + " |")
        if metric != first:
            lines += _selection_misses(ranked["settings"], metric, first, datasets, targets=bool(reach))
        lines.append("")
    if chosen is None:
        lines.append(f"No setting was run on every value of {key}: none is chosen.")
    return lines


def _selection_misses(settings: list[dict], metric: str, first: str, datasets: list, targets: bool) -> list[str]:
    """Where the setting best on `first` is beaten on `metric` beyond doubt (a gap's whole interval below 0), a line
    per dataset naming the setting that beats it most: there a gap of 0 or below measures against a setting that
    is not the best on `metric` (and a target met there is met against it)."""
    lines = []
    for d in datasets:
        beaten = [
            (entry["gaps"][d], entry["gap_intervals"][d], s["setting"])
            for s in settings
            if (entry := s.get(metric)) and d in entry["gaps"] and entry["gap_intervals"][d][1] < 0
        ]
        if beaten:
            gap, (low, high), setting = min(beaten, key=lambda b: b[0])
            more = f" (and {len(beaten) - 1} more settings)" if len(beaten) > 1 else ""
            lines.append(
                f"- {d}: {_setting_name(setting)} beats the setting best on {first} by {-gap:.4f} "
                f"[{-high:.4f}, {-low:.4f}]{more}: on {d} the gaps measure against a setting that is not the best "
                f"on {metric}" + (", and a target met there is met against it." if targets else ".")
            )
    return ["", f"Where {first} and {metric} disagree (a gap's whole interval below 0):", *lines] if lines else []


def _targets(targets: dict, k: int) -> str:
    """A setting's target over the datasets: met on how many, and which it missed or left inconclusive."""
    said = [f"met on {sum(t == 'met' for t in targets.values())} of {k}"]
    for verdict in ("missed", "inconclusive"):
        if names := [str(d) for d, t in targets.items() if t == verdict]:
            said.append(f"{verdict}: {', '.join(names)}")
    return "; ".join(said)


def write_across(out: Path, ranked: dict, design: Design) -> Path:
    """The ranking appended to compare.md, and compare_across.csv (one row per setting, metric and dataset); with
    three datasets or more, each held out of the choice (loo_table, compare_loo.csv)."""
    held_out = leave_one_out(ranked)
    tables = across_table(ranked, design) + (["", *loo_table(ranked, held_out, design)] if held_out else [])
    append_text_atomic(out / "compare.md", "\n" + "\n".join(tables) + "\n")
    if held_out:
        write_loo(out, ranked, held_out, design)
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    names = list(ranked["settings"][0]["setting"]) if ranked["settings"] else []
    head = ["mean", "low", "high", "gap", "gap_low", "gap_high", "target", "worst", "rank", "chosen"]
    writer.writerow([*names, "metric", design.across, *head])
    for index, s in enumerate(ranked["settings"]):
        for metric in design.metrics:
            entry = s.get(metric) or {"means": {}}
            for d, mean in entry["means"].items():
                low, high = entry["intervals"][d]
                gap = [entry["gaps"][d], *entry["gap_intervals"][d], entry.get("targets", {}).get(d, "")]
                row = [mean, low, high, *gap, entry["worst"], entry["rank"], index == ranked["chosen"]]
                writer.writerow([*s["setting"].values(), metric, d, *row])
    write_text_atomic(out / "compare_across.csv", table.getvalue())
    return out / "compare_across.csv"


def loo_table(ranked: dict, held_out: list[dict], design: Design) -> list[str]:
    """Markdown: each dataset held out of the choice, the setting chosen on the others, and per metric its mean on
    the held-out dataset against the choice made with every dataset (in sample) and the dataset's own best."""
    key, first = design.across, ranked["metric"]
    lines = [
        f"Leave one {key} value out: the choice above made without it (the smallest worst gap on {first} over the "
        f"other values), read on it; beside it the choice made with every value (in sample) and that value's own "
        "best. Defaults that transfer read as well held out as in sample.",
        "",
        "| held out | chosen without it | "
        + " | ".join(f"{m}: held out (gap) / in sample / its best" for m in design.metrics)
        + " |",
        "|" + "---|" * (2 + len(design.metrics)),
    ]
    for row in held_out:
        cells = [
            markdown_cell(row["dataset"]),
            markdown_cell(_setting_name(ranked["settings"][row["chosen"]]["setting"])),
        ]
        for metric in design.metrics:
            m = row.get(metric, {})
            cells.append(
                f"{_number(m.get('held_out', math.nan))} ({_number(m.get('gap', math.nan))}) / "
                f"{_number(m.get('in_sample', math.nan))} / {_number(m.get('best', math.nan))}"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_loo(out: Path, ranked: dict, held_out: list[dict], design: Design) -> Path:
    """compare_loo.csv: one row per held-out dataset and metric."""
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    names = list(ranked["settings"][0]["setting"])
    writer.writerow(["held_out", *names, "metric", "mean", "gap", "in_sample", "best"])
    for row in held_out:
        setting = ranked["settings"][row["chosen"]]["setting"]
        for metric in design.metrics:
            m = row.get(metric, {})
            values = [m.get(k, math.nan) for k in ("held_out", "gap", "in_sample", "best")]
            writer.writerow([csv_cell(row["dataset"]), *(csv_cell(setting[k]) for k in names), metric, *values])
    write_text_atomic(out / "compare_loo.csv", table.getvalue())
    return out / "compare_loo.csv"


def _setting_name(setting: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in setting.items()) or "all"


def _number(value: float, spec: str = ".4f") -> str:
    return "" if math.isnan(value) else format(value, spec)
