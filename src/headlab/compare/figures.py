"""headlab-compare's figures: each metric against a numeric varying key, and the learning curves per group; one
panel per dataset (the --across or --meta key), each with its own axis and chance line, one legend below."""

import io
import math
import textwrap
from pathlib import Path

from headlab.files import write_bytes_atomic
from headlab.stats.comparison import group_runs, hashable
from headlab.stats.contrasts import Design
from headlab.stats.datasets import setting_keys

MIN_SPAN = 0.1  # an accuracy axis spans at least this much: differences of a few examples do not fill a plot
PANEL_COLUMNS = 3


def frame_accuracy(ax, rows: list[dict]) -> None:
    """An accuracy axis that shows chance (a dashed line at the most common label's rate, where the arms agree on
    it; the mean over runs where folds differ) and spans at least MIN_SPAN, so that runs at chance do not look apart;
    where chance lies more than MIN_SPAN below the runs, the legend says so instead, and the axis stays on the runs'
    differences."""
    chances = {r.get("chance") for r in rows}
    low, high = ax.get_ylim()
    if len(chances) == 1 and (chance := chances.pop()) is not None:
        label = f"chance ({chance:.3g}{', mean over runs' if any(r.get('chance_varies') for r in rows) else ''})"
        if chance >= low - MIN_SPAN:
            ax.axhline(chance, color="0.4", linestyle="--", linewidth=1, label=label)
            low, high = min(low, chance), max(high, chance)
        else:
            ax.plot([], [], " ", label=f"{label}: below the axis")
    if high - low < MIN_SPAN:
        middle = (low + high) / 2
        low, high = middle - MIN_SPAN / 2, middle + MIN_SPAN / 2
    ax.set_ylim(max(0.0, low - 0.01), min(1.0, high + 0.01) if high <= 1 else high)


def panels(keys: list[str], rows: list[dict], design: Design) -> tuple[list[tuple[str, list[dict]]], list[str]]:
    """(title, rows) per dataset (the --across or --meta key), or one untitled panel; and the keys that name a
    series: those that vary within a dataset (its own files or folds do not), the --select key aside."""
    facet = design.dataset
    if facet not in keys:
        return [("", rows)], [k for k in keys if not design.select or k != design.select[0]]
    values = sorted({hashable(r[facet]) for r in rows}, key=str)
    layout = [(f"{facet}={v}", [r for r in rows if hashable(r[facet]) == v]) for v in values]
    return layout, setting_keys(rows, keys, facet, design)


def series_label(row: dict, keys: list[str]) -> str:
    """The short name of a series: each key's last part and its value (dropout=0.3, lr=0.01)."""
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={row[k]}" for k in keys)


