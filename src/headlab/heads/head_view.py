"""An interactive head view of a run: one self-contained HTML page (heads/view.html), with bertviz's three views.
Pick a layer, heads and a probe example; see attention as lines from each query token to the keys (hover a token
for its own lines) or as matrices, with each head's statistics and importance beside it; every layer and head at
once as thumbnails (the model view: click one to open it); or the query and key vectors behind one head's weights,
with their elementwise product and the score it sums to (the neuron view).

The page holds its data and its script: it opens from disk with no network, and W&B shows it as wandb.Html.
"""

import json
from importlib.resources import files

import numpy as np

MAX_VALUES = 1_500_000  # attention weights in one page (about 5 MB): fewer examples for large models
MAX_EXAMPLES = 8


def page_data(snapshot: dict, title: str) -> dict:
    """What the page shows, from a probe snapshot (headlab.heads.probe.snapshot): per layer an (E, H, n, n)
    array of probe attention, each example's tokens (its real length), label and prediction, the rows of
    statistics (and importance) per (layer, head), the share of attention each key role gets from each head, the
    notation of the task's tokens, whether weights are signed and the largest magnitude drawn, and for the neuron
    view each example's query and key vectors (q, k: [layer][head][position][d]) and the scale of q . k, or why
    there are none. Weights are stored in thousandths, vectors to 3 decimals, the examples cut to MAX_VALUES
    values."""
    weights = [np.asarray(w, dtype=np.float32) for w in snapshot["weights"]]
    tokens, rows = snapshot["tokens"], snapshot["rows"]
    L, (E, H) = len(weights), weights[0].shape[:2]
    vectors = snapshot.get("vectors") or {"why_not": "the run's snapshot holds no query and key vectors"}
    d_k = vectors["q"][0].shape[-1] if "q" in vectors else 0
    lengths = [len(t) for t in tokens[:E]]
    per_example = [L * H * k * (k + 2 * d_k) for k in lengths]
    keep = max(1, min(MAX_EXAMPLES, int(np.searchsorted(np.cumsum(per_example), MAX_VALUES, side="right"))))
    examples = [
        {
            "tokens": list(tokens[e]),
            **snapshot.get("outcomes", [{}] * E)[e],
            "attention": [  # [layer][head][query][key], in thousandths
                np.rint(weights[layer][e, :, : lengths[e], : lengths[e]] * 1000).astype(int).tolist()
                for layer in range(L)
            ],
            **({"q": _rounded(vectors["q"], e, lengths[e]), "k": _rounded(vectors["k"], e, lengths[e])} if d_k else {}),
        }
        for e in range(min(keep, E))
    ]
    statistics = [k for k in rows[0] if k not in ("layer", "head")] if rows else []
    clean = [{k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in r.items()} for r in rows]
    roles = snapshot.get("roles")
    shares = (
        {
            "names": roles["names"],
            "share": np.round(np.asarray(roles["share"]), 4).tolist(),
            "uniform": np.round(np.asarray(roles["uniform"]), 4).tolist(),  # the reference row: no preference
        }
        if roles
        else None
    )
    largest = max((float(np.abs(w).max()) for w in weights if w.size), default=1.0)
    return {
        "title": title,
        "signed": any(bool((w < 0).any()) for w in weights),  # a differential head's, or mixed weights
        "scale": max(1.0, largest),  # the weight drawn fully opaque: 1, or more where sigmoid or mixing exceed it
        "layers": L,
        "heads": H,
        "statistics": statistics,
        "rows": clean,
        "examples": examples,
        "roles": shares,
        "notation": snapshot.get("notation"),
        "neuron": {"scale": vectors["scale"]} if d_k else {"why_not": vectors["why_not"]},
    }


def _rounded(vectors: list, e: int, length: int) -> list:
    """[layer][head][position][d] of example e's query (or key) vectors, to 3 decimals."""
    return [np.round(np.asarray(v[e, :, :length], dtype=np.float64), 3).tolist() for v in vectors]


# characters that could end or change the <script> element the data sits in ("</script", "<!--"), or a JS string
# (U+2028, U+2029), written as JSON's \\u escapes: the same strings once parsed
SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def script_json(data) -> str:
    """JSON that is safe inside an HTML <script> element, whatever strings it holds (tokens, titles, sentences)."""
    text = json.dumps(data, separators=(",", ":"))
    for raw, escaped in SCRIPT_ESCAPES.items():
        text = text.replace(raw, escaped)
    return text


def render(data: dict) -> str:
    """The HTML page for page_data's dict."""
    template = files("headlab.heads").joinpath("head_view.html").read_text()
    return template.replace("/*DATA*/null", script_json(data))
