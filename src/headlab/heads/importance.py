"""Head importance (Michel et al. 2019) and pruning curves. Pure torch.

Importance is measured per example (the gradient of each example's loss with respect to a head mask), never on
a batch sum, where gradients of opposite sign would cancel. Shapes: B examples, L layers, H heads per layer.

The same functions measure the E members of a pack at once: a model whose inputs carry a leading member
dimension (tokens (E, B, n), head masks (E, B, L, H)) gives (E, L, H) importance and (E,) accuracies, each
member's equal to what it gives alone.
"""

import math
from collections.abc import Callable, Iterable, Mapping

import torch
import torch.nn.functional as F

from headlab.conventions import IGNORE_INDEX


def _per_example_loss(logits: torch.Tensor, labels: torch.Tensor, lead: int = 1) -> torch.Tensor:
    """Cross-entropy per example: (*lead, C) or (*lead, n, C) logits -> (*lead,), token losses averaged per
    example (lead: how many leading dimensions index examples, 1 for (B,), 2 for a pack's (E, B))."""
    if labels.dim() == lead:  # one label per example
        C = logits.shape[-1]
        return F.cross_entropy(logits.reshape(-1, C), labels.reshape(-1), reduction="none").view(labels.shape)
    n, C = logits.shape[-2:]
    flat_logits, flat_labels = logits.reshape(-1, n, C), labels.reshape(-1, n)  # (N, n, C), (N, n)
    losses = F.cross_entropy(flat_logits.transpose(1, 2), flat_labels, reduction="none", ignore_index=IGNORE_INDEX)
    scored = (flat_labels != IGNORE_INDEX).to(losses.dtype)
    return ((losses * scored).sum(-1) / scored.sum(-1).clamp(min=1)).view(labels.shape[:-1])


def head_importance(model: torch.nn.Module, batches: Iterable[dict], normalise: bool = True) -> torch.Tensor:
    """Michel et al. 2019: I_h = E_x |dL(x)/d xi_h| at head mask xi = 1, per example, normalised per layer.

    model(tokens, key_padding_mask, head_mask=...) must accept a (B, L, H) head mask. Returns (L, H); (E, L, H)
    for a pack's members (batches (E, B, ...), head masks (E, B, L, H)).
    """
    total, count = None, 0
    for batch in batches:
        lead = batch["padding_mask"].shape[:-1]  # (B,) or (E, B)
        L, H = model.n_layers, model.n_heads
        xi = torch.ones(*lead, L, H, device=batch["tokens"].device, requires_grad=True)  # one mask per example
        logits, _ = model(batch["tokens"], batch["padding_mask"], head_mask=xi)
        losses = _per_example_loss(logits, batch["labels"], len(lead))  # (*lead)
        (grad,) = torch.autograd.grad(losses.sum(), xi)  # example b's row: dL(x_b)/d xi
        batch_sum = grad.abs().sum(-3)  # (L, H) or (E, L, H)
        total = batch_sum if total is None else total + batch_sum
        count += lead[-1]
    importance = total / count
    if normalise:
        importance = importance / importance.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    return importance


MASKS_PER_FORWARD = 16  # masks evaluated in one forward pass, each on its own copy of the batch (per member)


@torch.no_grad()
def accuracies(
    model: torch.nn.Module,
    batches: Iterable[dict],
    head_masks: list[torch.Tensor | None],
    per_forward: int = MASKS_PER_FORWARD,
) -> list:
    """accuracy under each head mask (L, H) or None: a batch goes through the model with up to per_forward masks
    at a time, in one forward pass that computes it once up to the first layer one of them masks and from that
    layer's heads' outputs as one copy per mask, each under its own (the model's `copies`; in a one-layer model
    the projections and maps are computed once for all its masks).

    For a pack's members (batches (E, B, ...)), each mask is (E, L, H), one per member, and each accuracy a list
    of E (member e's under its mask e)."""
    if not head_masks:
        return []
    correct, total = None, 0
    for batch in batches:
        tokens, padding, labels = batch["tokens"], batch["padding_mask"], batch["labels"]
        lead = padding.shape[:-1]  # (B,) or (E, B)
        axis = len(lead) - 1  # the batch's axis, where copies go
        B, scored = lead[-1], labels != IGNORE_INDEX
        counts = []
        for start in range(0, len(head_masks), per_forward):
            masks = [
                torch.ones(*lead[:axis], model.n_layers, model.n_heads, device=tokens.device)
                if m is None
                else m.to(tokens.device)
                for m in head_masks[start : start + per_forward]
            ]
            K = len(masks)

            def tile(t: torch.Tensor, K=K, axis=axis) -> torch.Tensor:  # K copies of the batch, one after another
                return t.repeat(*[1] * axis, K, *[1] * (t.dim() - axis - 1))

            together = torch.stack(masks, dim=axis)  # (*lead[:-1], K, L, H)
            masked = (together != 1).flatten(end_dim=-3).any(0).any(-1)  # (L,): a layer any of them masks
            first = int(masked.nonzero()[0]) if masked.any() else model.n_layers - 1
            per_example = together.repeat_interleave(B, dim=axis)  # (*lead[:-1], K * B, L, H)
            logits, _ = model(tokens, padding, head_mask=per_example, copies=K, copied_at=first)
            right = (logits.argmax(-1) == tile(labels)) & tile(scored)  # (*lead[:-1], K * B[, n])
            counts.append(right.reshape(*lead[:axis], K, -1).sum(-1))  # (*lead[:-1], K)
        hits = torch.cat(counts, dim=-1).movedim(-1, 0)  # (masks, *lead[:-1])
        correct = hits if correct is None else correct + hits
        total = total + scored.reshape(*lead[:axis], -1).sum(-1)  # () or (E,)
    if correct is None:
        return [0.0] * len(head_masks)
    return (correct.double() / torch.as_tensor(total).clamp(min=1).double()).tolist()


