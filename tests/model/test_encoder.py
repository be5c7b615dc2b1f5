"""Encoder: positions, norms, readouts, attention capture, parameter and FLOP counts."""

import math

import pytest
import torch

from headlab.model.encoder import Encoder, count_parameters, flops_per_token
from headlab.model.positions import sinusoidal as sinusoidal_positions

torch.manual_seed(0)


def encoder(**kwargs):
    defaults = dict(vocab_size=20, n_classes=5, max_len=12, readout="cls", d_model=16, n_layers=2, dropout=0.0)
    return Encoder(**{**defaults, **kwargs}).eval()


def test_sinusoidal_positions_follow_vaswani():
    pe = sinusoidal_positions(50, 16)
    for pos in (0, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("readout", ["cls", "mean", "max"])
def test_sequence_readouts_give_one_prediction_per_example(norm, readout):
    model = encoder(norm=norm, readout=readout)
    logits, weights = model(torch.randint(1, 20, (3, 10)), need_weights=True)
    n = 10 + (readout == "cls")
    assert logits.shape == (3, 5)
    assert len(weights) == 2 and all(w.shape == (3, 4, n, n) for w in weights)


def test_token_readout_gives_one_prediction_per_position_and_no_weights_by_default():
    logits, weights = encoder(readout="token")(torch.randint(1, 20, (3, 10)))
    assert logits.shape == (3, 10, 5) and weights is None


@pytest.mark.parametrize("readout", ["cls", "mean", "max", "token"])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_padding_does_not_change_predictions(readout, positional):
    model = encoder(readout=readout, positional=positional)
    tokens = torch.randint(1, 20, (1, 6))
    padded = torch.cat([tokens, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    mask = torch.tensor([[False] * 6 + [True] * 4])
    plain, _ = model(tokens)
    with_padding, _ = model(padded, key_padding_mask=mask)
    if readout == "token":
        with_padding = with_padding[:, :6]
    torch.testing.assert_close(with_padding, plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("readout", ["mean", "max"])
def test_pooled_readouts_pool_the_real_positions_of_the_last_layer(readout):
    model = encoder(readout=readout, norm="pre")
    hidden = {}
    model.final_norm.register_forward_hook(lambda module, args, out: hidden.update(x=out))  # (B, n, d)
    tokens = torch.randint(1, 20, (2, 7))
    mask = torch.tensor([[False] * 7, [False] * 4 + [True] * 3])
    logits, _ = model(tokens, key_padding_mask=mask)
    pool = (lambda h: h.mean(dim=0)) if readout == "mean" else (lambda h: h.max(dim=0).values)
    expected = torch.stack([pool(hidden["x"][0]), pool(hidden["x"][1, :4])])  # (B, d), padding left out
    torch.testing.assert_close(logits, model.classifier(expected))


def test_fused_positions_sum_their_token_embeddings():
    model = encoder(readout="token")
    pairs = torch.tensor([[[3, 7], [4, 0]]])  # position 0 holds tokens 3 and 7; position 1 holds token 4 alone
    emb = model.tok_emb.weight
    with torch.no_grad():
        summed = torch.stack([emb[3] + emb[7], emb[4]])[None]
        model.tok_emb.weight[7].zero_()
        model.tok_emb.weight[3].copy_(summed[0, 0])
    assert torch.equal(model.tok_emb.weight[0], torch.zeros(16))  # padding id adds nothing
    fused, _ = model(pairs)
    single, _ = model(torch.tensor([[3, 4]]))
    torch.testing.assert_close(fused, single)


def test_head_mask_selects_layer_and_head():
    model = encoder(readout="mean")
    tokens = torch.randint(1, 20, (2, 8))
    mask = torch.ones(2, 4)
    mask[1, 3] = 0  # layer 1, head 3
    masked, _ = model(tokens, head_mask=mask)
    with torch.no_grad():
        model.blocks[1].attn.out_proj.weight[:, 12:16] = 0
    removed, _ = model(tokens)
    torch.testing.assert_close(masked, removed, atol=1e-6, rtol=1e-6)


def test_parameter_counts_and_flops():
    model = encoder(readout="mean", attention={"n_heads": 2, "d_k": 3, "d_v": 5})
    counts = count_parameters(model)
    attn = (16 + 1) * 6 * 2 + (16 + 1) * 10 + (10 + 1) * 16
    block = attn + (16 + 1) * 64 + (64 + 1) * 16 + 2 * 2 * 16
    assert counts["attention"] == 2 * attn
    assert counts["total"] == 20 * 16 + 2 * block + (16 + 1) * 5
    assert counts["non_embedding"] == counts["total"] - 20 * 16
    assert flops_per_token(model, 12) == 6 * counts["non_embedding"] + 6 * 2 * 12 * 2 * (3 + 5)


def test_unknown_choices_fail_at_construction():
    with pytest.raises(ValueError, match="norm='middle' is invalid: expected one of post, pre"):
        encoder(norm="middle")
    with pytest.raises(ValueError, match="readout='sum' is invalid: expected one of cls, mean, max, token"):
        encoder(readout="sum")
