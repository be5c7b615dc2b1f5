"""Head importance (Michel et al. 2019) and pruning curves. Pure torch.

Importance is measured per example (the gradient of each example's loss with respect to a head mask), never on
a batch sum, where gradients of opposite sign would cancel. Shapes: B examples, L layers, H heads per layer.
"""

import math
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from headlab.conventions import IGNORE_INDEX


def _per_example_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per example: (B, C) or (B, n, C) logits -> (B,), token losses averaged per example."""
    if logits.dim() == 2:
        return F.cross_entropy(logits, labels, reduction="none")
    losses = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none", ignore_index=IGNORE_INDEX)  # (B, n)
    scored = (labels != IGNORE_INDEX).to(losses.dtype)
    return (losses * scored).sum(-1) / scored.sum(-1).clamp(min=1)


def head_importance(model: torch.nn.Module, batches: Iterable[dict], normalise: bool = True) -> torch.Tensor:
    """Michel et al. 2019: I_h = E_x |dL(x)/d xi_h| at head mask xi = 1, per example, normalised per layer.

    model(tokens, key_padding_mask, head_mask=...) must accept a (B, L, H) head mask. Returns (L, H).
    """
    total, count = None, 0
    for batch in batches:
        B = batch["tokens"].shape[0]
        L, H = model.n_layers, model.n_heads
        xi = torch.ones(B, L, H, device=batch["tokens"].device, requires_grad=True)  # one mask per example
        logits, _ = model(batch["tokens"], batch["padding_mask"], head_mask=xi)
        (grad,) = torch.autograd.grad(_per_example_loss(logits, batch["labels"]).sum(), xi)  # row b: dL(x_b)/d xi
        batch_sum = grad.abs().sum(0)  # (L, H)
        total = batch_sum if total is None else total + batch_sum
        count += B
    importance = total / count
    if normalise:
        importance = importance / importance.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    return importance


MASKS_PER_FORWARD = 16  # masks evaluated in one forward pass, each on its own copy of the batch


@torch.no_grad()
def accuracies(model: torch.nn.Module, batches: Iterable[dict], head_masks: list[torch.Tensor | None]) -> list[float]:
    """accuracy under each head mask (L, H) or None: a batch is repeated once per mask (up to MASKS_PER_FORWARD
    at a time) and the copies go through the model together, each with its mask, in one forward pass."""
    correct, total = [0] * len(head_masks), 0
    for batch in batches:
        tokens, padding, labels = batch["tokens"], batch["padding_mask"], batch["labels"]
        B, scored = tokens.shape[0], labels != IGNORE_INDEX
        for start in range(0, len(head_masks), MASKS_PER_FORWARD):
            masks = [
                torch.ones(model.n_layers, model.n_heads, device=tokens.device) if m is None else m.to(tokens.device)
                for m in head_masks[start : start + MASKS_PER_FORWARD]
            ]
            K = len(masks)

            def tile(t: torch.Tensor, K=K) -> torch.Tensor:  # K copies of the batch, one after another
                return t.repeat(K, *[1] * (t.dim() - 1))

            per_example = torch.stack(masks).repeat_interleave(B, dim=0)  # (K * B, L, H)
            logits, _ = model(tile(tokens), tile(padding), head_mask=per_example)
            right = (logits.argmax(-1) == tile(labels)) & tile(scored)  # (K * B) or (K * B, n)
            for i, hits in enumerate(right.reshape(K, -1).sum(-1).tolist()):
                correct[start + i] += hits
        total += int(scored.sum())
    return [c / max(total, 1) for c in correct]


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


def pruning_curve(
    importance: torch.Tensor,
    evaluate: Callable[[list[torch.Tensor]], list[float]],
    step: float = 0.1,
    order: str = "importance",
    seed: int = 0,
) -> list[dict]:
    """Mask heads in pruning_order(importance, order, seed), ceil(step * total) at a time, evaluating after each
    step.

    evaluate([head_mask (L, H), ...]) -> one metric per mask, all of the curve's masks in one call (so that they
    can share forward passes, `accuracies`). Returns [{"fraction_pruned", "heads_pruned", "metric", "pruned"},
    ...] from 0 heads pruned to all, "pruned" listing the (layer, head) pairs masked so far.
    """
    L, H = importance.shape
    total = L * H
    ordered = pruning_order(importance, order, seed)
    per_step = max(1, math.ceil(round(step * total, 6)))
    mask = torch.ones(L, H, device=importance.device)
    steps, masks, pruned = [], [], []
    for k in [*range(0, total, per_step), total]:
        for index in ordered[len(pruned) : k]:
            mask[index // H, index % H] = 0
            pruned.append((index // H, index % H))
        steps.append((k, list(pruned)))
        masks.append(mask.clone())
    return [
        {"fraction_pruned": k / total, "heads_pruned": k, "metric": metric, "pruned": pruned_so_far}
        for (k, pruned_so_far), metric in zip(steps, evaluate(masks), strict=True)
    ]
