"""Dropout whose CPU mask costs a quarter of a random draw per element.

torch's CPU dropout draws a random number per element from one serial generator: on attention probabilities
(B, H, n, n) that is most of a training step (docs/speed.md). Here one
64-bit draw gives four 15-bit uniforms u, and an element is kept when u >= round(p * 2^15): the drop probability
is p rounded to a multiple of 2^-15 (0.1 -> 0.100006; FlashAttention rounds it to 2^-8), and survivors are scaled
by 1 / (1 - that probability), so the expectation is exact. The mask is one byte per element, as torch's.
Masking float32 tensors with torch on one thread runs in native code (headlab.model.kernels, dropout.c: one pass
over memory each way); elsewhere, and without a C compiler, torch ops give the same bits (tests/model/test_dropout.py).
Elsewhere (CUDA, torch.compile, torch.func transforms) it is F.dropout, whose generators are fast there.
"""

import torch
import torch.nn.functional as F
from torch import nn

from headlab.model import kernels
from headlab.model.dispatch import in_transform

LEVELS = 1 << 15  # a drop probability is rounded to a multiple of 1 / LEVELS


def draws(numel: int) -> torch.Tensor:
    """ceil(numel / 4) 64-bit draws of torch's generator, 63 random bits each: [0, 2^63)."""
    return torch.empty((numel + 3) // 4, dtype=torch.int64).random_()


def threshold_and_scale(p: float) -> tuple[int, float]:
    """The 15-bit threshold below which an element drops, and the survivors' scale 1 / (1 - threshold / 2^15)."""
    threshold = round(p * LEVELS)
    keep_probability = 1.0 - threshold / LEVELS
    return threshold, (1.0 / keep_probability if keep_probability else 0.0)


def keep_mask(bits: torch.Tensor, shape: torch.Size, threshold: int) -> torch.Tensor:
    """The uint8 mask of `shape` (1: kept) from the draws' four 15-bit uniforms each, with torch ops."""
    uniform = bits.view(torch.int16)[: shape.numel()].bitwise_and_(LEVELS - 1)
    return torch.ge(uniform, threshold, out=torch.empty(shape.numel(), dtype=torch.uint8)).view(shape)


def masked(x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
    """x * keep * scale: natively for float32, else with torch ops, the mask widened to x's dtype first (a float
    times a byte tensor converts element by element, several times slower)."""
    if kernels.dropout_applies(x):
        return kernels.dropout_apply(x, keep, scale)
    return x.mul(keep.to(x.dtype)).mul_(scale)


class CpuDropout(torch.autograd.Function):
    """x * mask * scale, keeping the one-byte mask for the backward pass."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        bits = draws(x.numel())
        threshold, scale = threshold_and_scale(p)
        if kernels.dropout_applies(x):
            y, keep = kernels.dropout_forward(bits, x, threshold, scale)
        else:
            keep = keep_mask(bits, x.shape, threshold)
            y = masked(x, keep, scale)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return masked(grad, keep, ctx.scale), None


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
