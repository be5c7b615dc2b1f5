"""MultiHeadAttention against torch's reference implementation and independent computations."""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import TESTS
from headlab.model import dispatch
from headlab.model.additive import AdditiveAttention, additive_scores_naive
from headlab.model.attention import MultiHeadAttention

torch.manual_seed(0)
B, N, D = 3, 7, 32


def padding_mask(lengths, n=N):
    return torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]  # (B, n), True = padding


def torch_reference(mha: MultiHeadAttention) -> nn.MultiheadAttention:
    """nn.MultiheadAttention with mha's weights copied in."""
    ref = nn.MultiheadAttention(D, mha.n_heads, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat([mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias]))
        ref.out_proj.weight.copy_(mha.out_proj.weight)
        ref.out_proj.bias.copy_(mha.out_proj.bias)
    return ref


@pytest.mark.parametrize("lengths", [None, [7, 4, 1]])
@pytest.mark.parametrize("n_heads", [1, 4, 8])
def test_dot_scoring_equals_torch_multihead_attention(n_heads, lengths):
    mha = MultiHeadAttention(D, n_heads)
    ref = torch_reference(mha)
    x = torch.randn(B, N, D)
    mask = None if lengths is None else padding_mask(lengths)
    out, weights = mha(x, key_padding_mask=mask, need_weights=True)
    ref_out, ref_weights = ref(x, x, x, key_padding_mask=mask, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, ref_weights, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_heads": 4},
        {"n_heads": 4, "scale": False},
        {"n_heads": 4, "d_k": 5, "d_v": 3},
        {"n_heads": 8, "n_kv_heads": 2},
        {"n_heads": 4, "n_kv_heads": 1, "d_k": 16},
    ],
)
def test_sdpa_path_equals_explicit_path(kwargs):
    mha = MultiHeadAttention(D, **kwargs)
    x, mask = torch.randn(B, N, D), padding_mask([7, 5, 2])
    fast, none = mha(x, key_padding_mask=mask, need_weights=False)
    explicit, weights = mha(x, key_padding_mask=mask, need_weights=True)
    assert none is None and weights.shape == (B, kwargs["n_heads"], N, N)
    torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=1e-5)


def test_additive_scoring_equals_elementwise_bahdanau():
    mha = MultiHeadAttention(D, n_heads=2, d_k=6, d_v=4, scoring="additive")
    x = torch.randn(2, 5, D)
    out, weights = mha(x)
    q = mha.q_proj(x).view(2, 5, 2, 6)
    k = mha.k_proj(x).view(2, 5, 2, 6)
    v = mha.v_proj(x).view(2, 5, 2, 4)
    expected_weights = torch.empty(2, 2, 5, 5)
    heads = torch.empty(2, 5, 2, 4)
    for b in range(2):
        for h in range(2):
            for i in range(5):
                scores = torch.stack([mha.score_vector[h] @ torch.tanh(q[b, i, h] + k[b, j, h]) for j in range(5)])
                expected_weights[b, h, i] = torch.softmax(scores, dim=0)
                heads[b, i, h] = expected_weights[b, h, i] @ v[b, :, h]
    expected = mha.out_proj(heads.reshape(2, 5, 8))
    torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scoring", ["dot", "additive"])
