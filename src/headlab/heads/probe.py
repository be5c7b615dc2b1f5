"""A model seen through the probe batch (the same examples every time): its attention on them, the head
statistics, its predictions, where each head looks across all probe queries (attention roles), and the snapshot of
plain arrays that the figures and the head view draw.

Shapes: B probe examples, L layers, H heads, n positions (n' with the cls position), R roles.
"""

from pathlib import Path

import numpy as np
import torch

from headlab.conventions import IGNORE_INDEX
from headlab.files import write_atomic
from headlab.heads import causal_report, head_view, statistics
from headlab.model.hooks import recorded


def attention(model, datamodule, batch: dict) -> dict:
    """{"weights": per layer (B, H, n', n'), "logits", "report": statistics.head_report (from the weights, the
    logits each normaliser was given, any output gates and mixture-of-heads routes, recorded at the attention's
    hook points), "roles": {"names", "share" (L, H, R)}, "mixing": talking heads' matrices} of the model on a probe
    batch, in evaluation mode."""
    was_training = model.training
    model.eval()
    q_point, k_point = model.blocks[0].attn.dot_product_points() or ("hook_q", "hook_k")
    with (
        torch.no_grad(),
        recorded(model, "hook_attn_scores") as scores,
        recorded(model, "hook_gate") as gates,
        recorded(model, "hook_route") as routes,
        recorded(model, q_point) as queries,
        recorded(model, k_point) as keys,
    ):
        logits, weights = model(batch["tokens"], batch["padding_mask"], need_weights=True)
    model.train(was_training)
    padding = model.attention_padding_mask(batch["padding_mask"])  # (B, n')
    report = statistics.head_report(weights, padding, scores, gates or None, routes or None)
    seen_roles = roles(model, datamodule, batch, weights)
    relevant = [i for i, name in enumerate(seen_roles["names"]) if name in datamodule.relevant_roles]
    if relevant:  # the share of attention on the keys each query needs, per head
        for row in report["rows"]:
            row[statistics.RELEVANT] = float(seen_roles["share"][row["layer"], row["head"], relevant].sum())
    return {
        "weights": weights, "logits": logits, "report": report, "roles": seen_roles, "mixing": mixing(model),
        "vectors": vectors(model, queries, keys),
    }  # fmt: skip


NEURON_VIEW = "dot-product scores of one map a head, unmixed"  # what the neuron view can show


def vectors(model, queries: list[torch.Tensor], keys: list[torch.Tensor]) -> dict:
    """The query and key vectors behind each weight, for the head view's neuron view: per layer q and k (B, H, n',
    d_k) (a shared key head repeated for each query head it serves) and the scale of q . k; or why not, where a
    logit is not one scaled dot product (MultiHeadAttention.dot_product_points)."""
    attn = model.blocks[0].attn
    if attn.dot_product_points() is None:
        return {"why_not": f"the neuron view shows {NEURON_VIEW}"}
    repeat = attn.n_heads // attn.n_kv_heads
    return {
        "q": queries,
        "k": [k.repeat_interleave(repeat, dim=1) for k in keys],  # (B, H, n', d_k)
        "scale": attn.scale,
    }


def with_measured(rows: list[dict], measured: dict) -> None:
    """Add to the probe report's rows what the run measured of each head on its checkpoint (heads.json rows:
    importance and the causal columns), by (layer, head)."""
    by_head = {(r["layer"], r["head"]): r for r in measured.get("rows", [])}
    for row in rows:
        found = by_head.get((row["layer"], row["head"]), {})
        row["importance"] = found.get("importance")
        row.update({k: found[k] for k in causal_report.measured([found])} if found else {})


def mixing(model) -> dict[str, list]:
    """Talking heads' (H, H) matrices of every layer, by what they mix ("logits", "weights"; row h to column h'),
    as nested lists; {} without talking heads."""
    found = {}
    for what, name in (("logits", "logit_mix"), ("weights", "weight_mix")):
        matrices = [getattr(block.attn, name) for block in model.blocks]
        if matrices[0] is not None:
            found[what] = [m.detach().float().cpu().tolist() for m in matrices]
    return found


