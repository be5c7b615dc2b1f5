"""Output gates: a head's output scaled by a gate computed from the attention's input. A table of them, by name.

    none         Y
    headwise     Y_h * sigmoid(x W_h)        one gate per head and position      (Qiu et al. 2025, arXiv 2505.06708)
    elementwise  Y_h * sigmoid(x W_h)        one gate per value channel          (the same paper; Qwen3-Next's)

x is the attention's input at the query's position, Y_h head h's output (its weights times values) before the heads
are merged. W has no bias, as in the paper's formula. A gate is a subclass of Gate: `values` gives the gate (None:
no gate), `add_parameters` registers its learned tensors, `width` says how many values a position's gate has (its
memory and cost); the table is the entry-point group headlab.gate.
Shapes: B batch, n positions, H heads, d_v per-head value size.
"""

import torch
from torch import nn


class Gate:
    """The interface, and no gate."""

    @staticmethod
    def add_parameters(attn: nn.Module) -> None:
        """Register this gate's learned tensors on attn (attn.d_model, attn.n_heads, attn.d_v are set)."""

    @staticmethod
    def values(attn: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        """The gate of every head and position, x (B, n, d_model) -> (B, H, n, 1) or (B, H, n, d_v); None: none."""
        return None

    @staticmethod
    def width(n_heads: int, d_v: int) -> int:
        """Gate values a position computes from its input (the output width of the gate's projection): what its
        parameters, FLOPs and memory grow with (headlab.config.memory asks it)."""
        return 0


class Headwise(Gate):
    @staticmethod
    def add_parameters(attn):
        attn.gate_proj = nn.Linear(attn.d_model, attn.n_heads, bias=False)

    @staticmethod
    def values(attn, x):
        return torch.sigmoid(attn.gate_proj(x)).transpose(1, 2).unsqueeze(-1)  # (B, H, n, 1)

    @staticmethod
    def width(n_heads, d_v):
        return n_heads


class Elementwise(Gate):
    @staticmethod
    def add_parameters(attn):
        attn.gate_proj = nn.Linear(attn.d_model, attn.n_heads * attn.d_v, bias=False)

    @staticmethod
    def values(attn, x):
        B, n, _ = x.shape
        return torch.sigmoid(attn.gate_proj(x)).view(B, n, attn.n_heads, attn.d_v).transpose(1, 2)  # (B, H, n, d_v)

    @staticmethod
    def width(n_heads, d_v):
        return n_heads * d_v