def test_padded_keys_get_exactly_zero_weight(scoring):
    mha = MultiHeadAttention(D, 4, scoring=scoring)
    mask = padding_mask([7, 3, 1])
    _, weights = mha(torch.randn(B, N, D), key_padding_mask=mask)
    assert torch.all(weights.masked_select(mask[:, None, None, :].expand_as(weights)) == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, 4, N))


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("scoring", ["dot", "additive"])
def test_padding_does_not_change_real_tokens(scoring, need_weights):
    mha = MultiHeadAttention(D, 4, scoring=scoring).eval()
    x = torch.randn(1, 4, D)
    padded = torch.cat([x, torch.randn(1, 3, D)], dim=1)  # 3 padding positions holding junk
    out, _ = mha(x, need_weights=need_weights)
    out_padded, _ = mha(padded, key_padding_mask=padding_mask([4], n=7), need_weights=need_weights)
    torch.testing.assert_close(out_padded[:, :4], out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("need_weights", [False, True])
def test_zero_head_mask_removes_exactly_that_head(need_weights):
    mha = MultiHeadAttention(D, 4, d_v=5)
    x, h = torch.randn(B, N, D), 2
    masked, _ = mha(x, need_weights=need_weights, head_mask=torch.tensor([1.0, 1.0, 0.0, 1.0]))
    with torch.no_grad():  # remove head h by hand: its columns of the output projection no longer read it
        mha.out_proj.weight[:, h * 5 : (h + 1) * 5] = 0
    removed, _ = mha(x, need_weights=need_weights)
    torch.testing.assert_close(masked, removed, atol=1e-6, rtol=1e-6)


def test_per_example_head_mask():
    mha = MultiHeadAttention(D, 4)
    x = torch.randn(2, N, D)
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
    both, _ = mha(x, head_mask=mask)
    for b in range(2):
        alone, _ = mha(x[b : b + 1], head_mask=mask[b])
        torch.testing.assert_close(both[b : b + 1], alone, atol=1e-6, rtol=1e-6)


def test_decoupled_head_sizes_give_expected_shapes_and_parameter_counts():
    mha = MultiHeadAttention(D, n_heads=8, d_k=3, d_v=7)
    assert (mha.q_proj.out_features, mha.k_proj.out_features, mha.v_proj.out_features) == (24, 24, 56)
    assert mha.out_proj.in_features == 56
    expected = (D + 1) * 24 * 2 + (D + 1) * 56 + (56 + 1) * D
    assert sum(p.numel() for p in mha.parameters()) == expected
    out, weights = mha(torch.randn(B, N, D))
    assert out.shape == (B, N, D) and weights.shape == (B, 8, N, N)
    additive = MultiHeadAttention(D, n_heads=8, d_k=3, d_v=7, scoring="additive")
    assert sum(p.numel() for p in additive.parameters()) == expected + 8 * 3  # one w_h per head


def test_default_sizes_split_the_width():
    mha = MultiHeadAttention(D, 4)
    assert (mha.d_k, mha.d_v, mha.n_kv_heads) == (8, 8, 4)


def test_grouped_query_attention_equals_mha_with_shared_key_value_weights():
    gqa = MultiHeadAttention(D, n_heads=4, n_kv_heads=2)
    assert gqa.k_proj.out_features == 2 * 8 and gqa.v_proj.out_features == 2 * 8
    full = MultiHeadAttention(D, n_heads=4)
    with torch.no_grad():
        for name in ("q_proj", "out_proj"):
            getattr(full, name).load_state_dict(getattr(gqa, name).state_dict())
        for name in ("k_proj", "v_proj"):  # query heads 0,1 share kv head 0; heads 2,3 share kv head 1
            src = getattr(gqa, name)
            getattr(full, name).weight.copy_(src.weight.view(2, 8, D).repeat_interleave(2, dim=0).reshape(32, D))
            getattr(full, name).bias.copy_(src.bias.view(2, 8).repeat_interleave(2, dim=0).reshape(32))
    x = torch.randn(B, N, D)
    for need_weights in (False, True):
        torch.testing.assert_close(gqa(x, need_weights=need_weights)[0], full(x)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_heads": 0}, "n_heads=0 is invalid: expected an int >= 1"),
        ({"n_heads": 5}, "n_heads=5 is invalid: expected a divisor of d_model=32 while d_k is null (or set d_k)"),
        ({"n_heads": 4, "d_k": 0}, "d_k=0 is invalid"),
        ({"n_heads": 4, "n_kv_heads": 3}, "n_kv_heads=3 is invalid: expected a divisor of n_heads=4"),
        ({"n_heads": 4, "scoring": "cosine"}, "scoring='cosine' is invalid: expected one of additive, dot"),
        ({"n_heads": 4, "dropout": 1.0}, "dropout=1.0 is invalid: expected a number in [0, 1)"),
    ],
)
def test_impossible_configurations_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        MultiHeadAttention(D, **kwargs)


