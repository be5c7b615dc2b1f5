"""headlab's CPU dropout: its drop rate, scaling, gradient and reproducibility against what F.dropout promises."""

import numpy as np
import pytest
import torch

from headlab.model import kernels
from headlab.model.dropout import LEVELS, Dropout, dropout
from headlab.model.encoder import Encoder

needs_native = pytest.mark.skipif(kernels._library("dropout") is None, reason="no C compiler here")


@pytest.fixture
def one_thread():
    """torch on one thread, where the native dropout applies (packs, sweeps of several jobs at a time)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drop_rate_and_scale(p):
    torch.manual_seed(0)
    x = torch.ones(1_000_003)  # not a multiple of 4: the last draw is cut
    y = dropout(x, p)
    dropped = y == 0
    p_rounded = round(p * LEVELS) / LEVELS
    assert abs(p_rounded - p) <= 0.5 / LEVELS
    assert dropped.float().mean().item() == pytest.approx(p, abs=5 * (p * (1 - p) / x.numel()) ** 0.5)
    torch.testing.assert_close(y[~dropped], torch.full_like(y[~dropped], 1 / (1 - p_rounded)))
    for lane in range(4):  # each of the four 15-bit numbers cut from one 64-bit draw is uniform
        rate = dropped[lane::4].float().mean().item()
        assert rate == pytest.approx(p, abs=5 * (p * (1 - p) / (x.numel() / 4)) ** 0.5), lane


def test_neighbouring_elements_are_independent():
    torch.manual_seed(0)
    dropped = (dropout(torch.ones(1 << 20), 0.5) == 0).float()
    both = (dropped[:-1] * dropped[1:]).mean().item()  # P(drop i and drop i+1) = 0.25 when independent
    assert both == pytest.approx(0.25, abs=0.003)


def test_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(0)
    x = torch.randn(4, 5, 6, requires_grad=True)
    y = dropout(x, 0.3)
    (y * 2).sum().backward()
    scale = 1 / (1 - round(0.3 * LEVELS) / LEVELS)
    torch.testing.assert_close(x.grad, 2 * scale * (y != 0).float())
    torch.testing.assert_close(y, x.detach() * (y != 0) * scale)


def test_seeded_runs_draw_the_same_mask_and_eval_is_the_identity():
    x = torch.randn(64, 64)
    torch.manual_seed(1)
    a = dropout(x, 0.2)
    torch.manual_seed(1)
    torch.testing.assert_close(dropout(x, 0.2), a)
    layer = Dropout(0.2).eval()
    assert layer(x) is x
    assert dropout(x, 0.0) is x


def test_extreme_probabilities():
    x = torch.randn(1000)
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    torch.manual_seed(0)
    assert torch.equal(dropout(x, 1e-6), x)  # rounds to 0: nothing dropped, nothing scaled


def test_encoder_keeps_its_state_dict_and_trains_with_dropout():
    model = Encoder(50, 2, 16, readout="cls", dropout=0.3, attention={"n_heads": 4, "dropout": 0.2})
    assert not any("drop" in key for key in model.state_dict())
    tokens = torch.randint(1, 50, (8, 16))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(model(tokens)[0], torch.zeros(8, dtype=torch.long))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 2


def seeded_dropout(x: torch.Tensor, p: float, native: bool, monkeypatch) -> tuple[torch.Tensor, torch.Tensor]:
    """dropout(x, p) and the gradient of (y * w).sum() after torch.manual_seed(3), natively or with torch ops."""
    monkeypatch.setattr(kernels, "ENABLED", native)
    assert kernels.dropout_applies(x) == native
    torch.manual_seed(3)
    x = x.clone().requires_grad_()
    y = dropout(x, p)
    w = torch.linspace(-2, 2, x.numel()).view(x.shape)
    (y * w).sum().backward()
    return y.detach(), x.grad


def bits_of(t: torch.Tensor) -> np.ndarray:
    return t.numpy().view(np.uint32)  # equal bits: -0 is not 0, and NaN equals NaN


@needs_native
def test_the_native_path_gives_the_bits_of_torch_ops_and_of_the_recipe(monkeypatch, one_thread):
    """Runs give the same numbers with or without a C compiler, and both are the documented recipe: 64-bit draws
    cut into four 15-bit uniforms, kept when u >= round(p 2^15), survivors times float32(1 / (1 - that / 2^15))."""
    n, p = (1 << 19) + 3, 0.3  # a cut last draw
    x = torch.randn(n) * 10
    x[:4] = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0])
    y_native, grad_native = seeded_dropout(x, p, True, monkeypatch)
    y_torch, grad_torch = seeded_dropout(x, p, False, monkeypatch)
    assert (bits_of(y_native) == bits_of(y_torch)).all() and (bits_of(grad_native) == bits_of(grad_torch)).all()

    torch.manual_seed(3)
    uniform = torch.empty((n + 3) // 4, dtype=torch.int64).random_().numpy().view(np.uint16)[:n] & 0x7FFF
    keep = (uniform >= round(p * LEVELS)).astype(np.float32)
    scale = np.float32(1 / (1 - round(p * LEVELS) / LEVELS))
    with np.errstate(invalid="ignore"):  # inf * 0 is NaN, in numpy as in torch
        expected = x.numpy() * keep * scale
    assert (bits_of(y_native) == expected.view(np.uint32)).all()
    w = torch.linspace(-2, 2, n).numpy()  # seeded_dropout's weights
    assert np.array_equal(grad_native.numpy(), w * keep * scale)


@needs_native
def test_on_several_threads_dropout_takes_torch_ops_and_gives_the_same_numbers(monkeypatch, one_thread):
    x = torch.randn(5000)
    expected, expected_grad = seeded_dropout(x, 0.2, True, monkeypatch)
    torch.set_num_threads(2)
    assert not kernels.dropout_applies(x)  # torch's ops run in parallel there, as fast as the kernel
    y, grad = seeded_dropout(x, 0.2, False, monkeypatch)
    assert torch.equal(y, expected) and torch.equal(grad, expected_grad)


@needs_native
def test_without_a_compiler_dropout_takes_torch_ops_with_one_warning(monkeypatch, tmp_path, one_thread):
    x = torch.randn(1000)
    expected, _ = seeded_dropout(x, 0.2, True, monkeypatch)
    monkeypatch.setenv("CC", "false")  # a "compiler" that fails
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path))
    kernels._library.cache_clear()
    try:
        with pytest.warns(UserWarning, match="native dropout kernels unavailable, using torch ops"):
            assert not kernels.dropout_applies(x)
        torch.manual_seed(3)
        assert torch.equal(dropout(x, 0.2), expected)  # the same numbers as the native path's
    finally:
        kernels._library.cache_clear()
