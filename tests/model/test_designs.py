"""The head designs beside the head split (docs/heads.md): each equals its paper's formula written out here
independently, example by example over the real keys only (padding is cut off, not masked), at float64; no design
named is the model as it was before the designs, bit for bit, and its checkpoints load."""

import math
import re

import pytest
import torch
from torch import nn

from conftest import TESTS
from headlab.errors import InvalidSetting
from headlab.model import Encoder, MultiHeadAttention, count_parameters, flops_per_token

FIXTURE = TESTS / "fixtures" / "attention_before_designs.pt"
DESIGNS = {  # each design alone, and together with the head split's other keys
    "gate headwise": dict(gate="headwise"),
    "gate elementwise": dict(gate="elementwise"),
    "talking pre": dict(talking_heads="pre"),
    "talking post": dict(talking_heads="post"),
    "talking both, additive, grouped": dict(talking_heads="both", scoring="additive", n_kv_heads=2),
    "differential": dict(differential=True),
    "differential, grouped, additive, qk-norm": dict(differential=True, n_kv_heads=2, scoring="additive", qk_norm=True),
    "differential, latent, gate": dict(differential=True, latent_kv=8, gate="elementwise"),
    "sigmoid": dict(normalizer="sigmoid"),
    "sigmoid, post mixing": dict(normalizer="sigmoid", talking_heads="post"),
    "softmax1": dict(normalizer="softmax1"),
    "softmax1, unscaled, grouped": dict(normalizer="softmax1", scale=False, n_kv_heads=1),
    "sink": dict(normalizer="sink"),
    "softpick": dict(normalizer="softpick"),
    "softpick, additive, gate": dict(normalizer="softpick", scoring="additive", gate="headwise"),
    "ssmax": dict(normalizer="ssmax"),
    "ssmax, grouped, talking both": dict(normalizer="ssmax", n_kv_heads=2, talking_heads="both"),
    "qk-norm": dict(qk_norm=True),
    "latent": dict(latent_kv=6),
    "latent, grouped, d_k d_v": dict(latent_kv=6, n_kv_heads=2, d_k=5, d_v=3),
    "everything": dict(gate="headwise", talking_heads="both", normalizer="sink", qk_norm=True, latent_kv=10),
    "rope": dict(position="rope"),
    "rope, differential, grouped, qk-norm": dict(position="rope", differential=True, n_kv_heads=2, qk_norm=True),
    "rope, base 100, latent, softpick": dict(position="rope", rope_base=100.0, latent_kv=6, normalizer="softpick"),
    "alibi": dict(position="alibi"),
    "alibi, additive, sigmoid": dict(position="alibi", scoring="additive", normalizer="sigmoid"),
    "alibi, talking both, ssmax, grouped": dict(
        position="alibi", talking_heads="both", normalizer="ssmax", n_kv_heads=2
    ),
    "alibi, differential": dict(position="alibi", differential=True),
    "value residual": dict(value_residual=True, layer=1),
    "value residual, grouped, rope, gate": dict(
        value_residual=True, layer=1, n_kv_heads=2, position="rope", gate="headwise"
    ),
    "moh": dict(moh=dict(k=2, shared=1)),
    "moh, 2 shared 1 routed, gate, grouped": dict(moh=dict(k=1, shared=2), gate="elementwise", n_kv_heads=2),
    "moh, differential": dict(moh=dict(k=1, shared=1), differential=True),
    "mta": dict(mta=dict(query_kernel=3, key_kernel=5, head_group=2)),
    "mta 1x1, groups of 4, alibi, additive": dict(
        mta=dict(query_kernel=1, key_kernel=1, head_group=4), position="alibi", scoring="additive"
    ),
    "mta, group norm": dict(mta=dict(query_kernel=3, key_kernel=5, head_group=2, group_norm=True)),
    "mta, group norm, gate, grouped, d_v": dict(
        mta=dict(query_kernel=1, key_kernel=3, head_group=4, group_norm=True), gate="headwise", n_kv_heads=2, d_v=3
    ),
    "mta, sigmoid, grouped, d_k d_v": dict(
        mta=dict(query_kernel=5, key_kernel=3, head_group=1), normalizer="sigmoid", n_kv_heads=2, d_k=5, d_v=3
    ),
}


def value_store(attn: MultiHeadAttention, B: int, n: int) -> dict:
    """What an earlier first layer left for a value-mixing layer: its values (B, G, n, d_v)."""
    gen = torch.Generator().manual_seed(2)
    return {"first": torch.randn(B, attn.n_kv_heads, n, attn.d_v, generator=gen, dtype=attn.v_proj.weight.dtype)}