def test_attention_dropout_is_applied_in_training_only():
    mha = MultiHeadAttention(D, 4, dropout=0.5)
    x = torch.randn(B, N, D)
    mha.eval()
    a, _ = mha(x, need_weights=False)
    b, _ = mha(x, need_weights=False)
    torch.testing.assert_close(a, b)
    mha.train()
    c, _ = mha(x, need_weights=False)
    assert not torch.allclose(a, c)


@pytest.mark.parametrize("scoring", ["dot", "additive"])
def test_gradients_reach_every_parameter(scoring):
    mha = MultiHeadAttention(D, 4, scoring=scoring)
    out, _ = mha(torch.randn(B, N, D), key_padding_mask=padding_mask([7, 5, 2]), need_weights=False)
    out.square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in mha.parameters())


@pytest.fixture(params=["native", "torch"])
def additive_path(request, monkeypatch):
    """Run a test with the native additive kernels (headlab.model.kernels), then with torch ops."""
    from headlab.model import kernels

    if request.param == "torch":
        monkeypatch.setattr(kernels, "ENABLED", False)
    elif shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the native kernels cannot be built here")
    else:
        assert kernels.additive_applies(torch.zeros(1)), "the native kernels did not build: see the warning"
    return request.param


@pytest.mark.parametrize("chunk_elements", [1, 200, 1 << 23])  # one query per chunk, a few, all at once
def test_memory_lean_additive_scores_match_the_naive_ones_with_gradients(monkeypatch, chunk_elements, additive_path):
    monkeypatch.setattr(dispatch, "CPU_CHUNK_ELEMENTS", chunk_elements)
    additive_scores = dispatch.additive_scores
    q, k, w = torch.randn(2, 3, 9, 5), torch.randn(2, 3, 9, 5), torch.randn(3, 5)
    grad = torch.randn(2, 3, 9, 9)
    results = []
    for fn in (additive_scores, additive_scores_naive):
        leaves = [t.clone().requires_grad_() for t in (q, k, w)]
        scores = fn(*leaves)
        scores.backward(grad)
        results.append([scores.detach(), *(t.grad for t in leaves)])
    for lean, naive in zip(*results, strict=True):
        torch.testing.assert_close(lean, naive, atol=1e-5, rtol=1e-5)
    double = [t.double().requires_grad_() for t in (q[:, :, :4], k[:, :, :4], w)]
    assert torch.autograd.gradcheck(additive_scores, double)


@pytest.mark.parametrize("chunk_elements", [1, 200, 1 << 23])
def test_fused_additive_attention_equals_scores_softmax_values_with_padding_and_gradients(
    monkeypatch, chunk_elements, additive_path
):
    monkeypatch.setattr(dispatch, "CPU_CHUNK_ELEMENTS", chunk_elements)
    torch.manual_seed(0)
    q, k, w = torch.randn(3, 2, 7, 4), torch.randn(3, 2, 7, 4), torch.randn(2, 4)
    v, grad = torch.randn(3, 2, 7, 5), torch.randn(3, 2, 7, 5)
    padded = padding_mask([7, 4, 1])
    bias = torch.zeros(3, 1, 1, 7).masked_fill(padded[:, None, None, :], float("-inf"))

    def reference(q, k, v, w, bias):  # the naive way: every intermediate kept by autograd
        return (additive_scores_naive(q, k, w) + bias).softmax(-1) @ v

    def fused_attention(q, k, v, w, bias):  # as dispatch.fused_attention calls it
        ops = dispatch.additive_ops(q)
        return AdditiveAttention.apply(q, k, v, w, bias, ops, dispatch.queries_per_chunk(q, k, ops, fused=True))

    results = []
    for fn in (fused_attention, reference):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, w)]
        out = fn(*leaves, bias)
        out.backward(grad)
        results.append([out.detach(), *(t.grad for t in leaves)])
    for fused, naive in zip(*results, strict=True):
        torch.testing.assert_close(fused, naive, atol=1e-5, rtol=1e-5)
    double = [t.double().requires_grad_() for t in (q, k, v, w)]
    assert torch.autograd.gradcheck(fused_attention, (*double, bias.double()))


