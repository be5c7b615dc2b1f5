"""Figures of heads for a paper or a dashboard: attention maps, head similarity, head importance, pruning curves,
talking heads' mixing matrices.

Built as matplotlib Figure objects, without pyplot: no display, no backend to choose, nothing to close. Each is
sized to its content (panels grow with the number of tokens, not the page), with constrained layout (no white
margins; the attention maps, the figures drawn at every validation, with margins sized from their tokens instead),
axis labels and a title that says what is plotted.
"""

import io
import math

import numpy as np
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure

MAX_LABELLED = 40  # label the axes with tokens up to this length; beyond it they are unreadable
EXAMPLES = 3  # probe examples in an attention-map figure (one row of panels each)
HEADS_PER_ROW = 8  # more heads wrap onto further rows
DPI = 100


def _array(t) -> np.ndarray:
    return t.float().cpu().numpy() if hasattr(t, "cpu") else np.asarray(t, dtype=np.float32)


def _panel_inches(n: int) -> float:
    """A panel's side: readable tick labels for n tokens at 7 pt, within [1.3, 3.6] inches."""
    return min(3.6, max(1.3, 0.11 * min(n, MAX_LABELLED) + 0.4))


def attention_maps(weights, tokens: list[list[str]] | None = None, title: str = "") -> Figure:
    """Panels of weights (E, H, n, n) (or (H, n, n) for one example): one row per example (more when it has over
    HEADS_PER_ROW heads), one panel per head, queries as rows and keys as columns. tokens: each example's token
    strings (its real length; the panel shows only those). A log colour scale from 1/(10 n) to 1 (or the largest
    weight, where sigmoid or mixing exceed 1), so that a diffuse head (weights near 1/n) shows its structure
    instead of a uniform block; signed weights (a differential head's, mixed ones) on a diverging linear scale
    centred on 0."""
    weights = _array(weights)
    if weights.ndim == 3:
        weights = weights[None]
    E, H, n, _ = weights.shape
    tokens = tokens or [[str(i) for i in range(n)] for _ in range(E)]
    side = _panel_inches(max(len(t) for t in tokens))
    columns = min(H, HEADS_PER_ROW)
    rows = math.ceil(H / columns)  # per example
    shown = [s for t in tokens if len(t) <= MAX_LABELLED for s in t]  # the tokens on the axes
    label_inches = 7 / 72 * 0.62 * max(map(len, shown), default=0)  # the longest at 7 pt
    fig = Figure(figsize=(side * columns + 1.2, side * E * rows + 0.9), dpi=DPI)
    grid, colorbar = _grid(fig, E * rows, columns, label_inches, titled_rows=rows > 1)
    axes = fig.subplots(E * rows, columns, squeeze=False, gridspec_kw=grid)
    for e in range(E):  # the panels left over in each example's last row
        for ax in axes[e * rows : (e + 1) * rows].flat[H:]:
            ax.axis("off")
    signed = bool((weights < 0).any())
    top = max(1.0, float(np.abs(weights).max())) if weights.size else 1.0
    norm = Normalize(-top, top) if signed else LogNorm(vmin=1 / (10 * n), vmax=top, clip=True)
    floor = -top if signed else norm.vmin
    for e in range(E):
        k = len(tokens[e])
        labelled = k <= MAX_LABELLED
        for h in range(H):
            ax = axes[e * rows + h // columns, h % columns]
            cmap = "RdBu_r" if signed else "viridis"
            image = ax.imshow(np.maximum(weights[e, h, :k, :k], floor), norm=norm, cmap=cmap)
            first = h % columns == 0
            if e == 0:
                ax.set_title(f"head {h}", fontsize=9)
            ticks = range(k) if labelled and first else []  # a row's other panels share its tokens: no ticks,
            ax.set_xticks(ticks, tokens[e] if ticks else [], rotation=90, fontsize=7)  # which matplotlib would
            ax.set_yticks(ticks, tokens[e] if ticks else [], fontsize=7)  # lay out one object at a time
            if first:
                ax.set_ylabel(f"example {e}: query", fontsize=8)
                ax.set_xlabel("key", fontsize=8)
    label = "attention weight (signed)" if signed else "attention weight (log scale)"
    fig.colorbar(image, cax=fig.add_axes(colorbar), label=label)
    fig.suptitle(
        title or "attention weights (rows: queries, columns: keys)", fontsize=10, y=1 - 0.06 / fig.get_figheight()
    )
    return fig


def _grid(fig: Figure, rows: int, columns: int, label_inches: float, titled_rows: bool) -> tuple[dict, list[float]]:
    """Panel margins and gaps sized from the tick labels' length (each row's first panel carries its tokens), and
    the colour bar's rectangle: a fixed layout, where matplotlib's constrained layout would measure every label
    of every panel at each draw (half of drawing these figures). titled_rows: every row's panels have titles (an
    example's heads wrap onto further rows). Returns (gridspec keywords, colour bar [l, b, w, h]), in figure
    fractions."""
    width, height = fig.get_figwidth(), fig.get_figheight()
    left, right, top = 0.3 + label_inches, 0.95, 0.5  # y label and tokens; colour bar and its label; title, heads
    below = 0.3 + label_inches + (0.2 if titled_rows else 0.0)  # each row's x label, (rotated) tokens, titles
    gap = 0.1  # between panels side by side
    panel_w = (width - left - right - gap * (columns - 1)) / columns
    panel_h = (height - top - below * rows) / rows
    grid = {
        "left": left / width, "right": 1 - right / width, "top": 1 - top / height, "bottom": below / height,
        "wspace": gap / panel_w, "hspace": below / panel_h,
    }  # fmt: skip
    bar_h = 0.6 * (height - top - below)
    return grid, [
        1 - (right - 0.15) / width,
        (below + 0.2 * (height - top - below)) / height,
        0.15 / width,
        bar_h / height,
    ]


def similarity_map(divergence, n_heads: int) -> Figure:
    """Head similarity from the Jensen-Shannon divergence between every pair of heads (L*H, L*H):
    1 - JS / ln 2, so 1 = the same attention, 0 = attention on disjoint keys."""
    similarity = 1 - _array(divergence) / math.log(2)
    T = similarity.shape[0]
    labels = [f"L{t // n_heads}H{t % n_heads}" for t in range(T)]
    side = min(9.0, max(3.0, 0.28 * T + 1.4))
    fig = Figure(figsize=(side + 1.4, side), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(similarity, cmap="magma", vmin=0, vmax=1)
    fontsize = 8 if T <= 32 else 6
    ax.set_xticks(range(T), labels, rotation=90, fontsize=fontsize)
    ax.set_yticks(range(T), labels, fontsize=fontsize)
    ax.set_xlabel("head (layer L, head H)")
    ax.set_ylabel("head")
    fig.colorbar(image, ax=ax, label="similarity")
    ax.set_title("head similarity: 1 - JS / ln 2\n(1 = same attention, 0 = disjoint keys)", fontsize=9)
    return fig


def mixing_maps(mixing: dict[str, list]) -> Figure:
    """Talking heads' matrices (Shazeer et al. 2020): a panel per layer and what it mixes ({"logits": [(H, H) per
    layer], "weights": [...]}), entry (h, h') the weight of head h's map in head h''s; the identity = no mixing."""
    panels = [(what, layer, np.asarray(m)) for what, per_layer in mixing.items() for layer, m in enumerate(per_layer)]
    H = panels[0][2].shape[0]
    side = min(4.0, max(1.8, 0.35 * H + 1.0))
    fig = Figure(figsize=(side * len(panels) + 1.2, side + 0.6), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    top = max(1e-9, max(float(np.abs(m).max()) for _, _, m in panels))
    for ax, (what, layer, matrix) in zip(axes, panels, strict=True):
        image = ax.imshow(matrix, cmap="RdBu_r", vmin=-top, vmax=top)
        ax.set_xticks(range(H), [str(h) for h in range(H)], fontsize=7)
        ax.set_yticks(range(H), [str(h) for h in range(H)], fontsize=7)
        ax.set_xlabel("to head", fontsize=8)
        ax.set_ylabel("from head", fontsize=8)
        ax.set_title(f"layer {layer}: {what}", fontsize=9)
    fig.colorbar(image, ax=list(axes), shrink=0.8, label="mixing weight")
    fig.suptitle("talking heads: mixing matrices", fontsize=10)
    return fig


def importance_map(scores, split: str = "train") -> Figure:
    """Head importance (L, H), measured on `split`, as a heatmap with each value written in its cell
    (Michel et al. 2019: E|dL/d mask|, normalised per layer)."""
    scores = _array(scores)
    L, H = scores.shape
    fig = Figure(figsize=(min(14.0, 0.6 * H + 2.8), min(9.0, 0.45 * L + 1.4)), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    top = max(1e-9, float(scores.max()))
    image = ax.imshow(scores, cmap="Reds", vmin=0, vmax=top, aspect="auto")
    for (layer, head), value in np.ndenumerate(scores):
        r, g, b, _ = image.cmap(image.norm(value))  # the cell's own colour: white text on dark, black on light
        colour = "white" if 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.5 else "black"
        ax.text(head, layer, f"{value:.2f}", ha="center", va="center", fontsize=7, color=colour)
    ax.set_xticks(range(H), [str(h) for h in range(H)], fontsize=8)
    ax.set_yticks(range(L), [str(layer) for layer in range(L)], fontsize=8)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    fig.colorbar(image, ax=ax, label="importance")
    ax.set_title(f"head importance on {split} (normalised per layer)", fontsize=10)
    return fig


def pruning_curves(curves: dict[str, list[dict]], metric: str = "val/acc") -> Figure:
    """Accuracy as heads are masked, one line per order ({"importance": curve, "random": curve, ...}); each
    curve a list of {"fraction_pruned", "metric"}."""
    fig = Figure(figsize=(4.8, 3.4), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    for name, curve in curves.items():
        ax.plot([p["fraction_pruned"] for p in curve], [p["metric"] for p in curve], marker="o", ms=3, label=name)
    ax.set_xlabel("fraction of heads masked")
    ax.set_ylabel(metric)
    ax.set_xlim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(title="pruning order", fontsize=8)
    ax.set_title("pruning curve", fontsize=10)
    return fig


def png(fig: Figure, dpi: int = DPI) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def ablation_bars(rows: list[dict]) -> Figure:
    """Each head's ablation effects (rows: heads.json's, with ablate_<kind>_loss): the rise in validation loss when
    its output is zeroed, replaced by its mean, or resampled, as grouped bars, with its gradient importance beside
    on a second axis (Michel et al.'s ranking against the causal one)."""
    kinds = [
        k.removeprefix("ablate_").removesuffix("_loss")
        for k in rows[0]
        if k.startswith("ablate_") and k.endswith("_loss")
    ]
    labels = [f"L{r['layer']}H{r['head']}" for r in rows]
    x, width = np.arange(len(rows)), 0.8 / (len(kinds) + 1)
    fig = Figure(figsize=(min(14.0, 0.55 * len(rows) * (len(kinds) + 1) / 2 + 2.5), 3.6), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    for i, kind in enumerate(kinds):
        ax.bar(x + i * width, [r[f"ablate_{kind}_loss"] for r in rows], width, label=f"{kind}-ablated")
    ax.axhline(0, color="black", lw=0.6)
    ax.set_ylabel("validation loss change")
    twin = ax.twinx()
    twin.bar(
        x + len(kinds) * width, [r["importance"] for r in rows], width, color="grey", alpha=0.6, label="importance"
    )
    twin.set_ylabel("gradient importance")
    ax.set_xticks(x + width * len(kinds) / 2, labels, rotation=90 if len(rows) > 16 else 0, fontsize=7)
    ax.set_xlabel("head (layer L, head H)")
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="upper left")
    ax.set_title("ablation: loss change when each head is removed, beside gradient importance", fontsize=10)
    return fig


def patching_map(rows: list[dict]) -> Figure:
    """Activation patching (rows with restore_<role>): a layers x heads panel per corruption, each cell the share
    of the clean-vs-corrupted logit difference that patching that head's clean output restores."""
    roles = [k for k in rows[0] if k.startswith("restore_")]
    L, H = max(r["layer"] for r in rows) + 1, max(r["head"] for r in rows) + 1
    fig = Figure(
        figsize=(min(14.0, (0.5 * H + 1.6) * len(roles) + 1.0), min(8.0, 0.45 * L + 1.6)), dpi=DPI, layout="constrained"
    )
    axes = fig.subplots(1, len(roles), squeeze=False)[0]
    for ax, role in zip(axes, roles, strict=True):
        grid = np.zeros((L, H))
        for r in rows:
            grid[r["layer"], r["head"]] = r[role]
        image = ax.imshow(grid, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
        for (layer, head), value in np.ndenumerate(grid):
            ax.text(head, layer, f"{value:.2f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(H), [str(h) for h in range(H)], fontsize=8)
        ax.set_yticks(range(L), [str(layer) for layer in range(L)], fontsize=8)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"corrupted: {role.removeprefix('restore_').replace('_', ' ')}", fontsize=9)
    fig.colorbar(image, ax=list(axes), shrink=0.8, label="share of the logit difference restored")
    fig.suptitle("activation patching: each head's clean output into the corrupted run", fontsize=10)
    return fig


def render_importance(
    scores, curves: dict[str, list[dict]], split: str, metric: str, causal: list[dict] | None = None
) -> dict[str, bytes]:
    """The importance map (scores (L, H), measured on split) and the pruning curves (metric along each curve) as
    PNG bytes, and where the rows hold them (causal: heads.json rows), the ablation bars and the patching map;
    plain arrays in, bytes out, as render_heads."""
    out = {
        "heads/importance_map": png(importance_map(scores, split)),
        "heads/pruning_curves": png(pruning_curves(curves, metric)),
    }
    if causal and any(k.startswith("ablate_") for k in causal[0]):
        out["heads/ablation"] = png(ablation_bars(causal))
    if causal and any(k.startswith("restore_") for k in causal[0]):
        out["heads/patching"] = png(patching_map(causal))
    return out


def render_heads(snapshot: dict) -> dict[str, bytes]:
    """The per-layer attention maps and the similarity map of one probe snapshot as PNG bytes.

    snapshot: {"weights": [(E, H, n, n) array per layer], "tokens": [[str] per example], "similarity": (T, T)
    array, "n_heads": H}; the first EXAMPLES examples are drawn. Plain arrays in, bytes out: it runs in worker
    processes when a pack renders all its members at once."""
    tokens = snapshot["tokens"][:EXAMPLES]
    out = {
        f"attention/layer_{layer}": png(
            attention_maps(w[:EXAMPLES], tokens, title=f"layer {layer}: attention weights on probe examples")
        )
        for layer, w in enumerate(snapshot["weights"])
    }
    out["heads/similarity"] = png(similarity_map(snapshot["similarity"], snapshot["n_heads"]))
    if snapshot.get("mixing"):
        out["heads/mixing"] = png(mixing_maps(snapshot["mixing"]))
    return out
