"""Per-head statistics on hand-computed cases; importance against per-example autograd; pruning."""

import math

import pytest
import torch

from design_models import IDS, perturbed_model
from headlab.heads.importance import accuracies, curve_masks, head_importance, pruning_curve, pruning_curves
from headlab.heads.statistics import head_similarity, head_statistics
from headlab.model.encoder import Encoder


def uniform(B, H, n, lengths):
    """Uniform attention over each example's real keys, as softmax over masked scores would give."""
    w = torch.zeros(B, H, n, n)
    for b, length in enumerate(lengths):
        w[b, :, :, :length] = 1.0 / length
    mask = torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]
    return w, mask


def test_uniform_attention_has_entropy_log_n_and_normalised_entropy_one():
    w, mask = uniform(2, 3, 6, [6, 4])
    stats = head_statistics(w, mask)
    expected_entropy = (math.log(6) + math.log(4)) / 2  # per example, then averaged over examples
    torch.testing.assert_close(stats["entropy"], torch.full((3,), expected_entropy))
    torch.testing.assert_close(stats["entropy_normalised"], torch.ones(3))
    torch.testing.assert_close(stats["confidence"], torch.full((3,), (1 / 6 + 1 / 4) / 2))
    torch.testing.assert_close(stats["attn_first"], torch.full((3,), (1 / 6 + 1 / 4) / 2))


def test_uniform_distance_excludes_padding():
    w, mask = uniform(1, 1, 5, [3])  # real tokens 0, 1, 2: mean |i - j| over j for i = 0, 1, 2 is 1, 2/3, 1
    assert head_statistics(w, mask)["distance"].item() == pytest.approx((1 + 2 / 3 + 1) / 3)


def test_one_hot_attention_to_previous_token():
    n = 5
    w = torch.zeros(1, 1, n, n)
    w[0, 0, 0, 0] = 1  # the first query has no previous token: it attends to itself
    for i in range(1, n):
        w[0, 0, i, i - 1] = 1
    stats = head_statistics(w)
    assert stats["confidence"].item() == 1 and stats["entropy"].item() == 0
    assert stats["distance"].item() == pytest.approx((n - 1) / n)
    assert stats["attn_prev"].item() == pytest.approx((n - 1) / n)
    assert stats["attn_self"].item() == pytest.approx(1 / n)
    assert stats["attn_next"].item() == 0
    assert stats["attn_first"].item() == pytest.approx(2 / n)  # queries 0 and 1 look at token 0


def test_padded_queries_are_left_out():
    w = torch.zeros(1, 1, 4, 4)
    w[0, 0, :2, :2] = torch.eye(2)  # real queries attend to themselves
    w[0, 0, 2:, 0] = 1  # padded query rows hold junk that must not count
    stats = head_statistics(w, torch.tensor([[False, False, True, True]]))
    assert stats["attn_self"].item() == 1 and stats["attn_first"].item() == 0.5


def test_score_std_recovers_the_spread_of_the_scores_from_the_weights():
    scores = 3 * torch.randn(2, 3, 6, 6, dtype=torch.float64)
    mask = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    weights = torch.softmax(scores.masked_fill(mask[:, None, None, :], -math.inf), -1)
    stats = head_statistics(weights, mask)
    per_example = []  # population std of each real query's scores over its real keys, independently
    for b, length in enumerate([6, 4]):
        real = scores[b, :, :length, :length]  # (H, length, length)
        per_example.append(real.std(-1, unbiased=False).mean(-1))  # (H,)
    torch.testing.assert_close(stats["score_std"], torch.stack(per_example).mean(0).float(), rtol=1e-5, atol=1e-5)
    assert head_statistics(*uniform(1, 2, 5, [3]))["score_std"].abs().max() < 1e-6  # uniform: equal scores


def js_divergence(p: list[float], q: list[float]) -> float:
    """Jensen-Shannon divergence of two distributions, as its definition writes it (nats)."""
    m = [(a + b) / 2 for a, b in zip(p, q, strict=True)]
    kl = lambda x: sum(a * math.log(a / c) for a, c in zip(x, m, strict=True) if a > 0)
    return kl(p) / 2 + kl(q) / 2


def test_head_similarity_is_each_pairs_js_divergence_averaged_over_real_queries_then_examples():
    torch.manual_seed(0)
    B, H, n = 3, 3, 5
    weights = [torch.softmax(2 * torch.randn(B, H, n, n), -1) for _ in range(2)]
    weights[1][0, 1, 0] = torch.tensor([1.0, 0, 0, 0, 0])  # zeros: 0 log 0 = 0
    lengths = [5, 3, 4]
    mask = torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]
    for b, length in enumerate(lengths):  # padded keys carry no weight, as the attention gives them
        for w in weights:
            w[b, :, :, length:] = 0
            w[b] /= w[b].sum(-1, keepdim=True)
    heads = [w[:, h].tolist() for w in weights for h in range(H)]  # head l * H + h: (B, n, n)
    expected = [
        [
            sum(sum(js_divergence(x[b][i], y[b][i]) for i in range(length)) / length for b, length in
                enumerate(lengths)) / B
            for y in heads
        ]
        for x in heads
    ]  # fmt: skip
    torch.testing.assert_close(head_similarity(weights, mask), torch.tensor(expected), rtol=1e-5, atol=1e-6)


