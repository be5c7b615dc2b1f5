"""Fused additive (Bahdanau) attention for GPUs, in Triton: softmax(w_h^T tanh(q_i + k_j) + bias_j) @ v.

Like FlashAttention: a program owns a block of queries, the keys stream through it with an online softmax, and
only the output and each query's log-sum-exp are stored; the backward pass recomputes scores block by block (one
kernel owns key blocks: dK, dV and a partial dw; one owns query blocks: dQ). Neither the (B, H, n, m, d_k) hidden
tensor nor the (B, H, n, m) weights exist in memory. d_k is walked in slices of BLOCK_D, so that a program's
tanh block is (BLOCK_M, BLOCK_N, BLOCK_D); gradients of a slice are added to their rows in global memory, which
the program owns alone (no atomics: deterministic).

Shapes: B batch, H heads, n queries, m keys, D = d_k, DV = d_v; everything in float32 inside (callers cast).
Tested on the CPU through Triton's interpreter (TRITON_INTERPRET=1, set before this module is imported) against
the naive formula.
"""

import torch
import triton
import triton.language as tl

from headlab.model.additive import _as_float32

BLOCK_M, BLOCK_N, BLOCK_D = 16, 16, 16  # tl.dot needs 16 or more on GPUs; (16, 16, 16) tanh values per step
NEG_INF = float("-inf")


@triton.jit
def _tanh(x):
    return 2 * tl.sigmoid(2 * x) - 1


@triton.jit
def _tanh_slice(Q, K, W, offs_m, offs_n, offs_d, n, m, D):
    """tanh(q_i + k_j) on one slice of d_k, (BLOCK_M, BLOCK_N, BLOCK_D), and w on it; 0 outside the tensors."""
    q = tl.load(
        Q + offs_m[:, None] * D + offs_d[None, :], mask=(offs_m[:, None] < n) & (offs_d[None, :] < D), other=0.0
    )
    k = tl.load(
        K + offs_n[:, None] * D + offs_d[None, :], mask=(offs_n[:, None] < m) & (offs_d[None, :] < D), other=0.0
    )
    return _tanh(q[:, None, :] + k[None, :, :]), tl.load(W + offs_d, mask=offs_d < D, other=0.0)


@triton.jit
def _accumulate(ptrs, value, mask):
    """Adds value to rows in global memory that this program alone owns."""
    tl.store(ptrs, tl.load(ptrs, mask=mask, other=0.0) + value, mask=mask)