@pytest.mark.parametrize("fused_above", [0, 1 << 22])  # the fused path, the stored-weights path
def test_additive_attention_without_weights_agrees_with_the_explicit_path(monkeypatch, fused_above, additive_path):
    monkeypatch.setattr(dispatch, "FUSED_ABOVE", fused_above)
    mha = MultiHeadAttention(D, 4, d_k=3, d_v=5, n_kv_heads=2, scoring="additive")
    x, padded = torch.randn(B, N, D), padding_mask([7, 5, 2])
    fused, none = mha(x, key_padding_mask=padded, need_weights=False)
    explicit, weights = mha(x, key_padding_mask=padded, need_weights=True)
    assert none is None and weights.shape == (B, 4, N, N)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)


def test_native_kernels_equal_the_naive_scores_on_a_long_sequence_and_saturated_tanh(additive_path):
    additive_scores = dispatch.additive_scores

    torch.manual_seed(0)
    q, k, w = torch.randn(2, 3, 200, 16) * 4, torch.randn(2, 3, 150, 16) * 4, torch.randn(3, 16)  # |q + k| up to ~20
    q[..., 0] += 30  # far beyond the keys: clamped in the exponential form, tanh = 1
    k[..., :3] *= 10  # keys spread over more than 34: these dimensions take the rational tanh
    grad = torch.randn(2, 3, 200, 150)
    results = []
    for fn, dtype in ((additive_scores, torch.float32), (additive_scores_naive, torch.float64)):
        leaves = [t.to(dtype).detach().requires_grad_() for t in (q, k, w)]
        scores = fn(*leaves)
        scores.backward(grad.to(dtype))
        results.append([scores.detach(), *(t.grad for t in leaves)])
    # Tolerances from the arithmetic: every output is a float32 sum of N terms, each within a few roundings of its
    # exact value (tanh's approximation, the products), so its error is bounded by about sqrt(N) eps sum |term|
    # (rounding errors of a long sum add like a random walk); 4x that margin. |tanh| <= 1, so sum |term| is
    # bounded by sums of |w| and |grad|: scores d_k terms of |w|; grad_q, grad_k m or n terms of |w| |grad|;
    # grad_w B n m terms of |grad| (60,000 here: a fixed atol would fail on one CPU and pass on another).
    eps, g, w_abs = torch.finfo(torch.float32).eps, grad.abs(), w.abs()[None, :, None, :]  # (1, H, 1, d_k)
    bounds = [
        w.abs().sum(-1)[None, :, None, None] * 16**0.5,  # scores (B, H, n, m)
        w_abs * g.sum(-1, keepdim=True) * 150**0.5,  # grad_q (B, H, n, d_k)
        w_abs * g.sum(-2)[..., None] * 200**0.5,  # grad_k (B, H, m, d_k)
        g.sum((0, 2, 3))[:, None] * (2 * 200 * 150) ** 0.5,  # grad_w (H, d_k)
    ]
    for lean, exact, bound in zip(*results, bounds, strict=True):
        error = (lean.double() - exact).abs()
        assert (error <= 4 * eps * bound + 1e-6).all(), f"max error {error.max():.3g}"