def test_js_divergence_bounds():
    one_hot = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # (n, n): each query on one key
    same = torch.stack([one_hot, one_hot])[None]  # (1, 2, 2, 2): two equal heads
    assert head_similarity([same]).abs().max().item() == 0
    apart = torch.stack([one_hot, one_hot.flip(-1)])[None]  # head 1 looks where head 0 does not
    assert head_similarity([apart])[0, 1].item() == pytest.approx(math.log(2))


def test_head_similarity_matrix_over_layers():
    w0 = torch.softmax(torch.randn(2, 2, 4, 4), -1)
    w1 = torch.stack([w0[:, 0], torch.softmax(torch.randn(2, 4, 4), -1)], dim=1)  # layer 1 head 0 = layer 0 head 0
    sim = head_similarity([w0, w1])
    assert sim.shape == (4, 4)
    torch.testing.assert_close(sim, sim.T)
    assert sim[0, 2].item() == pytest.approx(0, abs=1e-7) and torch.all(sim.diagonal().abs() < 1e-7)
    assert sim[0, 1] > 0 and torch.all(sim <= math.log(2) + 1e-6)


def tiny_model(readout="mean"):
    torch.manual_seed(0)
    return Encoder(vocab_size=12, n_classes=3, max_len=8, readout=readout, d_model=16, n_layers=2,
                   dropout=0.0, attention={"n_heads": 4}).eval()  # fmt: skip


def tiny_batch(readout="mean"):
    torch.manual_seed(1)
    tokens = torch.randint(1, 12, (5, 8))
    mask = torch.arange(8)[None, :] >= torch.tensor([8, 6, 3, 8, 5])[:, None]
    labels = torch.randint(0, 3, (5,) if readout != "token" else (5, 8))
    if readout == "token":
        labels[mask] = -100
    return {"tokens": tokens, "padding_mask": mask, "labels": labels}


@pytest.mark.parametrize("readout", ["mean", "token"])
def test_importance_is_the_expected_absolute_per_example_gradient(readout):
    model, batch = tiny_model(readout), tiny_batch(readout)
    importance = head_importance(model, [batch], normalise=False)
    expected = torch.zeros(2, 4)
    for b in range(5):  # independently: one example at a time, gradient of its own loss
        xi = torch.ones(2, 4, requires_grad=True)
        logits, _ = model(batch["tokens"][b : b + 1], batch["padding_mask"][b : b + 1], head_mask=xi)
        labels = batch["labels"][b : b + 1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 3), labels.reshape(-1), ignore_index=-100)
        loss.backward()
        expected += xi.grad.abs() / 5
    torch.testing.assert_close(importance, expected, atol=1e-6, rtol=1e-5)
    normalised = head_importance(model, [batch])
    torch.testing.assert_close(normalised, expected / expected.norm(dim=-1, keepdim=True), atol=1e-6, rtol=1e-5)
    xi = torch.ones(2, 4, requires_grad=True)  # the common mistake: |gradient of the batch's summed loss|
    logits, _ = model(batch["tokens"], batch["padding_mask"], head_mask=xi)
    flat_labels = batch["labels"].reshape(-1)
    torch.nn.functional.cross_entropy(logits.reshape(-1, 3), flat_labels, ignore_index=-100).backward()
    assert not torch.allclose(importance, xi.grad.abs(), atol=1e-4)


def test_pruning_masks_the_least_important_heads_and_they_contribute_nothing():
    model, batch = tiny_model(), tiny_batch()
    importance = torch.tensor([[0.9, 0.1, 0.5, 0.3], [0.2, 0.8, 0.05, 0.7]])
    masks = []
    curve = pruning_curve(importance, lambda ms: masks.extend(ms) or accuracies(model, [batch], ms))
    assert [p["heads_pruned"] for p in curve] == list(range(9))  # ceil(10% of 8) = 1 head per step
    assert curve[3]["pruned"] == [(1, 2), (0, 1), (1, 0)]  # ascending importance
    assert torch.equal(masks[3], torch.tensor([[1.0, 0, 1, 1], [0, 1, 0, 1]]))
    masked, _ = model(batch["tokens"], batch["padding_mask"], head_mask=masks[3])
    with torch.no_grad():  # the pruned heads' outputs must not reach anything
        for layer, head in curve[3]["pruned"]:
            model.blocks[layer].attn.out_proj.weight[:, head * 4 : (head + 1) * 4] = 0
    removed, _ = model(batch["tokens"], batch["padding_mask"])
    torch.testing.assert_close(masked, removed, atol=1e-6, rtol=1e-6)
    assert curve[0]["fraction_pruned"] == 0 and curve[-1]["fraction_pruned"] == 1


