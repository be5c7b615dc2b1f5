"""Which implementation computes attention: every path choice of headlab's attention, in one place.

MultiHeadAttention is written as the definition (scores, softmax, values); the scoring functions
(headlab.model.scoring) call these to substitute an equivalent implementation where one applies:
- dot scoring without weights asked for: torch's fused scaled_dot_product_attention, except with attention
  dropout on the CPU, where SDPA would fall back to its unfused path and torch's slow dropout mask (the explicit
  path with headlab's dropout is faster there);
- additive scoring without weights, without attention dropout, once the (B, H, n, n) weights would be large
  (FUSED_ABOVE): on GPUs the Triton kernels (headlab.model.kernels.additive_triton) where Triton is installed
  (HEADLAB_TRITON=0 turns them off), elsewhere AdditiveAttention, fused and chunked over queries;
- additive scores otherwise: AdditiveScores, chunked, recomputing tanh in the backward pass;
- chunks of additive scores: the native CPU kernels (headlab.model.kernels) where they are built, torch ops
  elsewhere; chunks sized to the device (a CPU cache, a share of a GPU's memory);
- inside torch.func transforms (vmap, in packed training): the explicit path with the naive additive scores,
  because autograd functions and SDPA's backward do not batch there.
"""

import os
from functools import cache

import torch
import torch.nn.functional as F

from headlab.model import kernels
from headlab.model.additive import AdditiveAttention, AdditiveScores, TorchOps, additive_scores_naive

FUSED_ABOVE = 1 << 22  # additive attention without weights is fused once (B, H, n, n) weights exceed 16 MiB fp32;
# below, storing them is cheaper than recomputing the scores in the backward pass
CPU_CHUNK_ELEMENTS = 1 << 20  # fp32 elements of a chunk's (B, H, c, m, d_k) hidden tensor on a CPU: 4 MiB, in cache
GPU_MEMORY_SHARE = 16  # on a GPU a chunk's hidden tensor may take 1/16 of the device's memory


@cache
def triton_kernels():
    """headlab.model.kernels.additive_triton, or None without Triton (CPU-only installs) or with HEADLAB_TRITON=0."""
    if os.environ.get("HEADLAB_TRITON", "1") == "0":
        return None
    try:
        from headlab.model.kernels import additive_triton
    except ImportError:
        return None
    return additive_triton


def in_transform(x: torch.Tensor) -> bool:
    """Whether x is a batched tensor of torch.func.vmap (one member of a packed model)."""
    return torch._C._functorch.is_batchedtensor(x)


@cache
def _gpu_chunk_elements(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).total_memory // GPU_MEMORY_SHARE // 4


def chunk_elements(device: torch.device) -> int:
    """fp32 elements one chunk of additive attention may hold on this device."""
    return _gpu_chunk_elements(device) if device.type == "cuda" else CPU_CHUNK_ELEMENTS


def additive_ops(q: torch.Tensor):
    """The backend of a chunk of additive scores: the native CPU kernels where they apply, else torch ops."""
    return kernels.NativeOps if kernels.additive_applies(q) else TorchOps


def queries_per_chunk(q: torch.Tensor, k: torch.Tensor, ops, fused: bool) -> int:
    """Queries per chunk, so that a chunk's tensors stay within the device's chunk budget: the (B, H, c, m, d_k)
    hidden tensor with torch ops; the native kernels store none (one chunk), or (B, H, c, m) scores when fused."""
    B, H, n, d = q.shape
    per_query = B * H * k.shape[2] * (d if ops.stores_hidden else 1)
    if not ops.stores_hidden and not fused:
        return n
    return max(1, chunk_elements(q.device) // max(1, per_query))


def additive_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """w_h^T tanh(q_i + k_j): q (B, H, n, d_k), k (B, H, m, d_k), w (H, d_k) -> (B, H, n, m)."""
    if in_transform(q):
        return additive_scores_naive(q, k, w)
    ops = additive_ops(q)
    return AdditiveScores.apply(q, k, w, ops, queries_per_chunk(q, k, ops, fused=False))


def dot_attention(q, k, v, key_padding_mask, p_drop: float, scale: float) -> torch.Tensor | None:
    """softmax(q k^T scale) @ v by torch's fused SDPA, (B, H, n, d_v); None where the explicit path must run
    (inside torch.func transforms; attention dropout on the CPU). q (B, H, n, d_k), k (B, G, m, d_k), v (B, G, m,
    d_v)."""
    if in_transform(q) or (p_drop and q.device.type == "cpu"):
        return None
    keep = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]  # (B, 1, 1, m)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=keep, dropout_p=p_drop, scale=scale, enable_gqa=k.shape[1] < q.shape[1]
    )


def additive_attention(q, k, v, key_padding_mask, p_drop: float, w: torch.Tensor) -> torch.Tensor | None:
    """softmax(w_h^T tanh(q_i + k_j)) @ v fused, (B, H, n, d_v), storing no weights: the Triton kernels on a GPU,
    else AdditiveAttention; None where the explicit path must run (transforms, attention dropout, or weights
    small enough that storing them is cheaper). Shapes as dot_attention; w (H, d_k)."""
    B, H, n, _ = q.shape
    G = k.shape[1]
    if in_transform(q) or p_drop or B * H * n * n <= FUSED_ABOVE:
        return None
    if G < H:
        k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)  # (B, H, m, d_k), (B, H, m, d_v)
    bias = torch.zeros(B, 1, 1, k.shape[2], dtype=torch.float32, device=q.device)
    if key_padding_mask is not None:
        bias = bias.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    if q.is_cuda and triton_kernels():
        return triton_kernels().TritonAdditiveAttention.apply(q, k, v, w, bias)
    ops = additive_ops(q)
    return AdditiveAttention.apply(q, k, v, w, bias, ops, queries_per_chunk(q, k, ops, fused=True))
