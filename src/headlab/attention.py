"""Multi-head attention whose head split is fully configurable.

Notation (used in every shape comment): B batch, n sequence length, H query heads,
G key/value heads (H % G == 0; G = H is ordinary multi-head attention, G = 1 multi-query),
d_k per-head query/key size, d_v per-head value size.

Two scoring functions give the attention logits of head h for query i and key j:
  dot       q_i . k_j / sqrt(d_k)          (Vaswani et al. 2017; unscaled with scale=False)
  additive  w_h^T tanh(q_i + k_j)          (Bahdanau et al. 2015, one learned w_h per head)
Both are followed by a softmax over the real (non-padded) keys.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from headlab import kernels
from headlab.dropout import dropout

SCORINGS = ("dot", "additive")


def head_sizes(
    d_model: int, n_heads: int, d_k: int | None, d_v: int | None, n_kv_heads: int | None
) -> tuple[int, int, int]:
    """Resolve (d_k, d_v, n_kv_heads) from the defaults, or say why the combination is impossible."""
    if n_heads < 1:
        raise ValueError(f"n_heads={n_heads} must be >= 1")
    if d_k is None:
        if d_model % n_heads:
            raise ValueError(
                f"d_model={d_model} is not divisible by n_heads={n_heads}; "
                "choose n_heads dividing d_model or set d_k explicitly"
            )
        d_k = d_model // n_heads
    d_v = d_k if d_v is None else d_v
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if d_k < 1 or d_v < 1:
        raise ValueError(f"d_k={d_k} and d_v={d_v} must be >= 1")
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads={n_kv_heads} must be >= 1 and divide n_heads={n_heads}")
    return d_k, d_v, n_kv_heads


def additive_scores_naive(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Bahdanau scores w_h^T tanh(q_i + k_j), the obvious way: autograd keeps a (B, H, n, n, d_k) tensor."""
    hidden = torch.tanh(q.unsqueeze(3) + k.unsqueeze(2))  # (B, H, n, n, d_k)
    return torch.einsum("bhijd,hd->bhij", hidden, w)


FUSED_ABOVE = 1 << 22  # additive attention without weights is fused once (B, H, n, n) weights exceed 16 MiB fp32;
# below, storing them is cheaper than recomputing the scores in the backward pass (BENCHMARKS.md)
CHUNK_ELEMENTS = 1 << 20  # elements of the (B, H, chunk, m, d_k) hidden tensor per chunk of queries: 4 MiB fp32