def rotated(x: torch.Tensor, base: float) -> torch.Tensor:
    """Su et al. 2021: position i's pairs (x_2p, x_2p+1) turned by the angle i base^(-2p/d): x (n, ..., d)."""
    out = x.clone()
    d = x.shape[-1]
    for i in range(x.shape[0]):
        for p in range(d // 2):
            angle = torch.tensor(i * base ** (-2 * p / d), dtype=x.dtype)
            a, b = x[i, ..., 2 * p], x[i, ..., 2 * p + 1]
            out[i, ..., 2 * p] = a * torch.cos(angle) - b * torch.sin(angle)
            out[i, ..., 2 * p + 1] = a * torch.sin(angle) + b * torch.cos(angle)
    return out


def moh_weights(attn: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """MoH's g for one position x (d,): alpha_1 softmax(W_s x)_i on the shared heads; alpha_2 softmax(W_r x)_i on a
    routed head among the k of largest (W_r x)_i, else 0; [alpha_1, alpha_2] = softmax(W_h x): (H,)."""
    alpha = torch.softmax(attn.route_split.weight @ x, 0)
    shared = alpha[0] * (
        torch.ones(1, dtype=x.dtype) if attn.route_shared is None else torch.softmax(attn.route_shared.weight @ x, 0)
    )
    logits = attn.route_routed.weight @ x
    ranked = sorted(range(len(logits)), key=lambda i: -float(logits[i].detach()))[: attn.moh_k]
    routed = alpha[1] * torch.softmax(logits, 0) * torch.tensor([i in ranked for i in range(len(logits))])
    return torch.cat([shared, routed])


def press_slopes(H: int) -> list[float]:
    """ALiBi's slopes as Press et al.'s code computes them."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(H).is_integer():
        return power_of_2(H)
    closest = 2 ** math.floor(math.log2(H))
    return power_of_2(closest) + press_slopes(2 * closest)[0::2][: H - closest]


def perturbed(attn: nn.Module) -> nn.Module:
    """Every parameter moved off its initial value (identity mixings, zero sinks, unit norms would hide terms)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)
    return attn


def layer_norm(x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def reference(attn: MultiHeadAttention, x: torch.Tensor, lengths: list[int], store=None) -> tuple[torch.Tensor, list]:
    """Each design's formula, one example at a time over its real keys: (out (B, n, d), [weights (H, n, L_b)])."""
    H, G, d_k, d_v, c = attn.n_heads, attn.n_kv_heads, attn.d_k, attn.d_v, attn.maps
    outs, maps = [], []
    for b, L in enumerate(lengths):
        xb = x[b]  # (n, d)
        q = (xb @ attn.q_proj.weight.T + attn.q_proj.bias).view(-1, H, c, d_k)  # (n, H, c, d_k)
        source = xb[:L] if attn.kv_down is None else xb[:L] @ attn.kv_down.weight.T  # (L, d) or (L, r)
        k = (source @ attn.k_proj.weight.T + attn.k_proj.bias).view(L, G, c, d_k)
        v = (source @ attn.v_proj.weight.T + attn.v_proj.bias).view(L, G, d_v)
        if attn.q_norm is not None:
            q, k = layer_norm(q, attn.q_norm), layer_norm(k, attn.k_norm)
        if attn.value_mix is not None:  # Zhou et al. 2024: lambda_1 V_l + lambda_2 V_1
            v = attn.value_mix[0] * v + attn.value_mix[1] * store["first"][b, :, :L].transpose(0, 1)
        if attn.position == "rope":
            q, k = rotated(q, attn.rope_base), rotated(k, attn.rope_base)
        scores = torch.zeros(H, c, len(xb), L, dtype=x.dtype)
        for h in range(H):
            g = h // (H // G)  # its key/value head
            for m in range(c):
                if attn.scoring == "additive":
                    w = attn.score_vector[h]
                    for i in range(len(xb)):
                        for j in range(L):
                            scores[h, m, i, j] = w @ torch.tanh(q[i, h, m] + k[j, g, m])
                else:
                    scores[h, m] = q[:, h, m] @ k[:, g, m].T * attn.scale
                if attn.position == "alibi":  # Press et al. 2022, both directions: -m_h |i - j|
                    for i in range(len(xb)):
                        for j in range(L):
                            scores[h, m, i, j] -= press_slopes(H)[h] * abs(i - j)
        if attn.logit_mix is not None:  # Shazeer et al. 2020: L[h'] = sum_h J[h] P_l[h, h']
            scores = torch.stack([sum(attn.logit_mix[h, t] * scores[h] for h in range(H)) for t in range(H)])
        if (
            attn.mta_kernel is not None
        ):  # Golovneva et al. 2025: sum_{a, b} theta_h[a, b] s[i + a - c_q/2, j + b - c_k/2]
            cq, ck = attn.mta_kernel.shape[-2:]
            real = scores.clone()
            real[:, :, L:] = 0  # a padded query's logits: 0 (its keys beyond L are not there: 0 too)
            conv = torch.zeros_like(scores)
            for h in range(H):
                for i in range(len(xb)):
                    for j in range(L):
                        for a in range(cq):
                            for b_ in range(ck):
                                i2, j2 = i + a - cq // 2, j + b_ - ck // 2
                                if 0 <= i2 < len(xb) and 0 <= j2 < L:
                                    conv[h, :, i, j] += attn.mta_kernel[h, 0, a, b_] * real[h, :, i2, j2]
            scores = conv
        e = torch.exp(scores)
        if attn.normalizer == "softmax":
            A = e / e.sum(-1, keepdim=True)
        elif attn.normalizer == "sigmoid":  # Ramapuram et al. 2024: sigmoid(s + b), b = -log n
            A = 1 / (1 + torch.exp(-(scores - math.log(L))))
        elif attn.normalizer == "softmax1":  # Miller 2023: exp(s) / (1 + sum exp(s))
            A = e / (1 + e.sum(-1, keepdim=True))
        elif attn.normalizer == "softpick":  # Zuhri et al. 2025: relu(e^s - 1) / (sum |e^s - 1| + eps)
            A = torch.relu(e - 1) / ((e - 1).abs().sum(-1, keepdim=True) + 1e-6)
        elif attn.normalizer == "ssmax":  # Nakanishi 2025: softmax(c_h log(n) s), n: the real keys
            scaled = torch.exp(scores * attn.length_scale.view(H, 1, 1, 1) * math.log(L))
            A = scaled / scaled.sum(-1, keepdim=True)
        else:  # sink: exp(s) / (exp(z_h) + sum exp(s))
            A = e / (torch.exp(attn.sink_logit).view(H, 1, 1, 1) + e.sum(-1, keepdim=True))
        if attn.differential:  # Ye et al. 2024
            lam = (
                torch.exp(torch.dot(attn.lambda_q1, attn.lambda_k1))
                - torch.exp(torch.dot(attn.lambda_q2, attn.lambda_k2))
                + (0.8 - 0.6 * math.exp(-0.3 * 0))
            )
            A = A[:, 0] - lam * A[:, 1]  # (H, n, L)
        else:
            A = A[:, 0]
        if attn.weight_mix is not None:  # U[h'] = sum_h W[h] P_w[h, h']
            A = torch.stack([sum(attn.weight_mix[h, t] * A[h] for h in range(H)) for t in range(H)])
        if attn.mta_mix is not None:  # within a group of g heads: A'[t] = sum_s M[s, t] A[s]
            g = attn.mta_mix.shape[-1]
            A = torch.stack(
                [sum(attn.mta_mix[t // g, s, t % g] * A[(t // g) * g + s] for s in range(g)) for t in range(H)]
            )
        heads = []
        for h in range(H):
            o = A[h] @ v[:, h // (H // G)]  # (n, d_v)
            if attn.differential:
                rms = torch.sqrt((o**2).mean(-1, keepdim=True) + attn.head_norm.eps)
                o = o / rms * attn.head_norm.weight * (1 - attn.lambda_init)
            if attn.mta_norm is not None:  # Golovneva et al. 2025's group norm, scalar gate: o' = n sigmoid(w . n + b)
                o = o / torch.sqrt((o**2).mean(-1, keepdim=True) + attn.mta_norm.eps) * attn.mta_norm.weight
                o = o * torch.sigmoid(o @ attn.mta_gate.weight[0] + attn.mta_gate.bias)[:, None]
            if attn.gate == "headwise":  # Qiu et al. 2025: Y * sigmoid(X W)
                o = o * torch.sigmoid(xb @ attn.gate_proj.weight[h])[:, None]
            elif attn.gate == "elementwise":
                o = o * torch.sigmoid(xb @ attn.gate_proj.weight[h * d_v : (h + 1) * d_v].T)
            if attn.moh_k is not None:  # Jin et al. 2024: g_h of each position
                o = o * torch.stack([moh_weights(attn, token)[h] for token in xb])[:, None]
            heads.append(o)
        outs.append(torch.cat(heads, -1) @ attn.out_proj.weight.T + attn.out_proj.bias)
        maps.append(A)
    return torch.stack(outs), maps


LENGTHS = [7, 4, 6]


@pytest.mark.parametrize("name", sorted(DESIGNS))
def test_each_design_equals_its_formula_on_a_padded_batch(name):
    torch.manual_seed(0)
    attn = perturbed(MultiHeadAttention(16, 4, **DESIGNS[name]).double())
    x = torch.randn(len(LENGTHS), max(LENGTHS), 16, dtype=torch.float64)
    padding = torch.arange(max(LENGTHS))[None, :] >= torch.tensor(LENGTHS)[:, None]  # (B, n)
    store = value_store(attn, len(LENGTHS), max(LENGTHS))
    out, weights = attn(x, padding, pass_state=dict(store))
    expected, maps = reference(attn, x, LENGTHS, store)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    for b, L in enumerate(LENGTHS):
        torch.testing.assert_close(weights[b, :, :, :L], maps[b], rtol=1e-10, atol=1e-10)
        assert (weights[b, :, :, L:] == 0).all()  # padded keys: exactly zero weight
    fused, none = attn(x, padding, need_weights=False, pass_state=dict(store))
    assert none is None
    torch.testing.assert_close(fused, out, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", sorted(DESIGNS))
def test_every_parameter_of_every_design_gets_a_gradient(name):
    torch.manual_seed(0)
    attn = perturbed(MultiHeadAttention(16, 4, **DESIGNS[name]))
    padding = torch.arange(7)[None, :] >= torch.tensor([7, 4])[:, None]
    attn(torch.randn(2, 7, 16), padding, need_weights=False, pass_state=value_store(attn, 2, 7))[
        0
    ].square().sum().backward()
    assert [n for n, p in attn.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0] == []


def test_without_a_design_the_model_is_the_one_before_the_designs():
    """Outputs, weights and the fused path's outputs of models saved before the designs existed, and their
    initialisation from the same seed: the initialisation equal to the last bit, the state dicts loading strictly,
    the outputs equal to the last bit on a CPU like the one that saved them and within float32 rounding (1e-6) on
    another (its matmul kernels sum in another order: 1-2 ulp, seen between two Xeons)."""
    for name, saved in torch.load(FIXTURE, weights_only=False).items():
        torch.manual_seed(0)
        model = Encoder(11, 3, 9, "cls", d_model=16, n_layers=2, attention=saved["attention"]).eval()
        fresh = model.state_dict()
        assert all(torch.equal(fresh[k], v) for k, v in saved["state_dict"].items()), name
        model.load_state_dict(saved["state_dict"], strict=True)
        with torch.no_grad():
            logits, weights = model(saved["tokens"], saved["padding"], need_weights=True)
            fused, _ = model(saved["tokens"], saved["padding"], need_weights=False)
        rounding = {"rtol": 0, "atol": 1e-6, "msg": name}
        torch.testing.assert_close(logits, saved["logits"], **rounding)
        torch.testing.assert_close(fused, saved["fused"], **rounding)
        for w, s in zip(weights, saved["weights"], strict=True):
            torch.testing.assert_close(w, s, **rounding)


def test_softmax1_under_dot_scoring_runs_fused_over_a_zero_key(monkeypatch):
    from headlab.model import dispatch

    calls = []
    real = dispatch.dot_attention
    monkeypatch.setattr(dispatch, "dot_attention", lambda *a: calls.append(a[1].shape) or real(*a))
    attn = MultiHeadAttention(16, 4, normalizer="softmax1", n_kv_heads=2)
    padding = torch.arange(5)[None, :] >= torch.tensor([5, 3])[:, None]
    x = torch.randn(2, 5, 16)
    fused, _ = attn(x, padding, need_weights=False)
    assert calls == [(2, 2, 6, 4)]  # keys (B, G, m + 1, d_k): the zero key beside the five
    torch.testing.assert_close(fused, attn(x, padding)[0])
    for design in (dict(normalizer="sink"), dict(talking_heads="pre"), dict(differential=True)):
        calls.clear()
        MultiHeadAttention(16, 4, **design)(x, padding, need_weights=False)
        assert calls == [], design  # no exact fused path: the explicit one


def test_differential_lambda_init_follows_the_layer():
    model = Encoder(11, 3, 9, "cls", d_model=16, n_layers=3, attention=dict(n_heads=2, differential=True))
    expected = [0.8 - 0.6 * math.exp(-0.3 * layer) for layer in range(3)]  # 0.2, 0.356, 0.471
    assert [b.attn.lambda_init for b in model.blocks] == pytest.approx(expected)


def test_a_parameter_matched_differential_head_halves_the_heads():
    """Ye et al.: h = d_model / 2d differential heads of component size d match d_model / d plain heads of size d."""
    plain, diff = MultiHeadAttention(64, 4), MultiHeadAttention(64, 2, differential=True)
    assert (diff.d_k, diff.d_v) == (16, 32) == (plain.d_k, 2 * plain.d_v)
    extra = 4 * diff.d_k + diff.d_v  # the four lambda vectors and the head normalisation's gain
    assert sum(p.numel() for p in diff.parameters()) == sum(p.numel() for p in plain.parameters()) + extra


@pytest.mark.parametrize(
    ("design", "params", "flops"),
    [  # d_model 16, 4 heads of 4, 8 positions + cls; parameters and training FLOPs a token beyond the plain model's
        (dict(), 0, 0),
        (dict(gate="headwise"), 16 * 4, 6 * 16 * 4),
        (dict(gate="elementwise"), 16 * 16, 6 * 16 * 16),
        (dict(talking_heads="both"), 2 * 16, 6 * 2 * 16 + 6 * 9 * 2 * 16),
        (dict(normalizer="sink"), 4, 6 * 4),
        (dict(qk_norm=True), 4 * 4, 6 * 4 * 4),
        (dict(latent_kv=4), -(2 * 16 * 16) + 16 * 4 + 4 * 32, 6 * (-(2 * 16 * 16) + 16 * 4 + 4 * 32)),
        (dict(differential=True), 4 * 2 + 4, 6 * (4 * 2 + 4)),  # d_k 2 a component, d_v 4: score FLOPs equal
        (dict(value_residual=True), 0, 0),  # one layer: the first, whose values are not mixed
        (dict(moh=dict(k=1, shared=2)), 16 * (4 + 2), 6 * 16 * (4 + 2)),  # routers W_s, W_r, W_h: d (H + 2)
        (dict(moh=dict(k=1, shared=1)), 16 * (3 + 2), 6 * 16 * (3 + 2)),  # one shared head: softmax 1, no W_s
        (  # a (3, 5) kernel a head, 2 x 2 mixing a group: 6 L n H (c_q c_k + g) more
            dict(mta=dict(query_kernel=3, key_kernel=5, head_group=2)),
            4 * 15 + 2 * 4,
            6 * (4 * 15 + 2 * 4) + 6 * 9 * 4 * (15 + 2),
        ),
        (  # and its group norm: one RMSNorm weight d_v and one gate (d_v + 1) for all heads
            dict(mta=dict(query_kernel=3, key_kernel=5, head_group=2, group_norm=True)),
            4 * 15 + 2 * 4 + 4 + 5,
            6 * (4 * 15 + 2 * 4 + 4 + 5) + 6 * 9 * 4 * (15 + 2),
        ),
    ],
)
def test_parameters_and_flops_count_each_designs_terms(design, params, flops):
    plain = Encoder(11, 3, 8, "cls", d_model=16, n_layers=1, attention=dict(n_heads=4))
    model = Encoder(11, 3, 8, "cls", d_model=16, n_layers=1, attention=dict(n_heads=4, **design))
    assert count_parameters(model)["total"] - count_parameters(plain)["total"] == params
    assert flops_per_token(model, 8) - flops_per_token(plain, 8) == flops


@pytest.mark.parametrize(
    ("design", "message"),
    [
        (
            dict(differential=True, talking_heads="pre"),
            "talking_heads='pre' is invalid: expected none while differential=true",
        ),
        (
            dict(differential=True, normalizer="sigmoid"),
            "normalizer='sigmoid' is invalid: expected softmax while differential=true",
        ),
        (
            dict(normalizer="relu"),
            "normalizer='relu' is invalid: expected one of sigmoid, sink, softmax, softmax1, softpick, ssmax",
        ),
        (dict(gate="channel"), "gate='channel' is invalid: expected one of elementwise, headwise, none"),
        (dict(talking_heads="yes"), "talking_heads='yes' is invalid: expected one of none, pre, post, both"),
        (dict(latent_kv=0), "latent_kv=0 is invalid: expected an int >= 1"),
        (dict(differential=True, n_heads=3), "n_heads=3 is invalid: expected half a divisor of d_model=16"),
        (dict(position="rope", scoring="additive"), "scoring='additive' is invalid: expected dot with position=rope"),
        (dict(position="rope", d_k=3), "d_k=3 is invalid: expected an even number with position=rope"),
        (dict(position="relative"), "position='relative' is invalid: expected one of none, rope, alibi"),
        (dict(moh=dict(k=3, shared=1)), "moh.k=3 is invalid: expected an int in [1, 3) (routed heads on a token"),
        (dict(moh=dict(k=1, shared=0)), "moh.shared=0 is invalid: expected an int in [1, n_heads=4)"),
        (dict(moh=dict(k=1)), "moh={'k': 1} is invalid: expected null or {k, shared[, balance]}"),
        (
            dict(mta=dict(query_kernel=2, key_kernel=5, head_group=2)),
            "mta.query_kernel=2 is invalid: expected an odd int >= 1 (a kernel centred on the logit)",
        ),
        (
            dict(mta=dict(query_kernel=3, key_kernel=5, head_group=3)),
            "mta.head_group=3 is invalid: expected a divisor of n_heads=4",
        ),
        (
            dict(mta=dict(query_kernel=3)),
            "mta={'query_kernel': 3} is invalid: expected null or {query_kernel, key_kernel, head_group[, group_norm]}",
        ),
        (
            dict(mta=dict(query_kernel=3, key_kernel=5, head_group=2, group_norm="yes")),
            "mta.group_norm='yes' is invalid: expected true or false",
        ),
        (
            dict(mta=dict(query_kernel=3, key_kernel=5, head_group=2), talking_heads="post"),
            "talking_heads='post' is invalid: expected none with mta (it mixes heads itself)",
        ),
        (
            dict(mta=dict(query_kernel=3, key_kernel=5, head_group=2), differential=True),
            "is invalid: expected null while differential=true",
        ),
    ],
)
def test_impossible_designs_fail_at_construction_naming_both_keys(design, message):
    with pytest.raises(InvalidSetting, match=re.escape(message)):
        MultiHeadAttention(16, **{"n_heads": 4, **design})


# what the analysis reads from each design: weights that need not sum to 1, signed maps, gates, mixing


def test_statistics_of_rows_that_do_not_sum_to_one_read_their_mass_and_their_distribution():
    """Two queries over three keys: a sink row (mass 0.5) and a signed differential row (mass 0.4)."""
    w = torch.tensor([[[[0.25, 0.25, 0.0], [0.6, -0.2, 0.0]]]])  # (B=1, H=1, n=2 queries... padded to 3 keys)
    w = torch.nn.functional.pad(w, (0, 0, 0, 1))  # (1, 1, 3, 3): a third query of zeros, padded
    padding = torch.tensor([[False, False, True]])
    from headlab.heads.statistics import head_statistics

    stats = head_statistics(w, padding)
    assert stats["mass"].item() == pytest.approx((0.5 + 0.4) / 2)
    p_sink, p_diff = [0.5, 0.5], [0.75, 0.25]  # |A| / sum |A|
    entropy = lambda p: -sum(x * math.log(x) for x in p)  # noqa: E731
    assert stats["entropy"].item() == pytest.approx((entropy(p_sink) + entropy(p_diff)) / 2)
    assert stats["confidence"].item() == pytest.approx((0.5 + 0.75) / 2)
    assert stats["attn_first"].item() == pytest.approx((0.25 + 0.6) / 2)  # A's own entries, signed
    assert stats["attn_self"].item() == pytest.approx((0.25 - 0.2) / 2)


def test_one_hot_and_disjoint_heads_have_finite_statistics_and_similarity():
    """float32 one-hot rows beside rows whose weights underflow (a sharp softmax): nothing infinite, disjoint
    heads at the largest divergence, ln 2."""
    from headlab.heads.statistics import head_report

    n = 4
    one_hot = torch.eye(n)[None, None]  # (1, 1, n, n): each query on itself
    tiny = torch.full((n, n), 1e-45).fill_diagonal_(0.0)  # a subnormal weight where the other head has none
    sharp = (torch.roll(torch.eye(n), 1, dims=1) + tiny)[None, None]
    report = head_report([torch.cat([one_hot, sharp], dim=1)], None)
    values = [v for row in report["rows"] for k, v in row.items() if k not in ("layer", "head")]
    assert all(math.isfinite(v) for v in values)
    assert torch.isfinite(report["similarity"]).all()
    assert report["similarity"][0, 1].item() == pytest.approx(math.log(2), rel=1e-6)


def test_score_std_is_the_spread_of_the_logits_the_normaliser_was_given():
    """Sigmoid weights are not the logits up to a shift: the recorded logits give the spread, over real keys."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(8, 2, normalizer="sigmoid")
    x, padding = torch.randn(2, 5, 8), torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    from headlab.heads.statistics import head_statistics
    from headlab.model.hooks import recorded

    with torch.no_grad(), recorded(attn, "hook_attn_scores") as scores:
        _, weights = attn(x, padding)
    stats = head_statistics(weights, padding, scores[0])
    expected = torch.zeros(2)
    for b, L in enumerate((5, 3)):
        s = scores[0][b, :, :L, :L]  # real queries, real keys
        expected += s.std(-1, unbiased=False).mean(-1) / 2
    torch.testing.assert_close(stats["score_std"], expected)


def probe_model(**attention) -> Encoder:
    torch.manual_seed(0)
    return perturbed(Encoder(11, 3, 6, "cls", d_model=16, n_layers=2, attention=dict(n_heads=4, **attention)))


def test_the_probe_reports_each_gates_mean_and_each_layers_mixing():
    from headlab.heads import probe

    class Data:  # what probe.attention asks of a datamodule
        relevant_roles = ()

        def attention_roles(self, tokens, padding):
            return ["any"], torch.zeros(tokens.shape + tokens.shape[-1:], dtype=torch.long).numpy()

    tokens, padding = torch.randint(1, 11, (3, 6)), torch.zeros(3, 6, dtype=torch.bool)
    padding[1, 4:] = True
    batch = {"tokens": tokens, "padding_mask": padding, "labels": torch.zeros(3, dtype=torch.long)}
    model = probe_model(gate="headwise", talking_heads="post").eval()
    seen = probe.attention(model, Data(), batch)
    x = torch.cat([model.cls.expand(3, -1, -1), model.tok_emb(tokens)], dim=1) + model.pos_emb[:7]  # layer 0's input
    gate = torch.sigmoid(x @ model.blocks[0].attn.gate_proj.weight.T)  # (B, n', H)
    real = ~model.attention_padding_mask(padding)
    expected = torch.stack([gate[b][real[b]].mean(0) for b in range(3)]).mean(0)
    layer0 = [r["gate"] for r in seen["report"]["rows"] if r["layer"] == 0]
    assert layer0 == pytest.approx(expected.tolist(), rel=1e-5)
    assert seen["mixing"].keys() == {"weights"}
    assert seen["mixing"]["weights"][1] == model.blocks[1].attn.weight_mix.tolist()
    assert "gate" not in probe.attention(probe_model(), Data(), batch)["report"]["rows"][0]


def test_signed_maps_are_drawn_on_a_diverging_scale_and_mixing_matrices_as_a_figure():
    from headlab.heads import figures, head_view

    signed = torch.tensor([[[[0.9, -0.3], [0.2, 0.5]]]])  # (E, H, n, n)
    fig = figures.attention_maps(signed)
    assert fig.axes[-1].get_ylabel() == "attention weight (signed)"
    assert fig.axes[0].images[0].norm.vmin == -fig.axes[0].images[0].norm.vmax
    assert figures.attention_maps(signed.abs()).axes[-1].get_ylabel() == "attention weight (log scale)"
    mixing = figures.mixing_maps({"logits": [torch.eye(3).tolist()], "weights": [torch.eye(3).tolist()]})
    assert [ax.get_title() for ax in mixing.axes[:2]] == ["layer 0: logits", "layer 0: weights"]
    page = head_view.page_data({"weights": [signed.numpy()], "tokens": [["a", "b"]], "rows": []}, "t")
    assert page["signed"] and page["scale"] == 1.0
    assert page["examples"][0]["attention"][0][0] == [[900, -300], [200, 500]]


def test_the_head_view_draws_signed_weights_on_a_diverging_scale(tmp_path, browser):
    """A differential head's negative weights: dashed lines and blue cells, each as opaque as |w|."""
    from headlab.heads import probe

    weights = torch.tensor([[[[0.8, -0.4, 0.1], [0.05, 0.7, -0.2], [0.3, 0.3, 0.3]]]]).numpy()  # (E, H, n, n)
    rows = [{"layer": 0, "head": 0, "entropy": 1.0, "mass": 0.6}]
    probe.write_head_view(
        tmp_path / "view.html", {"weights": [weights], "tokens": [["a", "b", "c"]], "rows": rows}, "t"
    )
    browser.get((tmp_path / "view.html").as_uri())
    lines = browser.execute_script(
        "return [...document.querySelectorAll('line.attn')].map(l => [Number(l.dataset.query), "
        "Number(l.dataset.key), l.getAttribute('stroke-opacity'), l.getAttribute('stroke-dasharray')])"
    )
    assert sorted(lines) == sorted(
        [
            [0, 0, "0.800", None],
            [0, 1, "0.400", "4 3"],
            [0, 2, "0.100", None],
            [1, 0, "0.050", None],
            [1, 1, "0.700", None],
            [1, 2, "0.200", "4 3"],
            [2, 0, "0.300", None],
            [2, 1, "0.300", None],
            [2, 2, "0.300", None],
        ]
    )
    assert "dashed = negative" in browser.find_element("id", "note").text
    browser.find_element("css selector", "#mode option[value='matrix']").click()
    cells = browser.execute_script(
        "return [...document.querySelectorAll('rect.cell')].map(c => [c.getAttribute('fill'), "
        "c.getAttribute('fill-opacity')])"
    )
    assert cells[1] == ["#2166ac", "0.400"] and cells[0] == ["#b2182b", "0.800"]


def test_relevant_is_the_share_of_each_heads_attention_on_the_keys_a_query_names():
    """pair_recall: for each scored query, the weight (of |A| / sum |A|: signed for a differential head) on the
    context positions of keys a and b, averaged over scored queries, computed here by hand from the tokens."""
    from headlab.data.datamodule import TaskDataModule
    from headlab.data.recall import AssociativeRecall
    from headlab.heads import probe

    data = TaskDataModule(
        AssociativeRecall(n_keys=16, n_values=10, n_pairs=6, n_queries=4, lookups=2, fused=True),
        n_train=8,
        n_val=8,
        n_test=8,
        batch_size=8,
        seed=0,
    )
    data.setup()
    batch = data.probe_batch(4)
    torch.manual_seed(0)
    model = perturbed(
        Encoder(
            data.vocab_size,
            data.n_classes,
            data.max_len,
            "token",
            d_model=16,
            attention=dict(n_heads=2, differential=True),
        )
    ).eval()
    seen = probe.attention(model, data, batch)
    with torch.no_grad():
        _, (weights,) = model(batch["tokens"], batch["padding_mask"], need_weights=True)
    P = weights.abs() / weights.abs().sum(-1, keepdim=True)
    tokens = batch["tokens"]  # (B, n, 2): a context position holds (key, value), a query (key a, key b + offset)
    expected, count = torch.zeros(2), 0
    for b in range(len(tokens)):
        for i in range(len(tokens[b])):
            if batch["labels"][b, i] < 0:
                continue  # not a scored query
            a, second = int(tokens[b, i, 0]), int(tokens[b, i, 1]) - 16 - 10
            keys = [j for j in range(6) if int(tokens[b, j, 0]) in (a, second)]
            expected += P[b, :, i, keys].sum(-1)
            count += 1
    assert [r["relevant"] for r in seen["report"]["rows"]] == pytest.approx((expected / count).tolist(), rel=1e-5)


def test_hooks_read_and_replace_each_stage_as_the_same_edit_made_by_hand():
    """hook_pattern replaced (head 2's weights uniform over real keys) equals that edit made by hand on the
    weights; hook_z zeroed for head 1, hook_result zeroed for head 1 and head_mask 0 for head 1 agree; hook_result
    passed through unchanged sums to the output."""
    torch.manual_seed(0)
    attn = perturbed(MultiHeadAttention(16, 4, gate="headwise")).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    out, weights = attn(x, padding)

    uniform = (~padding).double()[:, None, :] / (~padding).sum(-1)[:, None, None]  # (B, 1, n)

    def flatten_head_2(module, args, pattern):
        pattern = pattern.clone()
        pattern[:, 2] = uniform
        return pattern

    handle = attn.hook_pattern.register_forward_hook(flatten_head_2)
    hooked, _ = attn(x, padding, need_weights=False)  # a hook on the pattern: the explicit path, with the edit
    handle.remove()
    q, k, v = attn.project(x)
    by_hand = weights.clone()
    by_hand[:, 2] = uniform
    y = attn.gated(by_hand @ v, x)
    torch.testing.assert_close(hooked, attn.merge(y, None), rtol=1e-12, atol=1e-12)

    masked, _ = attn(x, padding, head_mask=torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64))
    for point in ("hook_z", "hook_result"):

        def zero_head_1(module, args, t, point=point):
            t = t.clone()
            if point == "hook_z":
                t[:, 1] = 0
            else:
                t[:, :, 1] = 0
            return t

        handle = getattr(attn, point).register_forward_hook(zero_head_1)
        torch.testing.assert_close(attn(x, padding)[0], masked, rtol=1e-12, atol=1e-12)
        handle.remove()
    handle = attn.hook_result.register_forward_hook(lambda module, args, t: None)  # reads, changes nothing
    torch.testing.assert_close(attn(x, padding)[0], out, rtol=1e-12, atol=1e-12)
    handle.remove()


def test_the_memory_estimate_counts_each_designs_tensors():
    """Defaults as before the designs; a differential head's two maps, an output gate's width and a latent's rank
    add their parameters and activations (rules.training_bytes, which the memory check and pack sizing use)."""
    from headlab.model.rules import training_bytes

    sizes = dict(vocab_size=100, n_classes=5, positions=33, batch_size=64, d_model=64, n_layers=1, d_ff=256,
                 n_heads=4, d_k=16, d_v=16, n_kv_heads=4)  # fmt: skip
    plain = training_bytes(**sizes)
    params = 100 * 64 + 33 * 64 + (4 * 64 * 64 + 2 * 64 * 256 + 6 * 64 + 2 * 256) + 64 * 6  # q, k v, out: 4 d^2
    per_position = 3 * (64 + 128) + 20 * 64 + 2 * 256 + 3 * 4 * 33
    assert plain == 20 * params + 4 * 64 * 33 * per_position  # the estimate as it was
    gate = training_bytes(**sizes, gate_width=64)
    assert gate - plain == 20 * 64 * 64 + 4 * 64 * 33 * 3 * 64
    differential = training_bytes(**{**sizes, "d_k": 8}, maps=2)  # same parameters, twice the maps
    assert differential - plain == 4 * 64 * 33 * 3 * 4 * 33
    latent = training_bytes(**sizes, latent_kv=16)  # fewer parameters, one more activation (the latent)
    assert latent - plain == 20 * ((64 + 128) * 16 - 64 * 128) + 4 * 64 * 33 * 3 * 16
    rotary = training_bytes(**sizes, rotary=True)  # rotated copies of queries and keys
    assert rotary - plain == 4 * 64 * 33 * 2 * (64 + 64)
    alibi = training_bytes(**sizes, alibi=True)  # one bias row a head
    assert alibi - plain == 4 * 64 * 33 * 4 * 33
    mixed = training_bytes(**sizes, value_residual=True)  # the mixed values
    assert mixed - plain == 4 * 64 * 33 * 64
    mta = training_bytes(**sizes, mta=True)  # convolved logits and mixed weights: two rows a head (parameters aside)
    assert mta - plain == 4 * 64 * 33 * 2 * 4 * 33


def test_alibi_slopes_are_press_et_al_s_for_any_head_count_and_rope_scores_depend_on_distance_only():
    from headlab.model.positions import alibi_slopes, rotate

    for H in (1, 2, 3, 4, 6, 8, 12, 16):
        torch.testing.assert_close(alibi_slopes(H), torch.tensor(press_slopes(H)))
    q, k = torch.randn(1, 16, dtype=torch.float64), torch.randn(1, 16, dtype=torch.float64)
    at = lambda x, i: rotate(x.expand(i + 1, 16), 10000.0)[i]  # noqa: E731  the vector at position i
    assert torch.isclose(at(q, 5) @ at(k, 2), at(q, 9) @ at(k, 6))  # q_i . k_j: a function of i - j
    assert not torch.isclose(at(q, 5) @ at(k, 2), at(q, 5) @ at(k, 3))


@pytest.mark.parametrize("positional", ["rope", "alibi"])
def test_positions_inside_the_heads_replace_the_input_s_and_value_residual_mixes_the_first_layer_s_values(positional):
    """rope and alibi add no position vector to the input, and the model's output moves with the words' order; with
    value_residual, every later layer's values are lambda_1 v_l + lambda_2 v_1, v_1 read at the first layer's
    hook_v."""
    from headlab.model.hooks import recorded

    torch.manual_seed(0)
    model = Encoder(20, 3, 6, "mean", d_model=16, n_layers=3, positional=positional,
                    attention=dict(n_heads=4, value_residual=True)).double().eval()  # fmt: skip
    assert model.pos_emb is None and model.blocks[0].attn.value_mix is None
    tokens = torch.tensor([[3, 4, 5, 6, 7, 8]])
    with torch.no_grad():
        assert not torch.allclose(model(tokens)[0], model(tokens[:, [1, 0, 2, 3, 4, 5]])[0])  # (bidirectional alibi
        # is blind to a reversal: |i - j| is the same read backwards)
        for block in model.blocks[1:]:
            block.attn.value_mix.copy_(torch.tensor([0.3, 1.7], dtype=torch.float64))
        with recorded(model, "hook_v") as own, recorded(model, "hook_z") as z:
            model(tokens, need_weights=True)
        weights = model(tokens, need_weights=True)[1]
    for layer in (1, 2):
        mixed = 0.3 * own[layer] + 1.7 * own[0]  # (1, H, n, d_v)
        torch.testing.assert_close(z[layer], weights[layer] @ mixed)


def test_softpick_weighs_every_key_zero_where_every_logit_is_below_zero_and_ssmax_keeps_a_peak_as_keys_grow():
    """Softpick's point: a row of logits all below 0 (and padded keys) has zero mass, exactly. Scalable softmax's:
    with one key at +3 and the rest at -2, softmax's peak fades as the keys grow; c log(n) keeps it near 1."""
    from headlab.model.normalizers import ScalableSoftmax, Softmax, Softpick

    scores = torch.tensor([[[[-0.5, -1.0, -2.0, 4.0]]]], dtype=torch.float64)  # (1, 1, 1, 4)
    padding = torch.tensor([[False, False, False, True]])
    assert (Softpick.weights(None, scores, padding) == 0).all()
    big = Softpick.weights(None, torch.full((1, 1, 1, 3), 300.0, dtype=torch.float64), None)  # no overflow
    torch.testing.assert_close(big, torch.full((1, 1, 1, 3), 1 / 3, dtype=torch.float64))
    attn = MultiHeadAttention(8, 1, normalizer="ssmax")
    peaks = {}
    for n in (16, 256, 4096):
        row = torch.full((1, 1, 1, n), -2.0)
        row[..., -1] = 3.0
        peaks[n] = (
            float(Softmax.weights(attn, row, None)[..., -1]),
            float(ScalableSoftmax.weights(attn, row, None)[..., -1]),
        )
    assert peaks[4096][0] < 0.05 < 0.99 < peaks[4096][1]  # softmax fades, ssmax (c = 1) holds


def test_a_gate_from_outside_says_its_width_and_the_memory_check_counts_it(monkeypatch):
    """A gate is one class: registered from outside headlab, its `width` reaches the memory estimate (what the
    memory check and pack sizing use) with no name tested anywhere; headlab's own gates say theirs."""
    from hydra import compose, initialize_config_module

    from headlab.config.memory import ConfigSizes, model_bytes
    from headlab.model import gates, rules

    class EveryChannelTwice(gates.Gate):
        @staticmethod
        def width(n_heads, d_v):
            return 2 * n_heads * d_v

    monkeypatch.setitem(rules._registered["gate"], "twice", EveryChannelTwice)  # rules.register, for this test only
    with initialize_config_module("headlab.conf", version_base="1.3"):
        configs = {
            g: compose("train", overrides=[f"model.attention.gate={g}"]) for g in ("none", "elementwise", "twice")
        }
    sizes = ConfigSizes(configs["none"].data)
    need = {g: model_bytes(cfg, sizes) for g, cfg in configs.items()}
    att = configs["none"].model.attention
    d_v = configs["none"].model.d_model // att.n_heads
    assert (gates.Gate.width(4, 16), gates.Headwise.width(4, 16), gates.Elementwise.width(4, 16)) == (0, 4, 64)
    assert need["twice"] - need["none"] == 2 * (need["elementwise"] - need["none"]) > 0  # linear in the width
    assert need["elementwise"] - need["none"] > 20 * configs["none"].model.d_model * att.n_heads * d_v  # its weights
