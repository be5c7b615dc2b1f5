"""Figures of heads: attention maps per layer and head similarity.

Built as matplotlib Figure objects, without pyplot: no display, no backend to choose, nothing to close.
"""

import io
import math

import numpy as np
from matplotlib.figure import Figure

MAX_LABELLED = 40  # label the axes with tokens up to this length; beyond it they are unreadable


def _array(t) -> np.ndarray:
    return t.float().cpu().numpy() if hasattr(t, "cpu") else np.asarray(t, dtype=np.float32)


def attention_maps(weights, tokens: list[str] | None = None, title: str = "") -> Figure:
    """One panel per head: weights (H, n, n) of one example (a tensor or an array), queries as rows, keys as
    columns."""
    weights = _array(weights)
    H, n, _ = weights.shape
    cols = min(H, 4)
    rows = math.ceil(H / cols)
    size = 2.2 + 0.12 * min(n, MAX_LABELLED)
    fig = Figure(figsize=(size * cols, size * rows), dpi=80)
    axes = fig.subplots(rows, cols, squeeze=False)
    for h, ax in enumerate(axes.flat):
        if h >= H:
            ax.axis("off")
            continue
        image = ax.imshow(weights[h], vmin=0, vmax=1, cmap="viridis")
        ax.set_title(f"head {h}", fontsize=9)
        if tokens is not None and n <= MAX_LABELLED:  # query labels on each row's first panel only: text is
            ax.set_xticks(range(n), tokens, rotation=90, fontsize=6)  # most of the rendering time
            ax.set_yticks(range(n), tokens if h % cols == 0 else [], fontsize=6)
        else:
            ax.set_xlabel("key")
            ax.set_ylabel("query")
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle(title)
    return fig


def similarity_map(similarity, n_heads: int) -> Figure:
    """Jensen-Shannon divergence between every pair of heads (L*H, L*H); 0 = identical attention."""
    similarity = _array(similarity)
    T = similarity.shape[0]
    labels = [f"L{t // n_heads}H{t % n_heads}" for t in range(T)]
    fig = Figure(figsize=(2 + 0.35 * T, 1.6 + 0.35 * T), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(similarity, cmap="magma_r", vmin=0, vmax=math.log(2))
    ax.set_xticks(range(T), labels, rotation=90, fontsize=7)
    ax.set_yticks(range(T), labels, fontsize=7)
    fig.colorbar(image, ax=ax, label="Jensen-Shannon divergence (nats)")
    ax.set_title("head similarity")
    return fig


def png(fig: Figure, dpi: int = 80) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def render_heads(snapshot: dict) -> dict[str, bytes]:
    """The per-layer attention maps and the similarity map of one probe snapshot as PNG bytes.

    snapshot: {"weights": [(H, n, n) array per layer], "tokens": [str], "similarity": (T, T) array, "n_heads": H}.
    Plain arrays in, bytes out: it runs in worker processes when a pack renders all its members at once."""
    out = {
        f"attention/layer_{layer}": png(attention_maps(w, snapshot["tokens"], title=f"layer {layer}, probe example 0"))
        for layer, w in enumerate(snapshot["weights"])
    }
    out["heads/similarity"] = png(similarity_map(snapshot["similarity"], snapshot["n_heads"]))
    return out
