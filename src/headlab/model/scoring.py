"""Scoring functions: how a head turns query i and key j into an attention logit. A table of them, by name.

    dot       q_i . k_j / sqrt(d_k)          (Vaswani et al. 2017; unscaled with scale=False)
    additive  w_h^T tanh(q_i + k_j)          (Bahdanau et al. 2015, one learned w_h per head)

A scoring function is a subclass of Scoring. `scores` is its definition; `fused` may give softmax(scores) @ v by a
path that never stores the (B, H, n, m) weights (None: the explicit path runs); `add_parameters` registers its
learned tensors on the attention module (their names are the checkpoint's); `zero_key_logit` says that a key of
zeros scores 0 for every query (the softmax1 normaliser's fused path rests on it); `dot_product` that a logit is
q . k times attn.scale (the neuron view shows those vectors). A differential head's two
components are scored one after the other, both with the head's parameters. The table is the entry-point group
headlab.scoring (pyproject.toml), so an installed package adds one for every process; register_scoring adds one
in this process. MultiHeadAttention(scoring=name) looks a name up, and an unknown name raises (headlab.model.rules).
Shapes: B batch, H heads, n queries, m keys, d_k per-head query/key size, d_v value size.
"""

import math

import torch
from torch import nn

from headlab.model import dispatch


class Scoring:
    """The interface (and the defaults: no parameters, no fused path). `attn` is the MultiHeadAttention."""

    zero_key_logit = False
    dot_product = False

    @staticmethod
    def add_parameters(attn: nn.Module) -> None:
        """Register this scoring's learned tensors on attn (attn.d_k, attn.n_heads are set)."""

    @staticmethod
    def scores(attn: nn.Module, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Logits of every query and key: q (B, H, n, d_k), k (B, H, m, d_k) -> (B, H, n, m)."""
        raise NotImplementedError

    @staticmethod
    def fused(attn, q, k, v, key_padding_mask, p_drop: float) -> torch.Tensor | None:
        """softmax(scores) @ v, (B, H, n, d_v), without storing the weights; None where the explicit path runs.
        k and v have G key/value heads (B, G, m, ·); key_padding_mask (B, m), True = padding."""
        return None


class Dot(Scoring):
    zero_key_logit = True  # q . 0 = 0
    dot_product = True

    @staticmethod
    def scores(attn, q, k):
        return (q @ k.transpose(-2, -1)) * attn.scale

    @staticmethod
    def fused(attn, q, k, v, key_padding_mask, p_drop):
        return dispatch.dot_attention(q, k, v, key_padding_mask, p_drop, attn.scale)


class Additive(Scoring):
    @staticmethod
    def add_parameters(attn):
        attn.score_vector = nn.Parameter(torch.randn(attn.n_heads, attn.d_k) / math.sqrt(attn.d_k))  # w: (H, d_k)

    @staticmethod
    def scores(attn, q, k):
        return dispatch.additive_scores(q, k, attn.score_vector)

    @staticmethod
    def fused(attn, q, k, v, key_padding_mask, p_drop):
        return dispatch.additive_attention(q, k, v, key_padding_mask, p_drop, attn.score_vector)
