"""The training objective, stated once: the loss a single run and every member of a pack minimise, and the sums an
epoch's metrics are made of. Everything is per member: a single run's tensors carry a leading member axis of one.

    loss = mean cross-entropy over scored positions
    with optim.rdrop = alpha > 0 (R-Drop, Liang et al. 2021): two passes under different dropout masks,
    loss = (CE(p1) + CE(p2)) / 2 + alpha * (KL(p1 || p2) + KL(p2 || p1)) / 2
    with mixture of heads' moh.balance = beta > 0 (Jin et al. 2024): + beta sum over layers of L_b (the
    load-balance loss, headlab.model.attention.load_balance; with two passes, their mean)

Shapes: E members, B examples, n positions, N scored positions per member (B, or B n for a token task), C classes.
"""

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from headlab.conventions import IGNORE_INDEX


class Step(NamedTuple):
    objective: torch.Tensor  # (E,) what is minimised
    loss: torch.Tensor  # (E,) its cross-entropy part (logged as train/loss)
    sums: dict[str, torch.Tensor]  # the epoch sums of this batch, each (E,)
    logits: torch.Tensor  # (E, B, C) or (E, B, n, C), of the first pass


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Each member's mean cross-entropy over its scored positions (E,), and the epoch sums it adds to, each (E,):
    loss (weighted by examples, as Lightning averages a logged epoch value), examples, correct, scored.
    logits (E, B, C) or (E, B, n, C); labels (E, B) or (E, B, n), IGNORE_INDEX where unscored."""
    E, B, C = logits.shape[0], labels.shape[1], logits.shape[-1]
    flat_logits, flat_labels = logits.reshape(E, -1, C), labels.reshape(E, -1)  # (E, N, C), (E, N)
    losses = F.cross_entropy(flat_logits.transpose(1, 2), flat_labels, ignore_index=IGNORE_INDEX, reduction="none")
    scored = flat_labels != IGNORE_INDEX  # (E, N)
    mean = losses.sum(1) / scored.sum(1).clamp(min=1)  # (E,)
    sums = {
        "loss": mean.detach() * B,
        "examples": torch.full_like(mean, B).detach(),
        "correct": ((flat_logits.argmax(-1) == flat_labels) & scored).sum(1).float(),
        "scored": scored.sum(1).float(),
    }
    return mean, sums


def scored_predictions(logits: torch.Tensor, labels: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each member's predicted class and its correctness at its scored positions, in order: [(classes (N_e,),
    correct (N_e,))] per member. logits (E, B, C) or (E, B, n, C); labels (E, B) or (E, B, n)."""
    E, C = logits.shape[0], logits.shape[-1]
    classes, flat_labels = logits.reshape(E, -1, C).argmax(-1), labels.reshape(E, -1)  # (E, N), (E, N)
    scored = flat_labels != IGNORE_INDEX
    return [(classes[e][scored[e]], (classes[e] == flat_labels[e])[scored[e]]) for e in range(E)]


def disagreement(a: torch.Tensor, b: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """R-Drop's (KL(p_a || p_b) + KL(p_b || p_a)) / 2 averaged over the scored positions, p = softmax of the logits:
    a, b (..., N, C), scored (..., N) bool -> (...)."""
    log_a, log_b = a.log_softmax(-1), b.log_softmax(-1)  # (..., N, C)
    kl = ((log_a.exp() - log_b.exp()) * (log_a - log_b)).sum(-1) / 2  # (..., N): the symmetric KL's mean
    return torch.where(scored, kl, 0).sum(-1) / scored.sum(-1).clamp(min=1)


def training_step(forward: Callable[[], tuple[torch.Tensor, torch.Tensor]], labels: torch.Tensor, rdrop: float) -> Step:
    """The objective of one training batch. forward() runs the model on the batch: (E, B, [n,] C) logits and each
    member's weighted load-balance loss (E,) (0 without one); each call draws new dropout masks. labels (E, B[, n])."""
    logits, balance = forward()
    loss, sums = cross_entropy(logits, labels)
    if not rdrop:
        return Step(loss + balance, loss, sums, logits)
    other, other_balance = forward()
    second, _ = cross_entropy(other, labels)
    E, C = logits.shape[0], logits.shape[-1]
    scored = labels.reshape(E, -1) != IGNORE_INDEX  # (E, N)
    loss = (loss + second) / 2
    sums["loss"] = loss.detach() * sums["examples"]
    penalty = disagreement(logits.reshape(E, -1, C), other.reshape(E, -1, C), scored)  # (E,)
    return Step(loss + rdrop * penalty + (balance + other_balance) / 2, loss, sums, logits)


def non_finite_loss(step: int, last: Path | None, in_cross_entropy: bool, settings: dict) -> str:
    """What a run that stopped on a non-finite training objective says: which part was not finite, the settings
    that can cause it as they were set (the most suspect first), and truthfully what its checkpoints hold.
    settings: optim.lr, optim.weight_decay, optim.rdrop, optim.sam_rho and trainer.gradient_clip_val."""
    lr, decay = settings["optim.lr"], settings.get("optim.weight_decay") or 0
    suspects = []
    if lr * decay >= 1 and decay >= 1:  # an unusual decay that the step makes overshoot (a huge lr alone: the lr)
        suspects.append(
            f"optim.weight_decay={decay} (times optim.lr={lr}: {lr * decay:g} >= 1, each step overshoots zero and "
            "the weights grow)"
        )
    suspects += [f"{key}={settings[key]}" for key in ("optim.rdrop", "optim.sam_rho") if settings.get(key)]
    suspects.append(f"optim.lr={lr}")
    if not settings.get("trainer.gradient_clip_val"):
        suspects.append("trainer.gradient_clip_val=null (no clipping)")
    part = "cross-entropy" if in_cross_entropy or not settings.get("optim.rdrop") else "R-Drop term"
    saved = f"{last} holds the last validated epoch" if last else "no checkpoint was written before it"
    return (
        f"non-finite training objective at step {step} (its {part}); what can cause it, as set: "
        f"{', '.join(suspects)}; {saved}"
    )