def _query_chunks(q: torch.Tensor, k: torch.Tensor, fused: bool) -> int:
    """Queries per chunk, so that one chunk of tanh(q_i + k_j), (B, H, c, m, d_k), stays within CHUNK_ELEMENTS (and
    in cache). The native kernels never store it: one chunk, or in the fused path chunks of (B, H, c, m) scores."""
    B, H, n, d = q.shape
    if kernels.additive_applies(q):
        return max(1, CHUNK_ELEMENTS // max(1, B * H * k.shape[2])) if fused else n
    return max(1, CHUNK_ELEMENTS // max(1, B * H * k.shape[2] * d))


def _hidden(qc: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """tanh(q_i + k_j) for a chunk of c queries: qc (B, H, c, d_k), k (B, H, m, d_k) -> (B, H, c, m, d_k)."""
    return torch.add(qc.unsqueeze(3), k.unsqueeze(2)).tanh_()


def _scores(hidden: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """w_h^T hidden: (B, H, c, m, d_k) -> (B, H, c, m), one matrix-vector product per (b, h)."""
    B, H, c, m, d = hidden.shape
    return (hidden.view(B, H, c * m, d) @ w.view(1, H, d, 1)).view(B, H, c, m)


def _grads(hidden: torch.Tensor, w: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Backward of _scores(_hidden(qc, k), w) for grad (B, H, c, m): grads of (qc, k, w). Overwrites hidden.
    With t = tanh(q_i + k_j): d q_i = w * sum_j grad_ij (1 - t_ij^2), and d k_j alike over i."""
    B, H, c, m, d = hidden.shape
    grad_w = (grad.reshape(B, H, 1, c * m) @ hidden.view(B, H, c * m, d)).sum(0).view(H, d)
    squared = hidden.square_()  # (B, H, c, m, d_k)
    g_t2_q = grad.reshape(B * H * c, 1, m) @ squared.view(B * H * c, m, d)  # sum_j grad_ij t_ij^2: one bmm
    g_t2_k = squared.mul_(grad.unsqueeze(-1)).sum(2)  # sum_i grad_ij t_ij^2: (B, H, m, d_k)
    w_ = w.view(1, H, 1, d)
    grad_k = (grad.sum(2).unsqueeze(-1) - g_t2_k) * w_
    return (grad.sum(3).unsqueeze(-1) - g_t2_q.view(B, H, c, d)) * w_, grad_k, grad_w  # grad_q (B, H, c, d_k)


def _chunk_scores(qc: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores of a chunk of queries, (B, H, c, m), and the chunk's hidden tensor where torch ops made one (the
    native kernels, headlab.kernels, never do)."""
    if kernels.additive_applies(qc):
        return kernels.additive_scores(qc, k, w), None
    hidden = _hidden(qc, k)  # (B, H, c, m, d_k)
    return _scores(hidden, w), hidden


def _chunk_grads(qc, k, w, grad, hidden=None) -> tuple[torch.Tensor, ...]:
    """Grads of (qc, k, w) for the gradient (B, H, c, m) of _chunk_scores(qc, k, w), reusing its hidden if any."""
    if kernels.additive_applies(qc):
        return kernels.additive_grads(qc, k, w, grad)
    return _grads(_hidden(qc, k) if hidden is None else hidden, w, grad)


class AdditiveScores(torch.autograd.Function):
    """Bahdanau scores, recomputing tanh in the backward pass instead of storing it: the (B, H, n, m, d_k) hidden
    tensor never exists whole (torch ops make it one chunk of queries at a time; the native kernels never do)."""

    @staticmethod
    def forward(ctx, q, k, w):  # q (B, H, n, d_k), k (B, H, m, d_k), w (H, d_k) -> (B, H, n, m)
        q, k = q.contiguous(), k.contiguous()  # chunks of the hidden tensor then come out contiguous
        ctx.save_for_backward(q, k, w)
        return torch.cat([_chunk_scores(qc, k, w)[0] for qc in q.split(_query_chunks(q, k, fused=False), dim=2)], dim=2)

    @staticmethod
    def backward(ctx, grad):  # grad (B, H, n, m)
        q, k, w = ctx.saved_tensors
        step = _query_chunks(q, k, fused=False)
        grad_k, grad_w, grad_q = torch.zeros_like(k), torch.zeros_like(w), []
        for qc, gc in zip(q.split(step, dim=2), grad.split(step, dim=2), strict=True):
            gq, gk, gw = _chunk_grads(qc, k, w, gc)
            grad_q.append(gq)
            grad_k += gk
            grad_w += gw
        return torch.cat(grad_q, dim=2), grad_k, grad_w


def additive_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Bahdanau scores w_h^T tanh(q_i + k_j): q (B, H, n, d_k), k (B, H, m, d_k), w (H, d_k) -> (B, H, n, m)."""
    return AdditiveScores.apply(q, k, w)


class AdditiveAttention(torch.autograd.Function):
    """softmax(w_h^T tanh(q_i + k_j) + bias_j) @ v, fused and chunked over queries like FlashAttention: only q, k,
    v, the output and each query's log-sum-exp are kept; the backward pass recomputes scores and weights chunk by
    chunk. Neither the (B, H, n, m, d_k) hidden tensor nor the (B, H, n, m) weights ever exist whole."""

    @staticmethod
    def forward(ctx, q, k, v, w, bias):  # v (B, H, m, d_v); bias (B, 1, 1, m): 0, or -inf on padded keys
        q, k = q.contiguous(), k.contiguous()  # chunks of the hidden tensor then come out contiguous
        outs, lses = [], []
        for qc in q.split(_query_chunks(q, k, fused=True), dim=2):
            scores = _chunk_scores(qc, k, w)[0] + bias  # (B, H, c, m)
            lse = scores.logsumexp(dim=-1, keepdim=True)  # (B, H, c, 1)
            outs.append(scores.sub_(lse).exp_() @ v)  # (B, H, c, d_v)
            lses.append(lse)
        out, lse = torch.cat(outs, dim=2), torch.cat(lses, dim=2)
        ctx.save_for_backward(q, k, v, w, bias, out, lse)
        return out  # (B, H, n, d_v)

    @staticmethod
    def backward(ctx, grad_out):  # grad_out (B, H, n, d_v)
        q, k, v, w, bias, out, lse = ctx.saved_tensors
        step = _query_chunks(q, k, fused=True)
        delta = (grad_out * out).sum(-1, keepdim=True)  # (B, H, n, 1): sum_j p_ij dp_ij
        grad_k, grad_v, grad_w, grad_q = torch.zeros_like(k), torch.zeros_like(v), torch.zeros_like(w), []
        for i in range(0, q.shape[2], step):
            go = grad_out[:, :, i : i + step]
            qc = q[:, :, i : i + step]
            scores, hidden = _chunk_scores(qc, k, w)  # (B, H, c, m)
            p = (scores + bias).sub_(lse[:, :, i : i + step]).exp_()  # (B, H, c, m)
            grad_v += p.transpose(-2, -1) @ go
            grad_scores = p.mul_(go @ v.transpose(-2, -1) - delta[:, :, i : i + step])  # softmax backward
            gq, gk, gw = _chunk_grads(qc, k, w, grad_scores, hidden)
            grad_q.append(gq)
            grad_k += gk
            grad_w += gw
        return torch.cat(grad_q, dim=2), grad_k, grad_v, grad_w, None


class MultiHeadAttention(nn.Module):
    """Self-attention with H heads of query/key size d_k and value size d_v, dot or additive scoring.

    forward(x, key_padding_mask, need_weights, head_mask) -> (out, weights):
      x (B, n, d_model); key_padding_mask (B, n) bool, True = padding;
      head_mask (H,) or (B, H), a multiplier on each head's output (Michel et al. 2019);
      out (B, n, d_model); weights (B, H, n, n) after softmax, exactly 0 on padded keys, or None.
    Without weights, dot scoring runs on torch's fused scaled_dot_product_attention, and additive scoring (with
    attention dropout 0) on the fused AdditiveAttention: neither stores the (B, H, n, n) weights. With attention
    dropout on the CPU, where SDPA would fall back to its unfused path and torch's slow dropout mask, dot scoring
    takes the explicit path with headlab's dropout (headlab.dropout): the same memory, and one layer's forward
    and backward 1.2x faster at B 32, n 128, d_model 128.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_k: int | None = None,
        d_v: int | None = None,
        n_kv_heads: int | None = None,
        scoring: str = "dot",
        scale: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        if scoring not in SCORINGS:
            raise ValueError(f"scoring={scoring!r} is unknown; choose one of {', '.join(SCORINGS)}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout} must be in [0, 1)")
        self.d_k, self.d_v, self.n_kv_heads = head_sizes(d_model, n_heads, d_k, d_v, n_kv_heads)
        self.n_heads, self.scoring, self.dropout = n_heads, scoring, dropout
        self.scale = 1.0 / math.sqrt(self.d_k) if scale else 1.0
        self.q_proj = nn.Linear(d_model, n_heads * self.d_k)
        self.k_proj = nn.Linear(d_model, self.n_kv_heads * self.d_k)
        self.v_proj = nn.Linear(d_model, self.n_kv_heads * self.d_v)
        self.out_proj = nn.Linear(n_heads * self.d_v, d_model)
        if scoring == "additive":
            self.score_vector = nn.Parameter(torch.randn(n_heads, self.d_k) / math.sqrt(self.d_k))

    def forward(
        self,
        x: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        head_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, n, _ = x.shape
        H, G = self.n_heads, self.n_kv_heads
        q = self.q_proj(x).view(B, n, H, self.d_k).transpose(1, 2)  # (B, H, n, d_k)
        k = self.k_proj(x).view(B, n, G, self.d_k).transpose(1, 2)  # (B, G, n, d_k)
        v = self.v_proj(x).view(B, n, G, self.d_v).transpose(1, 2)  # (B, G, n, d_v)
        p_drop = self.dropout if self.training else 0.0

        if self.scoring == "dot" and not need_weights and (p_drop == 0 or x.device.type != "cpu"):
            keep = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]  # (B, 1, 1, n)
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=keep, dropout_p=p_drop, scale=self.scale, enable_gqa=G < H
            )  # (B, H, n, d_v)
            return self._merge_heads(y, head_mask), None
        if G < H:  # each key/value head serves H / G consecutive query heads
            k = k.repeat_interleave(H // G, dim=1)  # (B, H, n, d_k)
            v = v.repeat_interleave(H // G, dim=1)  # (B, H, n, d_v)
        if not need_weights and p_drop == 0 and B * H * n * n > FUSED_ABOVE:  # additive, fused: no (B, H, n, n)
            bias = torch.zeros(B, 1, 1, n, dtype=q.dtype, device=q.device)
            if key_padding_mask is not None:
                bias = bias.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
            y = AdditiveAttention.apply(q, k, v, self.score_vector, bias)  # (B, H, n, d_v)
            return self._merge_heads(y, head_mask), None
        if self.scoring == "dot":
            scores = (q @ k.transpose(-2, -1)) * self.scale  # (B, H, n, n)
        else:
            scores = additive_scores(q, k, self.score_vector)  # (B, H, n, n)
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        weights = scores.softmax(dim=-1)  # (B, H, n, n)
        y = dropout(weights, p_drop) @ v  # (B, H, n, d_v)
        return self._merge_heads(y, head_mask), (weights if need_weights else None)

    def _merge_heads(self, y: torch.Tensor, head_mask: torch.Tensor | None) -> torch.Tensor:
        """Mask heads, concatenate them and project: y (B, H, n, d_v) -> (B, n, d_model)."""
        B, H, n, _ = y.shape
        if head_mask is not None:
            y = y * head_mask.reshape(-1, H, 1, 1).to(y.dtype)  # (H,) or (B, H) -> broadcast over n, d_v
        return self.out_proj(y.transpose(1, 2).reshape(B, n, H * self.d_v))  # (B, n, d_model)