def test_without_a_compiler_the_kernels_step_aside_with_one_warning(monkeypatch, tmp_path):
    from headlab.model import kernels

    monkeypatch.setenv("CC", "false")  # a "compiler" that fails
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path))
    kernels._library.cache_clear()
    try:
        with pytest.warns(UserWarning, match="native additive kernels unavailable, using torch ops"):
            assert not kernels.additive_applies(torch.zeros(1))
        mha = MultiHeadAttention(D, 4, scoring="additive")
        out, weights = mha(torch.randn(B, N, D))
        assert weights.shape == (B, 4, N, N) and torch.isfinite(out).all()
        monkeypatch.setenv("CC", "cc")
        kernels._library.cache_clear()
        if shutil.which("cc"):  # a real build lands whole in the cache, with no temporary files beside it
            assert kernels.additive_applies(torch.zeros(1))
            assert [p.name.startswith("additive-") and p.suffix == ".so" for p in (tmp_path / "kernels").iterdir()] == [
                True
            ]
    finally:
        kernels._library.cache_clear()


def test_loading_the_kernels_leaves_floating_point_modes_alone(additive_path):
    """A library linked with -ffast-math by GCC 12 would flush denormals to zero in the whole process."""
    from headlab.model import kernels

    kernels.additive_applies(torch.zeros(1))  # builds and loads them (native) or not (torch)
    assert (torch.tensor([1e-39]) * 1.0).item() > 0


def test_empty_batches_give_empty_scores_and_gradients(additive_path):
    additive_scores = dispatch.additive_scores

    q, k, w = torch.randn(0, 2, 5, 3, requires_grad=True), torch.randn(0, 2, 4, 3), torch.randn(2, 3)
    scores = additive_scores(q, k, w.requires_grad_())
    scores.sum().backward()
    assert scores.shape == (0, 2, 5, 4) and q.grad.shape == q.shape and torch.equal(w.grad, torch.zeros(2, 3))


@pytest.mark.parametrize("fused_above", [1 << 22, 0])  # weights stored; fused (B H n^2 above FUSED_ABOVE)
def test_additive_attention_under_bf16_autocast_runs_and_matches_float32(monkeypatch, fused_above, additive_path):
    """Mixed precision hands the additive functions bf16 q, k, v and an fp32 w: they compute in fp32 and return
    each gradient in its input's dtype (this crashed in the backward pass once)."""
    monkeypatch.setattr(dispatch, "FUSED_ABOVE", fused_above)
    torch.manual_seed(0)
    mha = MultiHeadAttention(64, 4, scoring="additive")
    x = torch.randn(4, 40, 64, requires_grad=True)
    out, _ = mha(x, need_weights=False)
    (grad,) = torch.autograd.grad(out.square().sum(), x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, _ = mha(x, need_weights=False)
    (grad_low,) = torch.autograd.grad(low.float().square().sum(), x)
    eps = torch.finfo(torch.bfloat16).eps  # projections and output rounded to bf16: a few eps relative
    assert low.dtype == torch.bfloat16 and torch.isfinite(grad_low).all()
    assert (low.float() - out).norm() / out.norm() < 8 * eps
    assert (grad_low - grad).norm() / grad.norm() < 16 * eps


@pytest.mark.parametrize(
    ("test_file", "interpret"), [("triton_interpreted.py", "1"), ("triton_compiled.py", "0")], ids=["run", "compile"]
)
def test_triton_kernels_pass_their_tests_in_a_process_of_their_own(test_file, interpret):
    """tests/triton_interpreted.py (the kernels run on the CPU by Triton's interpreter, against the naive formula)
    and tests/triton_compiled.py (compiled for A100 and H100) in fresh processes: Triton reads TRITON_INTERPRET
    when it is first imported, and the suite's process does not import it. Triton comes with CUDA builds of torch;
    `make install` puts it in .venv/triton for CPU machines."""
    aside = Path(sys.prefix) / "triton"
    if importlib.util.find_spec("triton") is None and not (aside / "triton").is_dir():
        pytest.skip("Triton is not installed (make install puts it in .venv/triton)")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TESTS / test_file)]
    path = os.pathsep.join(p for p in (str(aside), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TRITON_INTERPRET": interpret, "PYTHONPATH": path, "TRITON_DEFAULT_FP_FUSION": "1"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout
