"""Multi-head attention whose head split is fully configurable.

Notation (used in every shape comment): B batch, n sequence length, H query heads,
G key/value heads (H % G == 0; G = H is ordinary multi-head attention, G = 1 multi-query),
d_k per-head query/key size, d_v per-head value size.

Two scoring functions give the attention logits of head h for query i and key j:
  dot       q_i . k_j / sqrt(d_k)          (Vaswani et al. 2017; unscaled with scale=False)
  additive  w_h^T tanh(q_i + k_j)          (Bahdanau et al. 2015, one learned w_h per head)
Both are followed by a softmax over the real (non-padded) keys. forward() is the definition; where a faster
equivalent path exists (fused SDPA, fused additive attention, native kernels), headlab.model.dispatch takes it.
"""

import math

import torch
from torch import nn

from headlab.conventions import CHOICES
from headlab.model import dispatch
from headlab.model.dropout import dropout

SCORINGS = CHOICES["model.attention.scoring"]


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


class MultiHeadAttention(nn.Module):
    """Self-attention with H heads of query/key size d_k and value size d_v, dot or additive scoring.

    forward(x, key_padding_mask, need_weights, head_mask) -> (out, weights):
      x (B, n, d_model); key_padding_mask (B, n) bool, True = padding;
      head_mask (H,) or (B, H), a multiplier on each head's output (Michel et al. 2019);
      out (B, n, d_model); weights (B, H, n, n) after softmax, exactly 0 on padded keys, or None.
    Without weights asked for, fused paths that never store the (B, H, n, n) weights may run (dispatch).
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
        if not need_weights and (y := dispatch.fused_attention(self, q, k, v, key_padding_mask, p_drop)) is not None:
            return self._merge_heads(y, head_mask), None

        if G < H:  # each key/value head serves H / G consecutive query heads
            k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)  # (B, H, n, d_k / d_v)
        scores = self.scores(q, k)  # (B, H, n, n)
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        weights = scores.softmax(dim=-1)  # (B, H, n, n)
        y = dropout(weights, p_drop) @ v  # (B, H, n, d_v)
        return self._merge_heads(y, head_mask), (weights if need_weights else None)

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Attention logits of every query and key: q (B, H, n, d_k), k (B, H, m, d_k) -> (B, H, n, m)."""
        if self.scoring == "dot":
            return (q @ k.transpose(-2, -1)) * self.scale
        return dispatch.additive_scores(q, k, self.score_vector)

    def _merge_heads(self, y: torch.Tensor, head_mask: torch.Tensor | None) -> torch.Tensor:
        """Mask heads, concatenate them and project: y (B, H, n, d_v) -> (B, n, d_model)."""
        B, H, n, _ = y.shape
        if head_mask is not None:
            y = y * head_mask.reshape(-1, H, 1, 1).to(y.dtype)  # (H,) or (B, H) -> broadcast over n, d_v
        return self.out_proj(y.transpose(1, 2).reshape(B, n, H * self.d_v))  # (B, n, d_model)
