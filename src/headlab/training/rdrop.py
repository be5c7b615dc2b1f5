"""R-Drop (Liang et al. 2021): every training batch runs through the model twice, under different dropout masks,
and the loss adds how much the two predictions disagree, so that they cannot hang on which units dropout removed.

    loss = (CE(p1) + CE(p2)) / 2 + alpha * (KL(p1 || p2) + KL(p2 || p1)) / 2

Twice the compute of a plain step. Accuracy and the logged loss are the cross-entropy's (train/loss: its mean
over the two passes).
"""

import torch


def disagreement(a: torch.Tensor, b: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """(KL(p_a || p_b) + KL(p_b || p_a)) / 2 averaged over the scored positions, p = softmax of the logits:
    a, b (..., N, C), scored (..., N) bool -> (...)."""
    log_a, log_b = a.log_softmax(-1), b.log_softmax(-1)  # (..., N, C)
    kl = ((log_a.exp() - log_b.exp()) * (log_a - log_b)).sum(-1) / 2  # (..., N): the symmetric KL's mean
    return torch.where(scored, kl, 0).sum(-1) / scored.sum(-1).clamp(min=1)