@triton.jit
def _scores(Q, K, W, offs_m, offs_n, n, m, D, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """(BLOCK_M, BLOCK_N) scores w^T tanh(q_i + k_j), summed over slices of d_k. Q, K, W: this (b, h)'s rows."""
    scores = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        t, w = _tanh_slice(Q, K, W, offs_m, offs_n, d0 + tl.arange(0, BLOCK_D), n, m, D)
        scores += tl.sum(t * w[None, None, :], axis=2)
    return scores


@triton.jit
def _forward(
    Q, K, V, W, BIAS, OUT, LSE, H, n, m, D, DV,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    bh = tl.program_id(1)
    Q, K, V, W, BIAS = Q + bh * n * D, K + bh * m * D, V + bh * m * DV, W + (bh % H) * D, BIAS + (bh // H) * m
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_max = tl.full((BLOCK_M,), -1e30, dtype=tl.float32)  # finite: a block of padded keys gives exp(-inf) = 0
    row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)
    for start_n in range(0, m, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        bias = tl.load(BIAS + offs_n, mask=offs_n < m, other=float("-inf"))  # 0, or -inf: padding, past the end
        s = _scores(Q, K, W, offs_m, offs_n, n, m, D, BLOCK_M, BLOCK_N, BLOCK_D) + bias[None, :]
        new_max = tl.maximum(row_max, tl.max(s, axis=1))
        p = tl.exp(s - new_max[:, None])  # (BLOCK_M, BLOCK_N)
        scale = tl.exp(row_max - new_max)
        v = tl.load(
            V + offs_n[:, None] * DV + offs_dv[None, :], mask=(offs_n[:, None] < m) & (offs_dv[None, :] < DV), other=0.0
        )
        acc = acc * scale[:, None] + tl.dot(p, v, input_precision=PRECISION)
        row_sum = row_sum * scale + tl.sum(p, axis=1)
        row_max = new_max
    out_mask = (offs_m[:, None] < n) & (offs_dv[None, :] < DV)
    tl.store(OUT + bh * n * DV + offs_m[:, None] * DV + offs_dv[None, :], acc / row_sum[:, None], mask=out_mask)
    tl.store(LSE + bh * n + offs_m, row_max + tl.log(row_sum), mask=offs_m < n)


@triton.jit
def _probabilities_and_grads(
    Q, K, V, W, BIAS, GRAD_OUT, LSE, DELTA, offs_m, offs_n, n, m, D, DV,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """The block's weights p (BLOCK_M, BLOCK_N), the gradient of its scores, and grad_out (BLOCK_M, BLOCK_DV)."""
    offs_dv = tl.arange(0, BLOCK_DV)
    bias = tl.load(BIAS + offs_n, mask=offs_n < m, other=float("-inf"))
    s = _scores(Q, K, W, offs_m, offs_n, n, m, D, BLOCK_M, BLOCK_N, BLOCK_D) + bias[None, :]
    lse = tl.load(LSE + offs_m, mask=offs_m < n, other=0.0)
    p = tl.where(offs_m[:, None] < n, tl.exp(s - lse[:, None]), 0.0)
    grad_out = tl.load(
        GRAD_OUT + offs_m[:, None] * DV + offs_dv[None, :],
        mask=(offs_m[:, None] < n) & (offs_dv[None, :] < DV),
        other=0.0,
    )
    v = tl.load(
        V + offs_n[:, None] * DV + offs_dv[None, :], mask=(offs_n[:, None] < m) & (offs_dv[None, :] < DV), other=0.0
    )
    grad_p = tl.dot(grad_out, tl.trans(v), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
    delta = tl.load(DELTA + offs_m, mask=offs_m < n, other=0.0)  # sum_j p_ij grad_p_ij = grad_out_i . out_i
    return p, p * (grad_p - delta[:, None]), grad_out


@triton.jit
def _backward_keys(
    Q, K, V, W, BIAS, GRAD_OUT, LSE, DELTA, GRAD_K, GRAD_V, GRAD_W_PART, H, n, m, D, DV,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """dK and dV of a block of keys, and its share of dw, over all queries."""
    bh, block_n = tl.program_id(1), tl.program_id(0)
    Q, K, V, W, BIAS = Q + bh * n * D, K + bh * m * D, V + bh * m * DV, W + (bh % H) * D, BIAS + (bh // H) * m
    GRAD_OUT, LSE, DELTA, GRAD_K = GRAD_OUT + bh * n * DV, LSE + bh * n, DELTA + bh * n, GRAD_K + bh * m * D
    GRAD_W_PART += (bh * tl.num_programs(0) + block_n) * D
    offs_n = block_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_dv = tl.arange(0, BLOCK_DV)
    grad_v = tl.zeros((BLOCK_N, BLOCK_DV), dtype=tl.float32)
    for start_m in range(0, n, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        p, grad_s, grad_out = _probabilities_and_grads(
            Q, K, V, W, BIAS, GRAD_OUT, LSE, DELTA, offs_m, offs_n, n, m, D, DV,
            BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, PRECISION,
        )  # fmt: skip
        grad_v += tl.dot(tl.trans(p), grad_out, input_precision=PRECISION)
        for d0 in range(0, D, BLOCK_D):  # with t = tanh(q_i + k_j): dk_j = w * sum_i grad_s_ij (1 - t_ij^2)
            offs_d = d0 + tl.arange(0, BLOCK_D)
            t, w = _tanh_slice(Q, K, W, offs_m, offs_n, offs_d, n, m, D)  # (BLOCK_M, BLOCK_N, BLOCK_D), (BLOCK_D,)
            g = grad_s[:, :, None]
            grad_k = tl.sum(g * (1 - t * t), axis=0) * w[None, :]  # (BLOCK_N, BLOCK_D)
            k_mask = (offs_n[:, None] < m) & (offs_d[None, :] < D)
            _accumulate(GRAD_K + offs_n[:, None] * D + offs_d[None, :], grad_k, k_mask)
            _accumulate(GRAD_W_PART + offs_d, tl.sum(tl.sum(g * t, axis=0), axis=0), offs_d < D)
    v_mask = (offs_n[:, None] < m) & (offs_dv[None, :] < DV)
    tl.store(GRAD_V + bh * m * DV + offs_n[:, None] * DV + offs_dv[None, :], grad_v, mask=v_mask)


@triton.jit
def _backward_queries(
    Q, K, V, W, BIAS, GRAD_OUT, LSE, DELTA, GRAD_Q, H, n, m, D, DV,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """dQ of a block of queries, over all keys: dq_i = w * sum_j grad_s_ij (1 - t_ij^2)."""
    bh = tl.program_id(1)
    Q, K, V, W, BIAS = Q + bh * n * D, K + bh * m * D, V + bh * m * DV, W + (bh % H) * D, BIAS + (bh // H) * m
    GRAD_OUT, LSE, DELTA, GRAD_Q = GRAD_OUT + bh * n * DV, LSE + bh * n, DELTA + bh * n, GRAD_Q + bh * n * D
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    for start_n in range(0, m, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        _, grad_s, _ = _probabilities_and_grads(
            Q, K, V, W, BIAS, GRAD_OUT, LSE, DELTA, offs_m, offs_n, n, m, D, DV,
            BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, PRECISION,
        )  # fmt: skip
        for d0 in range(0, D, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            t, w = _tanh_slice(Q, K, W, offs_m, offs_n, offs_d, n, m, D)
            grad_q = tl.sum(grad_s[:, :, None] * (1 - t * t), axis=1) * w[None, :]  # (BLOCK_M, BLOCK_D)
            q_mask = (offs_m[:, None] < n) & (offs_d[None, :] < D)
            _accumulate(GRAD_Q + offs_m[:, None] * D + offs_d[None, :], grad_q, q_mask)


def _precision() -> str:
    """tl.dot's precision for float32: TF32 where torch's matmuls use it (headlab's `tf32`, on by default)."""
    return "ieee" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def _sizes(q, v) -> dict:
    return {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_D": BLOCK_D, "PRECISION": _precision(),
            "BLOCK_DV": max(16, triton.next_power_of_2(v.shape[-1]))}  # fmt: skip


class TritonAdditiveAttention(torch.autograd.Function):
    """softmax(w_h^T tanh(q_i + k_j) + bias_j) @ v with the kernels above: q (B, H, n, d_k), k (B, H, m, d_k),
    v (B, H, m, d_v), w (H, d_k), bias (B, 1, 1, m) of 0 or -inf (padding) -> (B, H, n, d_v)."""

    @staticmethod
    def forward(ctx, q, k, v, w, bias):
        ctx.dtypes = (q.dtype, k.dtype, v.dtype, w.dtype)
        q, k, v, w, bias = (t.contiguous() for t in _as_float32(q, k, v, w, bias))
        (B, H, n, D), m, DV = q.shape, k.shape[2], v.shape[3]
        out = torch.empty(B, H, n, DV, dtype=torch.float32, device=q.device)
        lse = torch.empty(B, H, n, dtype=torch.float32, device=q.device)
        _forward[(triton.cdiv(n, BLOCK_M), B * H)](q, k, v, w, bias, out, lse, H, n, m, D, DV, **_sizes(q, v))
        ctx.save_for_backward(q, k, v, w, bias, out, lse)
        return out.to(ctx.dtypes[2])

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, w, bias, out, lse = ctx.saved_tensors
        (B, H, n, D), m, DV = q.shape, k.shape[2], v.shape[3]
        grad_out = grad_out.float().contiguous()
        delta = (grad_out * out).sum(-1)  # (B, H, n)
        grad_q, grad_k, grad_v = torch.zeros_like(q), torch.zeros_like(k), torch.empty_like(v)
        key_blocks = triton.cdiv(m, BLOCK_N)
        grad_w = torch.zeros(B, H, key_blocks, D, dtype=torch.float32, device=q.device)  # per key block: summed below
        common = (q, k, v, w, bias, grad_out, lse, delta)
        _backward_keys[(key_blocks, B * H)](*common, grad_k, grad_v, grad_w, H, n, m, D, DV, **_sizes(q, v))
        _backward_queries[(triton.cdiv(n, BLOCK_M), B * H)](*common, grad_q, H, n, m, D, DV, **_sizes(q, v))
        grads = (grad_q, grad_k, grad_v, grad_w.sum((0, 2)))
        return *(g.to(dtype) for g, dtype in zip(grads, ctx.dtypes, strict=True)), None
