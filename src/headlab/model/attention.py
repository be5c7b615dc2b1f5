"""Multi-head attention whose head split is fully configurable.

Notation (used in every shape comment): B batch, n sequence length, H query heads,
G key/value heads (H % G == 0; G = H is ordinary multi-head attention, G = 1 multi-query),
d_k per-head query/key size, d_v per-head value size.

A scoring function (headlab.model.scoring: dot, additive, or one a package registers) gives the attention logits
of head h for query i and key j; a softmax over the real (non-padded) keys follows. forward() is the definition;
where the scoring function has a faster equivalent path (fused SDPA, fused additive attention), it takes it.
"""

import math

import torch
from torch import nn

from headlab.errors import InvalidSetting
from headlab.model import rules
from headlab.model.dropout import dropout


class MultiHeadAttention(nn.Module):
    """Self-attention with H heads of query/key size d_k and value size d_v, scored by the scoring function named.

    forward(x, key_padding_mask, need_weights, head_mask) -> (out, weights):
      x (B, n, d_model); key_padding_mask (B, n) bool, True = padding;
      head_mask (H,) or (B, H), a multiplier on each head's output (Michel et al. 2019);
      out (B, n, d_model); weights (B, H, n, n) after softmax, exactly 0 on padded keys, or None.
    Without weights asked for, fused paths that never store the (B, H, n, n) weights may run (dispatch).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        d_k: int | None = None,
        d_v: int | None = None,
        n_kv_heads: int | None = None,
        scoring: str = "dot",
        scale: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise InvalidSetting("dropout", dropout, "a number in [0, 1)")
        self.d_k, self.d_v, self.n_kv_heads = rules.head_sizes(d_model, n_heads, d_k, d_v, n_kv_heads)
        self.scoring_fn = rules.load_scoring(scoring)  # a class of headlab.model.scoring (or a package's)
        self.n_heads, self.scoring, self.dropout = n_heads, scoring, dropout
        self.scale = 1.0 / math.sqrt(self.d_k) if scale else 1.0
        self.q_proj = nn.Linear(d_model, n_heads * self.d_k)
        self.k_proj = nn.Linear(d_model, self.n_kv_heads * self.d_k)
        self.v_proj = nn.Linear(d_model, self.n_kv_heads * self.d_v)
        self.out_proj = nn.Linear(n_heads * self.d_v, d_model)
        self.scoring_fn.add_parameters(self)

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
        if not need_weights and (y := self.scoring_fn.fused(self, q, k, v, key_padding_mask, p_drop)) is not None:
            return self._merge_heads(y, head_mask), None

        if G < H:  # each key/value head serves H / G consecutive query heads
            k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)  # (B, H, n, d_k / d_v)
        scores = self.scoring_fn.scores(self, q, k)  # (B, H, n, n)
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