def test_accuracies_under_many_masks_in_one_pass_equal_one_forward_per_mask():
    model, batch = tiny_model("token"), tiny_batch("token")  # labels per token, padding ignored
    draws = [torch.Generator().manual_seed(i) for i in range(20)]
    masks = [None, *(torch.bernoulli(torch.full((2, 4), 0.5), generator=g) for g in draws)]
    expected = []
    with torch.no_grad():
        for mask in masks:
            logits, _ = model(batch["tokens"], batch["padding_mask"], head_mask=mask)
            scored = batch["labels"] != -100
            expected.append(((logits.argmax(-1) == batch["labels"]) & scored).sum().item() / scored.sum().item())
    assert accuracies(model, [batch, batch], masks) == expected  # 21 masks: two forward passes per batch
    assert len(set(expected)) >= 3  # the masks matter


@pytest.mark.parametrize("design", IDS)
def test_a_batch_copied_at_a_layers_heads_is_the_batch_repeated_under_each_mask(design):
    """Encoder(..., copies=K, copied_at=l): the batch computed once up to layer l's heads' outputs, then K copies
    each under its own masks, against the batch repeated K times from the start under the same masks (every layer
    before l keeping all its heads, as accuracies gives them): the same logits (float64, to rounding), for every
    design, copied at each layer of three (the value residual's first values and the padding included)."""
    model, batch = perturbed_model(design, torch.float64)
    K, B = 4, batch["tokens"].shape[0]
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for at in range(3):
            masks = torch.bernoulli(torch.full((K, 3, model.n_heads), 0.5), generator=g)  # (K, L, H)
            masks[:, :at] = 1  # what copied_at promises: no head masked before it
            masks[0] = 1  # one copy unmasked
            per_example = masks.repeat_interleave(B, dim=0)  # (K B, L, H): copy k of example b at row k B + b
            copied, _ = model(batch["tokens"], batch["padding_mask"], head_mask=per_example, copies=K, copied_at=at)
            tokens, padding = batch["tokens"].repeat(K, 1), batch["padding_mask"].repeat(K, 1)
            repeated, _ = model(tokens, padding, head_mask=per_example)
            torch.testing.assert_close(copied, repeated, rtol=0, atol=1e-12, msg=f"{design} copied at {at}")
            assert not torch.allclose(copied[:B], copied[B : 2 * B])  # the masks matter


def test_the_curves_of_all_orders_are_measured_once_per_distinct_mask():
    importance, orders = torch.rand(2, 4), ["importance", "random", "reverse"]
    masks = curve_masks(importance, 0.25, orders, seed=3)  # 2 heads a step: 5 masks a curve, 15 in all
    assert len({tuple(m.flatten().tolist()) for m in masks.values()}) == len(masks) <= 13  # first, last shared
    metrics = {key: float(m[0].sum() * 10 + m[1].sum()) for key, m in masks.items()}
    curves = pruning_curves(importance, metrics, 0.25, orders, seed=3)
    for order in orders:  # each equals the curve measured on its own, mask by mask
        alone = pruning_curve(importance, lambda ms: [float(m[0].sum() * 10 + m[1].sum()) for m in ms], 0.25, order, 3)
        assert curves[order] == alone
    assert curves["importance"] != curves["reverse"]


def test_pruning_step_rounds_up():
    curve = pruning_curve(torch.rand(3, 4), lambda ms: [float(m.sum()) for m in ms], step=0.1)  # 2 per step
    assert [p["heads_pruned"] for p in curve] == [0, 2, 4, 6, 8, 10, 12]
    assert [p["metric"] for p in curve] == [12, 10, 8, 6, 4, 2, 0]


@pytest.mark.parametrize(
    "attention, shown",
    [
        (dict(n_heads=4, n_kv_heads=2), True),  # a shared key head repeated for each query head it serves
        (dict(n_heads=4, scoring="additive"), False),
        (dict(n_heads=2, differential=True), False),
        (dict(n_heads=4, talking_heads="pre"), False),
    ],
)
def test_the_neuron_views_vectors_give_each_score_or_say_why_not(attention, shown):
    from headlab.heads.probe import vectors
    from headlab.model.hooks import recorded

    model = Encoder(11, 3, 9, "cls", d_model=16, n_layers=2, attention=attention).eval()
    tokens = torch.randint(0, 11, (2, 9))
    with (
        torch.no_grad(),
        recorded(model, "hook_q") as q,
        recorded(model, "hook_k") as k,
        recorded(model, "hook_attn_scores") as scores,
    ):
        model(tokens, torch.zeros(2, 9, dtype=torch.bool), need_weights=True)
    found = vectors(model, q, k)
    if not shown:
        assert found == {"why_not": "the neuron view shows dot-product scores of one map a head, unmixed"}
        return
    for layer in range(2):  # q . k x scale, written naively, is each score the normaliser was given
        naive = torch.einsum("bhqd,bhkd->bhqk", found["q"][layer], found["k"][layer]) * found["scale"]
        assert torch.allclose(naive, scores[layer], atol=1e-5)
