"""The Triton kernels of additive attention (headlab.model.kernels.additive_triton) run by Triton's interpreter on
the CPU, against the naive formula. Not collected with the suite: Triton decides whether to interpret when it is
first imported, so tests/model/test_attention.py runs this file in a process of its own with TRITON_INTERPRET=1."""

import os

import pytest
import torch

from headlab.model.additive import additive_scores_naive

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run with TRITON_INTERPRET=1 (tests/model/test_attention.py does)", allow_module_level=True)

from headlab.model.kernels.additive_triton import TritonAdditiveAttention  # noqa: E402


def padding_mask(lengths, n):
    return torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]  # (B, n), True = padding


@pytest.mark.parametrize("shape", [(2, 3, 21, 20, 12), (1, 2, 16, 16, 16), (2, 1, 5, 40, 33)])  # (B, H, n, d_k, d_v)
def test_triton_additive_attention_equals_the_naive_formula_with_padding_and_gradients(shape):
    """Blocks of 16 queries, keys and d_k: sizes that end inside a block, d_v padded to 16, padded keys; against
    float64 autograd through the naive formula. fp32 sums over m keys and d_k terms, so the error is a few
    sqrt(terms) eps of the magnitudes (outputs and gradients here are O(1-10))."""
    torch.manual_seed(0)
    B, H, n, d, d_v = shape
    q, k, w = (
        torch.randn(B, H, n, d, dtype=torch.float64),
        torch.randn(B, H, n, d, dtype=torch.float64),
        torch.randn(H, d, dtype=torch.float64),
    )
    v, grad = torch.randn(B, H, n, d_v, dtype=torch.float64), torch.randn(B, H, n, d_v, dtype=torch.float64)
    lengths = [n] + [max(1, n // 3)] * (B - 1)
    bias = torch.zeros(B, 1, 1, n, dtype=torch.float64).masked_fill(
        padding_mask(lengths, n)[:, None, None, :], float("-inf")
    )
    kernel = [t.float().requires_grad_() for t in (q, k, v, w)]
    out = TritonAdditiveAttention.apply(*kernel, bias.float())
    out.backward(grad.float())
    naive = [t.clone().requires_grad_() for t in (q, k, v, w)]
    expected = (additive_scores_naive(*naive[:2], naive[3]) + bias).softmax(-1) @ naive[2]
    expected.backward(grad)
    tolerance = 8 * torch.finfo(torch.float32).eps * (n * d) ** 0.5
    for ours, theirs in zip([out, *(t.grad for t in kernel)], [expected, *(t.grad for t in naive)], strict=True):
        assert ours.dtype == torch.float32
        torch.testing.assert_close(ours.double(), theirs.detach(), atol=tolerance * theirs.abs().max().item(), rtol=0)


def test_triton_additive_attention_keeps_each_input_dtype_under_mixed_precision():
    """Autocast hands bf16 q, k, v and an fp32 w: computed in fp32, the output in v's dtype, each gradient in
    its input's."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 20, 16).bfloat16().requires_grad_() for _ in range(3))
    w = torch.randn(2, 16, requires_grad=True)
    out = TritonAdditiveAttention.apply(q, k, v, w, torch.zeros(2, 1, 1, 20))
    out.float().sum().backward()
    assert out.dtype == torch.bfloat16 and [t.grad.dtype for t in (q, k, v, w)] == [torch.bfloat16] * 3 + [
        torch.float32
    ]
    expected = (additive_scores_naive(q.float(), k.float(), w)).softmax(-1) @ v.float()
    eps = torch.finfo(torch.bfloat16).eps  # only the output's rounding to bf16
    assert (out.float() - expected).norm() / expected.norm() < 2 * eps
