"""A run's causal head analysis (headlab.heads.causal) for heads.json: each head's zero-, mean- and
resample-ablation effects on the pruning split (means over the importance split), the same per key/value group
under grouped-query attention, their rank agreement with gradient importance, activation patching for each
corruption the task defines, and each head's role. Shapes: L layers, H heads, G key/value heads."""

import numpy as np
import torch

from headlab.heads import causal


def corrupted(datamodule, batch: dict, role: str, seed: int) -> tuple[dict, torch.Tensor]:
    """The batch minimally changed by the task (its corrupt), and the query position of each example whose answer
    changed: (batch, positions (B,))."""
    rng = np.random.default_rng(seed)
    tokens, labels, position = datamodule.task.corrupt(rng, batch["tokens"].cpu().numpy(), role)
    device = batch["tokens"].device
    changed = {"tokens": torch.as_tensor(tokens, device=device), "labels": torch.as_tensor(labels, device=device)}
    return {**batch, **changed}, torch.as_tensor(position, device=device)


def measured(rows: list[dict]) -> list[str]:
    """The causal fields of a report's rows, numbers (ablations, patching) then the role: [] without them."""
    if not rows:
        return []
    numbers = [k for k in rows[0] if k.startswith(("ablate_", "restore_"))]
    return numbers + (["role"] if "role" in rows[0] else [])


def field(role: str) -> str:
    """A role's name as a row field: restore_key_a."""
    return "restore_" + role.replace(" ", "_")


def measure(model, datamodule, batches: list[dict], reference: list[dict], rows: list[dict], roles: dict, seed: int,
            importance: torch.Tensor | None) -> dict:  # fmt: skip
    """Adds each head's ablation effects (ablate_<kind>_loss, ablate_<kind>_acc), patching shares
    (restore_<role>) and role to rows (the report's, by layer and head); returns heads.json's other causal fields.
    batches: where effects are measured (the pruning split); reference: where means are taken (the importance
    split); roles: the probe's attention roles ({"names", "share" (L, H, R)}); importance (L, H) or None."""
    was_training = model.training
    model.eval()
    effects = causal.ablation_effects(model, batches, reference)
    record: dict = {"causal_examples": sum(len(b["labels"]) for b in batches)}
    attn = model.blocks[0].attn
    if attn.n_kv_heads < attn.n_heads:
        grouped = causal.ablation_effects(model, batches, reference, groups=True)
        record["group_ablation"] = {k: {m: v.tolist() for m, v in e.items()} for k, e in grouped.items()}
    if importance is not None:
        record["ablation_agreement"] = {  # Spearman's rho of each kind's loss increase with gradient importance
            kind: _finite(causal.rank_agreement(importance.cpu(), e["loss"])) for kind, e in effects.items()
        }
    restored = {}
    for role in getattr(datamodule, "corruptions", ()):
        clean = _joined(batches)
        broken, position = corrupted(datamodule, clean, role, seed)
        restored[role] = causal.patching_shares(model, clean, broken, position)  # (L, H)
    model.train(was_training)
    for row in rows:
        at = row["layer"], row["head"]
        for kind, e in effects.items():
            row[f"ablate_{kind}_loss"], row[f"ablate_{kind}_acc"] = float(e["loss"][at]), float(e["acc"][at])
        if restored:
            share = {r: float(s[at]) for r, s in restored.items()}
            attention = {name: float(roles["share"][at][i]) for i, name in enumerate(roles["names"]) if name in share}
            row.update({field(r): v for r, v in share.items()})
            row["role"] = causal.head_role(attention, share, row)
    if restored:
        record["corruptions"] = list(restored)
    return record


def _joined(batches: list[dict]) -> dict:
    """Batches of one length (a generated task's) as one batch."""
    return {k: torch.cat([b[k] for b in batches]) for k in batches[0]}


def _finite(value: float) -> float | None:
    return value if np.isfinite(value) else None
