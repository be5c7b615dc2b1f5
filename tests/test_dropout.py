"""headlab's CPU dropout: its drop rate, scaling, gradient and reproducibility against what F.dropout promises."""

import pytest
import torch

from headlab.model.dropout import LEVELS, Dropout, dropout
from headlab.model.encoder import Encoder


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
