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


class AdditiveScores(torch.autograd.Function):
    """Bahdanau scores in chunks of queries, recomputing tanh in the backward pass instead of storing it.

    Peak memory is one chunk of (B, H, chunk, n, d_k) rather than the whole (B, H, n, n, d_k) tensor.
    """

    CHUNK_ELEMENTS = 1 << 23  # per chunk of the hidden tensor: 32 MiB in fp32

    @staticmethod
    def _chunk(q: torch.Tensor, k: torch.Tensor) -> int:
        B, H, n, d = q.shape
        return max(1, AdditiveScores.CHUNK_ELEMENTS // max(1, B * H * k.shape[2] * d))

    @staticmethod
    def forward(ctx, q, k, w):  # q (B, H, n, d_k), k (B, H, m, d_k), w (H, d_k) -> (B, H, n, m)
        ctx.save_for_backward(q, k, w)
        step = AdditiveScores._chunk(q, k)
        w_ = w[None, :, None, :, None]  # (1, H, 1, d_k, 1)
        out = [torch.tanh(qc.unsqueeze(3) + k.unsqueeze(2)) @ w_ for qc in q.split(step, dim=2)]
        return torch.cat(out, dim=2).squeeze(-1)

    @staticmethod
    def backward(ctx, grad):  # grad (B, H, n, m)
        q, k, w = ctx.saved_tensors
        step = AdditiveScores._chunk(q, k)
        grad_q, grad_k, grad_w = [], torch.zeros_like(k), torch.zeros_like(w)
        for qc, gc in zip(q.split(step, dim=2), grad.split(step, dim=2), strict=True):
            t = torch.tanh(qc.unsqueeze(3) + k.unsqueeze(2))  # (B, H, c, m, d_k), recomputed
            g = gc.unsqueeze(-1)  # (B, H, c, m, 1)
            grad_w += (g * t).sum(dim=(0, 2, 3))  # (H, d_k)
            pre = g * w[None, :, None, None, :] * (1 - t * t)  # d score / d (q_i + k_j): (B, H, c, m, d_k)
            grad_q.append(pre.sum(dim=3))  # (B, H, c, d_k)
            grad_k += pre.sum(dim=2)  # (B, H, m, d_k)
        return torch.cat(grad_q, dim=2), grad_k, grad_w


def additive_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Bahdanau scores w_h^T tanh(q_i + k_j): q (B, H, n, d_k), k (B, H, m, d_k), w (H, d_k) -> (B, H, n, m)."""
    return AdditiveScores.apply(q, k, w)


class MultiHeadAttention(nn.Module):
    """Self-attention with H heads of query/key size d_k and value size d_v, dot or additive scoring.

    forward(x, key_padding_mask, need_weights, head_mask) -> (out, weights):
      x (B, n, d_model); key_padding_mask (B, n) bool, True = padding;
      head_mask (H,) or (B, H), a multiplier on each head's output (Michel et al. 2019);
      out (B, n, d_model); weights (B, H, n, n) after softmax, exactly 0 on padded keys, or None.
    Without weights, dot scoring runs on torch's fused scaled_dot_product_attention.
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

        if self.scoring == "dot" and not need_weights:
            keep = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]  # (B, 1, 1, n)
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=keep, dropout_p=p_drop, scale=self.scale, enable_gqa=G < H
            )  # (B, H, n, d_v)
            weights = None
        else:
            if G < H:  # each key/value head serves H / G consecutive query heads
                k = k.repeat_interleave(H // G, dim=1)  # (B, H, n, d_k)
                v = v.repeat_interleave(H // G, dim=1)  # (B, H, n, d_v)
            if self.scoring == "dot":
                scores = (q @ k.transpose(-2, -1)) * self.scale  # (B, H, n, n)
            else:
                scores = additive_scores(q, k, self.score_vector)  # (B, H, n, n)
            if key_padding_mask is not None:
                scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
            weights = scores.softmax(dim=-1)  # (B, H, n, n)
            y = F.dropout(weights, p_drop) @ v  # (B, H, n, d_v)

        if head_mask is not None:
            y = y * head_mask.reshape(-1, H, 1, 1).to(y.dtype)  # (H,) or (B, H) -> broadcast over n, d_v
        out = self.out_proj(y.transpose(1, 2).reshape(B, n, H * self.d_v))  # (B, n, d_model)
        return out, (weights if need_weights else None)
