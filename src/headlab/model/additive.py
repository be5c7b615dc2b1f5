"""Additive (Bahdanau) attention scores w_h^T tanh(q_i + k_j) without storing the (B, H, n, m, d_k) hidden tensor.

Shapes: B batch, H heads, n queries, m keys, c queries in a chunk, d_k per-head query/key size, d_v value size.
The autograd functions here are chunked over queries; which backend computes a chunk (torch ops here, or the
native CPU kernels) and how many queries a chunk holds is decided by headlab.model.dispatch.
"""

import torch


def additive_scores_naive(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Bahdanau scores the obvious way: autograd keeps a (B, H, n, m, d_k) tensor. The reference for tests, and
    the path inside torch.func transforms (packed training)."""
    hidden = torch.tanh(q.unsqueeze(-2) + k.unsqueeze(-3))  # (B, H, n, m, d_k)
    return torch.einsum("bhijd,hd->bhij", hidden, w)


class TorchOps:
    """A chunk of queries with torch ops: the chunk's (B, H, c, m, d_k) hidden tensor exists for a moment."""

    stores_hidden = True

    @staticmethod
    def hidden(qc: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """tanh(q_i + k_j): qc (B, H, c, d_k), k (B, H, m, d_k) -> (B, H, c, m, d_k)."""
        return torch.add(qc.unsqueeze(3), k.unsqueeze(2)).tanh_()

    @classmethod
    def scores(cls, qc, k, w) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, H, c, m) scores and the chunk's hidden tensor, one matrix-vector product per (b, h)."""
        hidden = cls.hidden(qc, k)
        B, H, c, m, d = hidden.shape
        return (hidden.view(B, H, c * m, d) @ w.view(1, H, d, 1)).view(B, H, c, m), hidden

    @classmethod
    def grads(cls, qc, k, w, grad, hidden=None) -> tuple[torch.Tensor, ...]:
        """Grads of (qc, k, w) for the gradient (B, H, c, m) of the scores; overwrites hidden.
        With t = tanh(q_i + k_j): d q_i = w * sum_j grad_ij (1 - t_ij^2), and d k_j alike over i."""
        hidden = cls.hidden(qc, k) if hidden is None else hidden
        B, H, c, m, d = hidden.shape
        grad_w = (grad.reshape(B, H, 1, c * m) @ hidden.view(B, H, c * m, d)).sum(0).view(H, d)
        squared = hidden.square_()  # (B, H, c, m, d_k)
        g_t2_q = grad.reshape(B * H * c, 1, m) @ squared.view(B * H * c, m, d)  # sum_j grad_ij t_ij^2: one bmm
        g_t2_k = squared.mul_(grad.unsqueeze(-1)).sum(2)  # sum_i grad_ij t_ij^2: (B, H, m, d_k)
        w_ = w.view(1, H, 1, d)
        grad_q = (grad.sum(3).unsqueeze(-1) - g_t2_q.view(B, H, c, d)) * w_  # (B, H, c, d_k)
        return grad_q, (grad.sum(2).unsqueeze(-1) - g_t2_k) * w_, grad_w


def _as_float32(*tensors):
    """Under mixed precision q, k, v arrive in bf16 / fp16 while w is fp32: half-precision inputs are computed
    in fp32 (the sums over m keys and d_k dimensions need it); gradients go back in each input's own dtype."""
    return [t.float() if t.dtype in (torch.float16, torch.bfloat16) else t for t in tensors]


class AdditiveScores(torch.autograd.Function):
    """Bahdanau scores, recomputing tanh in the backward pass instead of storing it."""

    @staticmethod
    def forward(ctx, q, k, w, ops, step):  # q (B, H, n, d_k), k (B, H, m, d_k), w (H, d_k) -> (B, H, n, m)
        ctx.dtypes, ctx.ops, ctx.step = (q.dtype, k.dtype, w.dtype), ops, step
        q, k, w = (t.contiguous() for t in _as_float32(q, k, w))  # chunks of the hidden tensor are contiguous
        ctx.save_for_backward(q, k, w)
        return torch.cat([ops.scores(qc, k, w)[0] for qc in q.split(step, dim=2)], dim=2)

    @staticmethod
    def backward(ctx, grad):  # grad (B, H, n, m)
        q, k, w = ctx.saved_tensors
        grad = grad.to(q.dtype)
        grad_k, grad_w, grad_q = torch.zeros_like(k), torch.zeros_like(w), []
        for qc, gc in zip(q.split(ctx.step, dim=2), grad.split(ctx.step, dim=2), strict=True):
            gq, gk, gw = ctx.ops.grads(qc, k, w, gc)
            grad_q.append(gq)
            grad_k += gk
            grad_w += gw
        grads = (torch.cat(grad_q, dim=2), grad_k, grad_w)
        return *(g.to(dtype) for g, dtype in zip(grads, ctx.dtypes, strict=True)), None, None


class AdditiveAttention(torch.autograd.Function):
    """softmax(w_h^T tanh(q_i + k_j) + bias_j) @ v, fused and chunked over queries like FlashAttention: only q, k,
    v, the output and each query's log-sum-exp are kept; the backward pass recomputes scores and weights chunk by
    chunk. Neither the (B, H, n, m, d_k) hidden tensor nor the (B, H, n, m) weights ever exist whole."""

    @staticmethod
    def forward(ctx, q, k, v, w, bias, ops, step):  # v (B, H, m, d_v); bias (B, 1, 1, m): 0 or -inf (padding)
        ctx.dtypes, ctx.ops, ctx.step = (q.dtype, k.dtype, v.dtype, w.dtype), ops, step
        q, k, v, w, bias = (t.contiguous() for t in _as_float32(q, k, v, w, bias))
        outs, lses = [], []
        for qc in q.split(step, dim=2):
            scores = ops.scores(qc, k, w)[0] + bias  # (B, H, c, m)
            lse = scores.logsumexp(dim=-1, keepdim=True)  # (B, H, c, 1)
            outs.append(scores.sub_(lse).exp_() @ v)  # (B, H, c, d_v)
            lses.append(lse)
        out, lse = torch.cat(outs, dim=2), torch.cat(lses, dim=2)
        ctx.save_for_backward(q, k, v, w, bias, out, lse)
        return out.to(ctx.dtypes[2])  # (B, H, n, d_v)

    @staticmethod
    def backward(ctx, grad_out):  # grad_out (B, H, n, d_v)
        q, k, v, w, bias, out, lse = ctx.saved_tensors
        grad_out, step, ops = grad_out.to(q.dtype), ctx.step, ctx.ops
        delta = (grad_out * out).sum(-1, keepdim=True)  # (B, H, n, 1): sum_j p_ij dp_ij
        grad_k, grad_v, grad_w, grad_q = torch.zeros_like(k), torch.zeros_like(v), torch.zeros_like(w), []
        for i in range(0, q.shape[2], step):
            go, qc = grad_out[:, :, i : i + step], q[:, :, i : i + step]
            scores, hidden = ops.scores(qc, k, w)  # (B, H, c, m)
            p = (scores + bias).sub_(lse[:, :, i : i + step]).exp_()  # (B, H, c, m)
            grad_v += p.transpose(-2, -1) @ go
            grad_scores = p.mul_(go @ v.transpose(-2, -1) - delta[:, :, i : i + step])  # softmax backward
            gq, gk, gw = ops.grads(qc, k, w, grad_scores, hidden)
            grad_q.append(gq)
            grad_k += gk
            grad_w += gw
        grads = (torch.cat(grad_q, dim=2), grad_k, grad_v, grad_w)
        return *(g.to(dtype) for g, dtype in zip(grads, ctx.dtypes, strict=True)), None, None, None
