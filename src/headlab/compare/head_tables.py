"""headlab-compare's tables of what heads do over runs: pruning curves by order with what they say, and head roles."""

import csv
import io
import math
from pathlib import Path

from headlab.compare.tables import mean_interval
from headlab.escape import csv_cell, markdown_cell
from headlab.files import write_text_atomic
from headlab.heads.causal import ROLES_BEYOND_FETCHING

PRUNING_CSV = "compare_pruning.csv"  # one row a group, step and baseline order (the findings table reads it)


def pruning_table(summary: list[dict]) -> list[str]:
    """Markdown per group of comparison.pruning_summary: accuracy after pruning each fraction of heads, mean [95%
    CI] over runs, in importance order and each baseline order, with the paired difference importance - baseline."""
    lines = []
    for group in summary:
        title = markdown_cell(", ".join(f"{k}={v}" for k, v in group["group"].items()) or "all runs")
        orders, baselines = group["orders"], group["orders"][1:]
        header = [
            "heads pruned",
            "fraction",
            *(markdown_cell(f"{o} order") for o in orders),
            *(markdown_cell(f"importance - {b}") for b in baselines),
        ]
        lines += [
            f"Pruning curve ({title}; {group['runs']} runs; {group['split']} accuracy, mean [95% bootstrap CI]; "
            "differences: mean, paired t-test over runs):",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
        ]
        for step in group["steps"]:
            cells = [str(step["heads_pruned"]), f"{step['fraction']:.2f}"]
            cells += [mean_interval(step["orders"][o]) for o in orders]
            for b in baselines:
                d = step["differences"][b]
                cells.append(f"{d['delta']:+.4f}" + ("" if math.isnan(d["p"]) else f" p={d['p']:.3g}"))
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", pruning_reading(group), ""]
    return lines


def write_pruning(out: Path, summary: list[dict]) -> Path:
    """compare_pruning.csv: per group, step and baseline order, the paired difference importance - baseline with its
    95% t interval, p and Holm p (over the group's steps and baselines), and its verdict at Holm p < 0.05."""
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    keys = list(summary[0]["group"])
    fields = ("effect", "low", "high", "p_value", "p_holm")
    writer.writerow([*keys, "heads_pruned", "fraction", "metric", *fields, "verdict"])
    for group in summary:
        for step in group["steps"]:
            for b, d in step["differences"].items():
                tested = not math.isnan(d["p"])
                verdict = ("significant" if d["p_holm"] < 0.05 else "not significant") if tested else ""
                values = (d["delta"], *d["interval"], d["p"], d["p_holm"])
                cells = [*(csv_cell(group["group"][k]) for k in keys), step["heads_pruned"], step["fraction"]]
                writer.writerow([*cells, f"importance - {b}", *values, verdict])
    write_text_atomic(out / PRUNING_CSV, table.getvalue())
    return out / PRUNING_CSV


def pruning_reading(group: dict) -> str:
    """What a group's pruning differences say, stated: where importance order keeps more accuracy than a baseline
    order, and where it keeps less (its ranking then misorders the heads), at Holm p < 0.05 over the group's steps
    and baselines."""
    said = []
    for b in group["orders"][1:]:
        for sign, word in ((1, "better"), (-1, "worse")):
            at = [s for s in group["steps"] if s["differences"][b].get("p_holm", 1) < 0.05
                  and sign * s["differences"][b]["delta"] > 0]  # fmt: skip
            if at:
                where = ", ".join(f"{s['fraction']:.2f} ({s['differences'][b]['delta']:+.4f})" for s in at)
                said.append(f"importance order is {word} than {b} order at {where}")
    if not said:
        return "Reading (Holm over the differences above): no difference between the orders is significant."
    misordered = any(" worse " in s for s in said)
    ending = ": where it is worse, the importance ranking misorders these heads." if misordered else "."
    return f"Reading (Holm over the differences above, p < 0.05): {'; '.join(said)}{ending}"


def roles_table(summary: list[dict], solved: tuple[str, float] | None) -> list[str]:
    """Markdown of roles.role_counts: per group (and outcome), the runs with a head in each role, k/n [exact 95%
    CI] and the mean heads in it a run."""
    if not summary:
        return []
    found = {n for g in summary for n in g["roles"]}
    names = sorted(found - set(ROLES_BEYOND_FETCHING)) + [n for n in ROLES_BEYOND_FETCHING if n in found]
    which = f"; runs with {solved[0]} >= {solved[1]:g} and below counted apart" if solved else ""
    header = ["group", "runs", *map(markdown_cell, names)]
    lines = [
        f"Head roles (heads.json `role`, docs/heads.md: runs with a head in each role, k/n [exact 95% CI], and mean "
        f"heads in it a run{which}):",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for g in summary:
        title = markdown_cell(", ".join(f"{k}={v}" for k, v in g["group"].items()) or "all runs")
        title += "" if g["outcome"] == "all" else f" ({g['outcome']})"
        cells = [title, str(g["runs"])]
        for name in names:
            r = g["roles"].get(name)
            cells.append(
                "-" if r is None else f"{r['k']}/{r['n']} [{r['low']:.2f}, {r['high']:.2f}] ({r['heads']:.1f})"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]
