"""Per-head statistics of attention matrices, and head similarity. Pure torch.

A is one head's attention matrix for one example after softmax, rows = queries. Padding is excluded from both
axes: padded keys carry exactly 0 weight, and padded queries are left out of every average. Each statistic is
computed per real query token, averaged over the real queries of an example, then over examples.
Shapes: B examples, L layers, H heads per layer, n positions.
"""

import torch
import torch.nn.functional as F

STATISTICS = (
    "entropy",
    "entropy_normalised",
    "confidence",
    "distance",
    "attn_self",
    "attn_prev",
    "attn_next",
    "attn_first",
    "score_std",
)


def _real(padding_mask: torch.Tensor | None, weights: torch.Tensor) -> torch.Tensor:
    """(B, n) float mask of real tokens."""
    B, _, n, _ = weights.shape
    if padding_mask is None:
        return weights.new_ones(B, n)
    return (~padding_mask).to(weights.dtype)


def _average(per_query: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """(B, H, n) values per query -> (H,): mean over real queries of each example, then over examples."""
    per_example = (per_query * real[:, None, :]).sum(-1) / real.sum(-1, keepdim=True).clamp(min=1)  # (B, H)
    return per_example.mean(0)


def head_statistics(weights: torch.Tensor, padding_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Every statistic of STATISTICS for one layer: weights (B, H, n, n), padding_mask (B, n) -> {name: (H,)}."""
    weights = weights.float()
    real = _real(padding_mask, weights)  # (B, n)
    n = weights.shape[-1]
    pos = torch.arange(n, device=weights.device)
    entropy = -torch.special.xlogy(weights, weights).sum(-1)  # (B, H, n), 0 log 0 = 0
    log_n = real.sum(-1).log()[:, None, None]  # (B, 1, 1): log of each example's real length
    offset = (pos[None, :] - pos[:, None]).abs().to(weights.dtype)  # (n, n): |i - j|
    diag = weights.diagonal(dim1=-2, dim2=-1)  # (B, H, n): A_ii
    # softmax is shift-invariant: log A_ij = s_ij - logsumexp_j s_ij, so the spread of log A over a query's real
    # keys is that of its scores s_ij (weights below float32's tiny, a score gap beyond ~87, count as that gap)
    scores = weights.clamp(min=torch.finfo(torch.float32).tiny).log()  # (B, H, n, n), up to a shift per row
    keys = real[:, None, None, :]  # (B, 1, 1, n)
    centred = scores - (scores * keys).sum(-1, keepdim=True) / keys.sum(-1, keepdim=True).clamp(min=1)
    per_query = {
        "entropy": entropy,
        "entropy_normalised": torch.where(log_n > 0, entropy / log_n.clamp(min=1e-12), torch.zeros_like(entropy)),
        "confidence": weights.amax(-1),
        "distance": (weights * offset).sum(-1),
        "attn_self": diag,
        "attn_prev": F.pad(weights.diagonal(offset=-1, dim1=-2, dim2=-1), (1, 0)),  # A_i,i-1; 0 for i = 0
        "attn_next": F.pad(weights.diagonal(offset=1, dim1=-2, dim2=-1), (0, 1)),  # A_i,i+1; 0 for the last
        "attn_first": weights[..., 0],
        "score_std": ((centred**2 * keys).sum(-1) / keys.sum(-1).clamp(min=1)).sqrt(),
    }
    return {name: _average(value, real) for name, value in per_query.items()}


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence (nats, at most ln 2) between distributions on the last axis."""
    m = 0.5 * (p + q)
    kl = lambda a: (torch.special.xlogy(a, a) - torch.special.xlogy(a, m)).sum(-1)
    return 0.5 * kl(p) + 0.5 * kl(q)


def head_similarity(weights: list[torch.Tensor], padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """JS divergence between every pair of heads over all layers, averaged like the statistics: (L*H, L*H).

    weights: one (B, H, n, n) tensor per layer; head (l, h) is row/column l * H + h.
    """
    heads = torch.cat([w.float() for w in weights], dim=1)  # (B, T, n, n), T = L * H
    real = _real(padding_mask, heads)  # (B, n)
    rows = [_average(js_divergence(heads[:, a : a + 1], heads), real) for a in range(heads.shape[1])]
    return torch.stack(rows)  # (T, T)


def head_report(weights: list[torch.Tensor], padding_mask: torch.Tensor | None = None) -> dict:
    """Statistics of every head of every layer: {"rows": [{"layer", "head", stat: value}], "similarity"}."""
    rows = []
    for layer, w in enumerate(weights):
        stats = head_statistics(w, padding_mask)
        for h in range(w.shape[1]):
            rows.append({"layer": layer, "head": h, **{s: float(stats[s][h]) for s in STATISTICS}})
    return {"rows": rows, "similarity": head_similarity(weights, padding_mask)}


def role_shares(weights: list[torch.Tensor], roles: torch.Tensor, counted: torch.Tensor, n_roles: int) -> torch.Tensor:
    """Where each head looks, summarised over many queries: the share of attention each key role receives,
    averaged over the counted queries of all examples. weights: per layer (B, H, n, n); roles (B, n, n) the role
    of key j for query i (0 .. n_roles - 1); counted (B, n) bool -> (L, H, n_roles), each row summing to 1."""
    one_hot = torch.nn.functional.one_hot(roles.long(), n_roles).to(weights[0].dtype)  # (B, n, n, R)
    queries = counted.to(weights[0].dtype)  # (B, n)
    out = []
    for w in weights:
        per_query = torch.einsum("bhqk,bqkr->bhqr", w.float(), one_hot.float())  # (B, H, n, R)
        out.append((per_query * queries[:, None, :, None]).sum((0, 2)) / queries.sum().clamp(min=1))  # (H, R)
    return torch.stack(out)  # (L, H, R)