def roles(model, datamodule, batch: dict, weights: list) -> dict:
    """The share of attention each key role gets from each head, over every counted probe query (scored positions
    of a token task, every real position otherwise): the division of labour between heads, at a glance; and
    "uniform", the shares attention spread evenly over the real keys would give (by position, most keys of a
    sentence are "elsewhere": a head prefers a role where its share exceeds that)."""
    tokens, padding = batch["tokens"].cpu().numpy(), batch["padding_mask"].cpu().numpy()
    names, by_position = datamodule.attention_roles(tokens, padding)  # (B, n, n)
    labels = batch["labels"].cpu()
    counted = (
        (labels != IGNORE_INDEX) & ~batch["padding_mask"].cpu() if labels.dim() == 2 else ~batch["padding_mask"].cpu()
    )
    offset = model.attention_offset  # the cls position: a role of its own, never a counted query
    if offset:
        by_position = np.pad(by_position, ((0, 0), (offset, 0), (offset, 0)), constant_values=len(names))
        counted = torch.nn.functional.pad(counted, (offset, 0), value=False)
        names = [*names, "[cls]"]
    keys = torch.as_tensor(by_position)  # (B, n', n')
    real = ~model.attention_padding_mask(batch["padding_mask"].cpu())
    share = statistics.role_shares([w.cpu() for w in weights], keys, counted & real, len(names))  # (L, H, R)
    even = real[:, None, None, :].float().expand(-1, 1, real.shape[1], -1)  # (B, 1, n', n'): every real key alike
    uniform = statistics.role_shares([even], keys, counted & real, len(names))[0, 0]  # (R,): what no preference gives
    return {"names": names, "share": share.numpy(), "uniform": uniform.numpy()}


def snapshot(model, datamodule, batch: dict, seen: dict, step: int, examples: int) -> dict:
    """Plain arrays of the first `examples` probe examples (what the figures and the head view draw; figures are
    rendered from it in worker processes when a pack logs all its members at once): tokens, attention, each
    example's label and prediction (per position for a token task), the statistics and the role shares."""
    count = min(examples, len(batch["tokens"]))
    lengths = (~batch["padding_mask"][:count]).sum(1).tolist()
    tokens = [
        model.attention_labels(datamodule.token_strings(batch["tokens"][e, : lengths[e]].cpu())) for e in range(count)
    ]
    n = max(len(t) for t in tokens)
    predicted = seen["logits"][:count].argmax(-1).cpu()  # (E,) or (E, n)
    labels = batch["labels"][:count].cpu()
    return {
        "weights": [w[:count, :, :n, :n].float().cpu().numpy() for w in seen["weights"]],  # (E, H, n, n) per layer
        "tokens": tokens,
        "outcomes": [_outcome(datamodule, model, labels[e], predicted[e], lengths[e]) for e in range(count)],
        "notation": datamodule.notation,
        "roles": {k: seen["roles"][k] for k in ("names", "share", "uniform")},
        "similarity": seen["report"]["similarity"].cpu().numpy(),
        "mixing": seen["mixing"],
        "n_heads": model.n_heads,
        "rows": seen["report"]["rows"],
        "vectors": _first(seen["vectors"], count, n),
        "step": step,
    }


def _first(vectors: dict, count: int, n: int) -> dict:
    """The query and key vectors of the first `count` examples and n positions, as arrays."""
    if "why_not" in vectors:
        return vectors
    cut = lambda tensors: [t[:count, :, :n].float().cpu().numpy() for t in tensors]  # noqa: E731 (E, H, n, d_k)
    return {"q": cut(vectors["q"]), "k": cut(vectors["k"]), "scale": vectors["scale"]}


def _outcome(datamodule, model, label: torch.Tensor, predicted: torch.Tensor, length: int) -> dict:
    """An example's label and the model's prediction, by class name: one each, or one a position (None where a
    position is not scored, and at the cls position)."""
    if label.dim() == 0:  # a probe sentence of the user's has no label
        name = None if int(label) == IGNORE_INDEX else datamodule.class_name(int(label))
        return {"label": name, "prediction": datamodule.class_name(int(predicted))}
    scored = [
        (datamodule.class_name(int(y)), datamodule.class_name(int(p))) if y != IGNORE_INDEX else (None, None)
        for y, p in zip(label[:length].tolist(), predicted[:length].tolist(), strict=True)
    ]
    none = [(None, None)] * model.attention_offset
    return {"labels": [y for y, _ in none + scored], "predictions": [p for _, p in none + scored]}


def write_head_view(path: Path, snapshot: dict, title: str) -> None:
    """heads/view.html of a snapshot: the interactive head view."""
    data = head_view.page_data(snapshot, title)
    page = head_view.render(data).encode()
    write_atomic(path, lambda f: f.write(page))
