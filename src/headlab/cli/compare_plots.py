"""headlab-compare's figures: each metric against the first numeric varying key, and the learning curves per group."""

import math
from pathlib import Path

from headlab.analysis.comparison import group_runs

MIN_SPAN = 0.1  # an accuracy axis spans at least this much: differences of a few examples do not fill a plot


def frame_accuracy(ax, rows: list[dict]) -> None:
    """An accuracy axis that shows chance (a dashed line at the most common label's rate, where the runs agree on
    it) and spans at least MIN_SPAN, so that runs at chance do not look apart; where chance lies more than MIN_SPAN
    below the runs, the legend says so instead, and the axis stays on the runs' differences."""
    chances = {r.get("chance") for r in rows}
    low, high = ax.get_ylim()
    if len(chances) == 1 and (chance := chances.pop()) is not None:
        if chance >= low - MIN_SPAN:
            ax.axhline(chance, color="0.4", linestyle="--", linewidth=1, label=f"chance ({chance:.3g})")
            low, high = min(low, chance), max(high, chance)
        else:
            ax.plot([], [], " ", label=f"chance ({chance:.3g}): below the axis")
    if high - low < MIN_SPAN:
        middle = (low + high) / 2
        low, high = middle - MIN_SPAN / 2, middle + MIN_SPAN / 2
    ax.set_ylim(max(0.0, low - 0.01), min(1.0, high + 0.01) if high <= 1 else high)


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
    frame_accuracy(ax, rows)
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
        if "acc" in metric.rsplit("/", 1)[-1]:
            frame_accuracy(ax, rows)
        ax.grid(alpha=0.3)
        if series_keys or ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        path = out / f"compare_{metric.replace('/', '_')}.png"
        fig.savefig(path, dpi=120)
        written.append(path)
    return written
