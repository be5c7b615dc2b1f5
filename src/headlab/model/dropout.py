"""Dropout whose CPU mask costs a quarter of a random draw per element.

torch's CPU dropout draws a random number per element from one serial generator: on attention probabilities
(B, H, n, n) that is most of a training step (docs/speed.md). Here one
64-bit draw gives four 15-bit uniforms u, and an element is kept when u >= round(p * 2^15): the drop probability
is p rounded to a multiple of 2^-15 (0.1 -> 0.100006; FlashAttention rounds it to 2^-8), and survivors are scaled
by 1 / (1 - that probability), so the expectation is exact. The mask is one byte per element, as torch's.
Elsewhere (CUDA, torch.compile, torch.func transforms) it is F.dropout, whose generators are fast there.
"""

import torch
import torch.nn.functional as F
from torch import nn

from headlab.model.dispatch import in_transform

LEVELS = 1 << 15  # a drop probability is rounded to a multiple of 1 / LEVELS


def keep_mask(shape: torch.Size, p: float) -> tuple[torch.Tensor, float]:
    """A bool mask of `shape`, False with probability round(p * 2^15) / 2^15, and the survivors' scale."""
    numel = shape.numel()
    bits = torch.empty((numel + 3) // 4, dtype=torch.int64).random_()  # 63 random bits each: [0, 2^63)
    uniform = bits.view(torch.int16)[:numel].bitwise_and_(LEVELS - 1)  # four 15-bit uniforms per draw
    threshold = round(p * LEVELS)
    keep_probability = 1.0 - threshold / LEVELS
    return (uniform >= threshold).view(shape), (1.0 / keep_probability if keep_probability else 0.0)


class CpuDropout(torch.autograd.Function):
    """x * mask * scale, keeping the one-byte mask for the backward pass."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        keep, scale = keep_mask(x.shape, p)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """F.dropout with the fast CPU mask; same signature and semantics."""
    if not training or p == 0:
        return x
    if x.device.type != "cpu" or torch.compiler.is_compiling() or in_transform(x):
        return F.dropout(x, p, training=True)
    return CpuDropout.apply(x, p)


class Dropout(nn.Dropout):
    """nn.Dropout with the fast CPU mask: a drop-in replacement (no parameters, same state dict)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