def grid(n_panels: int, width: float = 4.2, height: float = 3.2):
    """A figure of n_panels axes, PANEL_COLUMNS a row (legend_below makes the room for its legend)."""
    from matplotlib.figure import Figure

    columns = min(n_panels, PANEL_COLUMNS)
    rows = -(-n_panels // columns)
    fig = Figure(figsize=(max(6.0, width * columns), height * rows), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, axes[:n_panels]


def legend_below(fig, axes) -> None:
    """One legend of the series for every panel, below them, each label once (a series has one colour in every
    panel), the figure taller by its rows; a panel's chance line is named in the panel."""
    entries = {}
    for ax in axes:
        chance = [(h, label) for h, label in zip(*ax.get_legend_handles_labels(), strict=True) if "chance" in label]
        if chance:
            ax.legend(*zip(*chance, strict=True), fontsize=7, loc="lower right")
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if "chance" not in label:
                entries.setdefault(label, handle)
    if entries:
        columns, labels = legend_layout(list(entries), fig.get_figwidth())
        lines = -(-sum(label.count("\n") + 1 for label in labels) // columns)  # only a single column wraps
        fig.set_figheight(fig.get_figheight() + 0.22 * lines)
        fig.legend(entries.values(), labels, loc="outside lower center", ncols=columns, fontsize=7)


def legend_layout(labels: list[str], width: float, fontsize: float = 7) -> tuple[int, list[str]]:
    """As many legend columns, up to 3, as the longest label allows in a figure `width` inches wide, and the labels,
    wrapped where even one column is too narrow: long series names whole, never cut at the figure's edges."""
    char = 0.6 * fontsize / 72  # inches: a character at about 0.6 em; 0.6 inch more for the marker and padding
    columns = max(1, min(3, int(width // (char * max(map(len, labels)) + 0.6))))
    if columns == 1:
        labels = [textwrap.fill(label, int((width - 0.6) / char), break_on_hyphens=False) for label in labels]
    return columns, labels


def palette(rows: list[dict], keys: list[str]) -> dict:
    """A colour per series label, the same in every panel, in the rows' order (n_heads=2 before n_heads=16):
    tab10, or tab20 for more than ten series."""
    from matplotlib import colormaps

    labels = list(dict.fromkeys(series_label(r, keys) for r in rows))
    cmap = colormaps["tab10" if len(labels) <= 10 else "tab20"]
    return {label: cmap(i % cmap.N) for i, label in enumerate(labels)}


def x_key_of(keys: list[str], rows: list[dict]) -> str | None:
    """The numeric varying key of most values (the first on ties), or None."""
    numeric = [k for k in keys if all(isinstance(r[k], int | float) and not isinstance(r[k], bool) for r in rows)]
    return max(numeric, key=lambda k: len({r[k] for r in rows}), default=None)


def metric_figure(keys: list[str], rows: list[dict], metric: str, design: Design):
    """metric against the numeric varying key of most values, one line per combination of the other keys, 95% CI
    bars and every seed a dot; a panel per dataset. A key chosen per arm (--select) is written at each point, not
    a line of its own. Where only keys of names vary (a design), each arm at its own place (arm_figure). None
    when nothing varies or no row has metric."""
    layout, varying = panels(keys, rows, design)
    selected = design.select[0] if design.select and design.select[0] in keys else None
    x_key = x_key_of(varying, rows)
    if not varying or not any(metric in r for r in rows):
        return None
    if x_key is None:
        return arm_figure(layout, varying, metric)
    series_keys = [k for k in varying if k != x_key]
    colours = palette(rows, series_keys)
    fig, axes = grid(len(layout))
    for ax, (title, panel_rows) in zip(axes, layout, strict=True):
        for members in group_runs([{"config": r, **r} for r in panel_rows], series_keys).values():
            members = sorted((m for m in members if metric in m), key=lambda m: m[x_key])
            if not members:
                continue
            label = series_label(members[0], series_keys)
            xs, means = [m[x_key] for m in members], [m[metric]["mean"] for m in members]
            below = [0 if math.isnan(m[metric]["low"]) else m[metric]["mean"] - m[metric]["low"] for m in members]
            above = [0 if math.isnan(m[metric]["high"]) else m[metric]["high"] - m[metric]["mean"] for m in members]
            c = colours[label]
            ax.errorbar(xs, means, yerr=[below, above], marker="o", capsize=3, color=c, label=label or None)
            for m in members:  # every seed, so that a bimodal outcome shows as such
                ax.scatter([m[x_key]] * len(m[metric]["values"]), m[metric]["values"], s=10, alpha=0.5, color=c)
                if selected:
                    at = (m[x_key], m[metric]["mean"])
                    ax.annotate(series_label(m, [selected]), at, xytext=(4, 4), textcoords="offset points", fontsize=6)
        values = sorted({r[x_key] for r in panel_rows})
        if values[0] > 0 and values[-1] / values[0] >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(values, [str(v) for v in values])
        ax.set_xlabel(x_key)
        ax.set_ylabel(f"{metric} (mean, 95% CI)")
        ax.set_title(title, fontsize=9)
        if "acc" in metric.rsplit("/", 1)[-1]:
            frame_accuracy(ax, panel_rows)
        ax.grid(alpha=0.3)
    legend_below(fig, axes)
    return fig


def arm_figure(layout: list[tuple[str, list[dict]]], varying: list[str], metric: str):
    """metric of each arm (its varying keys' values, none numeric: normalizer=sigmoid, gate=headwise) at a place of
    its own, with its 95% CI bar and every seed a dot; a panel per dataset."""
    fig, axes = grid(len(layout))
    for ax, (title, panel_rows) in zip(axes, layout, strict=True):
        arms = [r for r in panel_rows if metric in r]
        for x, arm in enumerate(arms):
            summary = arm[metric]
            below = 0 if math.isnan(summary["low"]) else summary["mean"] - summary["low"]
            above = 0 if math.isnan(summary["high"]) else summary["high"] - summary["mean"]
            ax.errorbar([x], [summary["mean"]], yerr=[[below], [above]], marker="o", capsize=3, color="C0")
            ax.scatter([x] * len(summary["values"]), summary["values"], s=10, alpha=0.5, color="C0")
        ax.set_xticks(range(len(arms)), [series_label(a, varying) for a in arms], rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(f"{metric} (mean, 95% CI)")
        ax.set_title(title, fontsize=9)
        if "acc" in metric.rsplit("/", 1)[-1]:
            frame_accuracy(ax, panel_rows)
        ax.grid(alpha=0.3)
    return fig


def curves_figure(keys: list[str], rows: list[dict], design: Design):
    """Validation accuracy at each validation, every run thin and each group's mean thick; a panel per dataset.
    None when no run recorded a curve."""
    if not any(row["curves"] for row in rows):
        return None
    layout, varying = panels(keys, rows, design)
    colours = palette(rows, varying)
    fig, axes = grid(len(layout))
    for ax, (title, members) in zip(axes, layout, strict=True):
        for row in members:
            if not row["curves"]:
                continue
            length = min(len(c) for c in row["curves"])
            steps = [p["step"] for p in row["curves"][0][:length]]
            for curve in row["curves"]:
                ax.plot([p["step"] for p in curve], [p["val/acc"] for p in curve], lw=0.5, alpha=0.25, color="0.5")
            mean = [sum(c[i]["val/acc"] for c in row["curves"]) / len(row["curves"]) for i in range(length)]
            label = series_label(row, varying)
            ax.plot(steps, mean, lw=2, marker="o", ms=3, color=colours[label], label=label or "all runs")
        ax.set_xlabel("training step")
        ax.set_ylabel("val/acc (each run; mean per group)")
        ax.set_title(title, fontsize=9)
        frame_accuracy(ax, members)
        ax.grid(alpha=0.3)
    legend_below(fig, axes)
    return fig


def plot(out: Path, keys: list[str], rows: list[dict], design: Design) -> list[Path]:
    """compare_<metric>.png for each metric that metric_figure can draw."""
    written = []
    for metric in design.metrics:
        if (fig := metric_figure(keys, rows, metric, design)) is not None:
            written.append(_save(fig, out / f"compare_{metric.replace('/', '_')}.png"))
    return written


def plot_curves(out: Path, keys: list[str], rows: list[dict], design: Design) -> list[Path]:
    """compare_curves.png, where the runs recorded curves."""
    if (fig := curves_figure(keys, rows, design)) is None:
        return []
    return [_save(fig, out / "compare_curves.png")]


def _save(fig, path: Path) -> Path:
    """The figure as a PNG, whole or not at all."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    write_bytes_atomic(path, buffer.getvalue())
    return path
