"""Per-head statistics of attention matrices, and head similarity. Pure torch.

A is one head's attention matrix for one example, rows = queries, as the attention's normaliser gives it (and
its mixing, and a differential head's subtraction): rows sum to 1 after softmax only. A row's `mass` is its sum
(1 - mass is what softmax1 or a sink gives to no key; sigmoid's may exceed 1; a differential head's is signed);
the statistics of where a row looks (entropy, confidence, distance) read its distribution P = |A| / sum |A|
(A itself after softmax); attn_self / prev / next / first are A's own entries (signed where A is). score_std is
the spread of the logits the normaliser was given, where they are known (headlab's probe records them), else
read back from log A (exact for the softmax family, whose log weights are the logits up to a shift per row).
Padding is excluded from both axes: padded keys carry exactly 0 weight, and padded queries are left out of every
average. Each statistic is computed per real query token, averaged over the real queries of an example, then over
examples. Shapes: B examples, L layers, H heads per layer, n positions.
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
    "mass",
)
GATE = "gate"  # an output gate's mean value, a statistic of the heads of a gated attention (beside STATISTICS)
ROUTE, LOAD = "route", "load"  # a mixture of heads' mean routing weight a head, and the share of positions it is on
RELEVANT = "relevant"  # the share of attention on the keys a query needs, where a task knows them (role_shares)


def measured(rows: list[dict]) -> list[str]:
    """The statistics a report's rows hold, in order: STATISTICS, then GATE (a gated attention), ROUTE and LOAD
    (a mixture of heads) and RELEVANT (a task that knows which keys a query needs)."""
    return [s for s in (*STATISTICS, GATE, ROUTE, LOAD, RELEVANT) if rows and s in rows[0]]


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


def distributions(weights: torch.Tensor) -> torch.Tensor:
    """Each row's distribution over the keys, P = |A| / sum |A|: (..., n) -> (..., n); A itself where rows are
    already distributions (softmax's), as computed: no rounding added. A row of zeros stays zeros."""
    if (weights >= 0).all() and ((weights.sum(-1) - 1).abs() < 1e-5).all():
        return weights
    magnitude = weights.abs()
    return magnitude / magnitude.sum(-1, keepdim=True).clamp(min=torch.finfo(magnitude.dtype).tiny)


def head_statistics(
    weights: torch.Tensor, padding_mask: torch.Tensor | None = None, scores: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """Every statistic of STATISTICS for one layer: weights (B, H, n, n), padding_mask (B, n), the normaliser's
    logits (B, H, n, n), or (B, H, c, n, n) for c maps a head, where known -> {name: (H,)}."""
    weights = weights.float()
    real = _real(padding_mask, weights)  # (B, n)
    n = weights.shape[-1]
    pos = torch.arange(n, device=weights.device)
    rows = distributions(weights)  # (B, H, n, n): where each query looks
    entropy = -torch.special.xlogy(rows, rows).sum(-1)  # (B, H, n), 0 log 0 = 0
    log_n = real.sum(-1).log()[:, None, None]  # (B, 1, 1): log of each example's real length
    offset = (pos[None, :] - pos[:, None]).abs().to(weights.dtype)  # (n, n): |i - j|
    diag = weights.diagonal(dim1=-2, dim2=-1)  # (B, H, n): A_ii
    keys = real[:, None, None, :]  # (B, 1, 1, n)
    if scores is None:  # softmax is shift-invariant: log A_ij = s_ij - logsumexp_j s_ij, so the spread of log A
        # over a query's real keys is that of its scores (weights below float32's tiny count as that gap)
        scores = weights.clamp(min=torch.finfo(torch.float32).tiny).log()  # (B, H, n, n), up to a shift per row
    elif scores.dim() == 5:  # c maps a head: each map's spread, averaged over its maps
        keys = keys[:, :, None]  # (B, 1, 1, 1, n)
    scores = scores.float().masked_fill(keys == 0, 0.0)  # padded keys' -inf (or finite logits) out of the sums
    centred = scores - (scores * keys).sum(-1, keepdim=True) / keys.sum(-1, keepdim=True).clamp(min=1)
    spread = ((centred**2 * keys).sum(-1) / keys.sum(-1).clamp(min=1)).sqrt()  # (B, H, n) or (B, H, c, n)
    per_query = {
        "entropy": entropy,
        "entropy_normalised": torch.where(log_n > 0, entropy / log_n.clamp(min=1e-12), torch.zeros_like(entropy)),
        "confidence": rows.amax(-1),
        "distance": (rows * offset).sum(-1),
        "attn_self": diag,
        "attn_prev": F.pad(weights.diagonal(offset=-1, dim1=-2, dim2=-1), (1, 0)),  # A_i,i-1; 0 for i = 0
        "attn_next": F.pad(weights.diagonal(offset=1, dim1=-2, dim2=-1), (0, 1)),  # A_i,i+1; 0 for the last
        "attn_first": weights[..., 0],
        "score_std": spread if spread.dim() == 3 else spread.mean(2),
        "mass": weights.sum(-1),
    }
    return {name: _average(value, real) for name, value in per_query.items()}


def head_similarity(weights: list[torch.Tensor], padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Jensen-Shannon divergence (nats, at most ln 2) between every pair of heads over all layers, averaged like the
    statistics: (L*H, L*H). weights: one (B, H, n, n) tensor per layer; head (l, h) is row/column l * H + h.

    Per query, JS(p, q) = H(m) - (H(p) + H(q)) / 2 with m = (p + q) / 2 and H(p) = -sum p log p: each head's own
    sum once, one sum a pair (symmetric: each pair once). In float64: the midpoint of a float32 weight below 2 * its
    smallest normal would otherwise round to 0 and the divergence be infinite.
    """
    heads = torch.cat([distributions(w.float()) for w in weights], dim=1).double()  # (B, T, n, n), T = L * H
    real = _real(padding_mask, heads)  # (B, n)
    p_log_p = torch.special.xlogy(heads, heads).sum(-1)  # (B, T, n): -H(p), 0 log 0 = 0
    T = heads.shape[1]
    similarity = heads.new_zeros(T, T)
    for a in range(T):  # head a against heads a..T-1
        m = 0.5 * (heads[:, a : a + 1] + heads[:, a:])  # (B, T - a, n, n)
        js = 0.5 * (p_log_p[:, a : a + 1] + p_log_p[:, a:]) - torch.special.xlogy(m, m).sum(-1)  # (B, T - a, n)
        similarity[a, a:] = similarity[a:, a] = _average(js, real)
    return similarity.float()


def gate_means(gates: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """An output gate's mean value per head over the real positions (and channels): (B, H, n, g) -> (H,)."""
    per_query = gates.float().mean(-1)  # (B, H, n)
    B, _, n = per_query.shape
    real = per_query.new_ones(B, n) if padding_mask is None else (~padding_mask).to(per_query.dtype)
    return _average(per_query, real)


def head_report(
    weights: list[torch.Tensor],
    padding_mask: torch.Tensor | None = None,
    scores: list[torch.Tensor] | None = None,
    gates: list[torch.Tensor] | None = None,
    routes: list[torch.Tensor] | None = None,
) -> dict:
    """Statistics of every head of every layer: {"rows": [{"layer", "head", stat: value}], "similarity"}; scores:
    each layer's logits (head_statistics); gates: each layer's output gates (B, H, n, g), which add GATE; routes:
    each layer's mixture-of-heads weights (B, H, n, 1), which add ROUTE and LOAD."""
    rows = []
    for layer, w in enumerate(weights):
        stats = head_statistics(w, padding_mask, None if scores is None else scores[layer])
        if gates is not None:
            stats[GATE] = gate_means(gates[layer], padding_mask)
        if routes is not None:
            stats[ROUTE] = gate_means(routes[layer], padding_mask)
            stats[LOAD] = gate_means((routes[layer] > 0).float(), padding_mask)
        for h in range(w.shape[1]):
            rows.append({"layer": layer, "head": h, **{s: float(v[h]) for s, v in stats.items()}})
    return {"rows": rows, "similarity": head_similarity(weights, padding_mask)}


def role_shares(weights: list[torch.Tensor], roles: torch.Tensor, counted: torch.Tensor, n_roles: int) -> torch.Tensor:
    """Where each head looks, summarised over many queries: the share of attention each key role receives (of
    each row's distribution P), averaged over the counted queries of all examples. weights: per layer (B, H, n,
    n); roles (B, n, n) the role of key j for query i (0 .. n_roles - 1); counted (B, n) bool -> (L, H, n_roles),
    each row summing to 1."""
    one_hot = torch.nn.functional.one_hot(roles.long(), n_roles).to(weights[0].dtype)  # (B, n, n, R)
    queries = counted.to(weights[0].dtype)  # (B, n)
    out = []
    for w in weights:
        per_query = torch.einsum("bhqk,bqkr->bhqr", distributions(w.float()), one_hot.float())  # (B, H, n, R)
        out.append((per_query * queries[:, None, :, None]).sum((0, 2)) / queries.sum().clamp(min=1))  # (H, R)
    return torch.stack(out)  # (L, H, R)