ORDERS = ("importance", "reverse", "random")  # least important first; most important first; a seeded shuffle


def pruning_order(importance: torch.Tensor, order: str = "importance", seed: int = 0) -> list[int]:
    """Flat head indices (layer * H + head) in the order they are masked: by importance, least important first
    (Michel et al.); "reverse", most important first; "random", a permutation drawn with the seed (the baselines
    an importance ordering must beat)."""
    if order == "importance":
        return importance.flatten().argsort(stable=True).tolist()
    if order == "reverse":
        return importance.flatten().argsort(descending=True, stable=True).tolist()
    if order == "random":
        return torch.randperm(importance.numel(), generator=torch.Generator().manual_seed(seed)).tolist()
    raise ValueError(f"pruning order {order!r}: one of {', '.join(ORDERS)}")


def pruning_masks(
    importance: torch.Tensor, step: float = 0.1, order: str = "importance", seed: int = 0
) -> list[tuple[int, list[tuple[int, int]], torch.Tensor]]:
    """The steps of a pruning curve: heads masked in pruning_order(importance, order, seed), ceil(step * total)
    at a time, from none to all; each step (heads masked, the (layer, head) pairs masked so far, head mask (L, H))."""
    L, H = importance.shape
    total = L * H
    ordered = pruning_order(importance, order, seed)
    per_step = max(1, math.ceil(round(step * total, 6)))
    mask = torch.ones(L, H, device=importance.device)
    steps, pruned = [], []
    for k in [*range(0, total, per_step), total]:
        for index in ordered[len(pruned) : k]:
            mask[index // H, index % H] = 0
            pruned.append((index // H, index % H))
        steps.append((k, list(pruned), mask.clone()))
    return steps


def pruning_curve(
    importance: torch.Tensor,
    evaluate: Callable[[list[torch.Tensor]], list[float]],
    step: float = 0.1,
    order: str = "importance",
    seed: int = 0,
) -> list[dict]:
    """The pruning curve of pruning_masks(importance, step, order, seed), evaluating after each step.

    evaluate([head_mask (L, H), ...]) -> one metric per mask, all of the curve's masks in one call (so that they
    can share forward passes, `accuracies`). Returns [{"fraction_pruned", "heads_pruned", "metric", "pruned"},
    ...] from 0 heads pruned to all, "pruned" listing the (layer, head) pairs masked so far.
    """
    steps = pruning_masks(importance, step, order, seed)
    total = importance.numel()
    return [
        {"fraction_pruned": k / total, "heads_pruned": k, "metric": metric, "pruned": pruned_so_far}
        for (k, pruned_so_far, _), metric in zip(steps, evaluate([mask for *_, mask in steps]), strict=True)
    ]


def mask_key(mask: torch.Tensor) -> bytes:
    """A head mask as a dictionary key."""
    return mask.cpu().numpy().tobytes()


def curve_masks(importance: torch.Tensor, step: float, orders: list[str], seed: int = 0) -> dict[bytes, torch.Tensor]:
    """Every head mask (L, H) the pruning curves of `orders` visit, each once (the curves share their first and
    last masks, and often more), by mask_key: what to measure for pruning_curves."""
    return {mask_key(mask): mask for order in orders for *_, mask in pruning_masks(importance, step, order, seed)}


def pruning_curves(
    importance: torch.Tensor, metrics: Mapping[bytes, float], step: float, orders: list[str], seed: int = 0
) -> dict[str, list[dict]]:
    """The pruning curve of each order, its metrics those measured of curve_masks (metrics: by mask_key)."""

    def measured(masks: list[torch.Tensor]) -> list[float]:
        return [metrics[mask_key(m)] for m in masks]

    return {order: pruning_curve(importance, measured, step, order, seed) for order in orders}
