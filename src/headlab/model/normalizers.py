"""Normalisers: how a head turns its logits over the keys into attention weights. A table of them, by name.

    softmax   exp(s_ij) / sum_k exp(s_ik)                      (Vaswani et al. 2017)
    sigmoid   sigmoid(s_ij + b), b = -log m                     (Ramapuram et al. 2024; m: the query's real keys)
    softmax1  exp(s_ij) / (1 + sum_k exp(s_ik))                 ("off by one", Miller 2023: one more logit, 0)
    sink      exp(s_ij) / (exp(z_h) + sum_k exp(s_ik))          (a learned sink logit z_h per head, as gpt-oss;
                                                                 Xiao et al. 2023 on attention sinks)
    softpick  relu(exp(s_ij) - 1) / (sum_k |exp(s_ik) - 1| + eps)  (Zuhri et al. 2025: a head may weigh every key 0)
    ssmax     softmax_j(c_h log(m) s_ij)                         (scalable softmax, Nakanishi 2025: a learned scale
                                                                 c_h per head times the log of the real keys m)

Padded keys get exactly zero weight from each. Only softmax's and ssmax's rows sum to 1: softmax1's and sink's give
the rest to no key (a sink), sigmoid's weigh each key on its own, softpick's sum to at most 1 and may be all 0
(headlab.heads.statistics reads each as a row's mass).

A normaliser is a subclass of Normalizer: `weights` is its definition; `fused` may give weights @ v by a path that
never stores the (B, H, n, m) weights (None: the explicit path runs); `add_parameters` registers its learned
tensors on the attention module. The table is the entry-point group headlab.normalizer (pyproject.toml), as the
scoring functions' (headlab.model.scoring). Shapes: B batch, H heads, G key/value heads, n queries, m keys.
"""

import math

import torch
from torch import nn


class Normalizer:
    """The interface (and the defaults: no parameters, no fused path). `attn` is the MultiHeadAttention."""

    @staticmethod
    def add_parameters(attn: nn.Module) -> None:
        """Register this normaliser's learned tensors on attn (attn.n_heads is set)."""

    @staticmethod
    def weights(attn: nn.Module, scores: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
        """scores (B, H, n, m), key_padding_mask (B, m) True = padding -> weights (B, H, n, m), 0 on padded keys."""
        raise NotImplementedError

    @staticmethod
    def fused(attn, q, k, v, key_padding_mask, p_drop: float) -> torch.Tensor | None:
        """weights @ v, (B, H, n, d_v), without storing the weights; None where the explicit path runs.
        q (B, H, n, d_k), k (B, G, m, d_k), v (B, G, m, d_v)."""
        return None


def _masked(scores: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
    """Logits with padded keys at -inf: (B, H, n, m)."""
    if key_padding_mask is None:
        return scores
    return scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))


def _softmax_with_extra_logit(scores: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
    """softmax over the keys and one more logit that no key holds: scores (B, H, n, m), extra broadcast to
    (B, H, n, 1) -> the keys' weights (B, H, n, m), summing to less than 1."""
    extra = extra.expand(*scores.shape[:-1], 1).to(scores.dtype)
    return torch.cat([scores, extra], dim=-1).softmax(dim=-1)[..., :-1]


class Softmax(Normalizer):
    @staticmethod
    def weights(attn, scores, key_padding_mask):
        return _masked(scores, key_padding_mask).softmax(dim=-1)

    @staticmethod
    def fused(attn, q, k, v, key_padding_mask, p_drop):
        return attn.scoring_fn.fused(attn, q, k, v, key_padding_mask, p_drop)


class Sigmoid(Normalizer):
    """Each key weighed on its own; the bias -log m keeps a row's mass near 1 at the start (m: the real keys)."""

    @staticmethod
    def weights(attn, scores, key_padding_mask):
        if key_padding_mask is None:
            return torch.sigmoid(scores - math.log(scores.shape[-1]))
        real = (~key_padding_mask).sum(-1).clamp(min=1).to(scores.dtype)  # (B,)
        weights = torch.sigmoid(scores - real.log()[:, None, None, None])
        return weights.masked_fill(key_padding_mask[:, None, None, :], 0.0)


class SoftmaxPlusOne(Normalizer):
    """softmax1: a zero logit beside the keys. A key of zeros scores 0 under dot scoring, so that the fused path
    is SDPA over the keys and one zero key, whose zero value adds nothing (torch's add_zero_attn)."""

    @staticmethod
    def weights(attn, scores, key_padding_mask):
        return _softmax_with_extra_logit(_masked(scores, key_padding_mask), scores.new_zeros(()))

    @staticmethod
    def fused(attn, q, k, v, key_padding_mask, p_drop):
        if not attn.scoring_fn.zero_key_logit:
            return None
        k, v = nn.functional.pad(k, (0, 0, 0, 1)), nn.functional.pad(v, (0, 0, 0, 1))  # (B, G, m + 1, ·)
        if key_padding_mask is not None:
            key_padding_mask = nn.functional.pad(key_padding_mask, (0, 1), value=False)  # (B, m + 1)
        return attn.scoring_fn.fused(attn, q, k, v, key_padding_mask, p_drop)


class Sink(Normalizer):
    """A learned logit z_h per head beside the keys, starting at 0 (softmax1)."""

    @staticmethod
    def add_parameters(attn):
        attn.sink_logit = nn.Parameter(torch.zeros(attn.n_heads))  # z: (H,)

    @staticmethod
    def weights(attn, scores, key_padding_mask):
        return _softmax_with_extra_logit(_masked(scores, key_padding_mask), attn.sink_logit.view(1, -1, 1, 1))


class Softpick(Normalizer):
    """Rectified softmax: keys whose logit is below 0 get exactly 0, and the row's mass is at most 1. Computed with
    exp(s - c), c = max(0, the row's largest real logit), in numerator and denominator alike (eps times exp(-c)):
    the same ratio, with no overflow."""

    EPS = 1e-6

    @staticmethod
    def weights(attn, scores, key_padding_mask):
        top = _masked(scores, key_padding_mask).amax(dim=-1, keepdim=True).clamp(min=0).detach()  # (B, H, n, 1)
        shifted = torch.exp(scores - top) - torch.exp(-top)  # (e^s - 1) e^-c
        if key_padding_mask is not None:
            shifted = shifted.masked_fill(key_padding_mask[:, None, None, :], 0.0)
        total = shifted.abs().sum(dim=-1, keepdim=True) + Softpick.EPS * torch.exp(-top)
        return shifted.clamp(min=0) / total


class ScalableSoftmax(Normalizer):
    """softmax of the logits times c_h log m (m: the query's real keys), c_h learned per head from 1: a row keeps
    its peak as the keys grow in number."""

    @staticmethod
    def add_parameters(attn):
        attn.length_scale = nn.Parameter(torch.ones(attn.n_heads))  # c: (H,)

    @staticmethod
    def weights(attn, scores, key_padding_mask):
        if key_padding_mask is None:
            log_m = scores.new_full((scores.shape[0],), math.log(scores.shape[-1]))
        else:
            log_m = (~key_padding_mask).sum(-1).clamp(min=1).to(scores.dtype).log()  # (B,)
        factor = attn.length_scale.view(1, -1, 1, 1) * log_m.view(-1, 1, 1, 1)  # (B, H, 1, 1)
        return _masked(scores * factor, key_padding_mask).softmax(dim=-1)
