"""What a head does, causally (headlab.heads.causal): a model whose weights are set by hand so that head 0 copies
key a's value and head 1 key b's is read correctly by patching, ablation and roles; mean- and resample-ablation
equal a hand computation; a run records all of it in heads.json."""

import csv
import json
import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from conftest import TINY, cli_here, train_here
from design_models import IDS, perturbed_model
from headlab.data.recall import AssociativeRecall
from headlab.heads import causal
from headlab.heads.importance import _per_example_loss
from headlab.heads.statistics import head_report, role_shares
from headlab.model import MultiHeadAttention

K, V, P, Q = 8, 4, 4, 3  # keys, values, context pairs, queries
TASK = AssociativeRecall(n_keys=K, n_values=V, n_pairs=P, n_queries=Q, lookups=2, fused=True)
HK, QA, QB, HV = 0, K, 2 * K, 3 * K  # feature blocks: held key, query's key a, query's key b, held value
D = 3 * K + V


class HandSet(nn.Module):
    """One attention layer of 4 heads: head 0's query is the key a a query names, its key the key a context
    position holds (x 20: one position wins), its value that position's value; head 1 the same for key b; heads 2
    and 3 attend uniformly and reach no output. The readout turns the two fetched values into value(a) - value(b):
    score(c) = -c'^2 + 2 c' (v_a - v_b), c' = c - (V - 1), is largest at c' = v_a - v_b."""

    n_layers, n_heads = 1, 4

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Module()])
        attn = self.blocks[0].attn = MultiHeadAttention(D, 4, d_k=K, d_v=V, scale=False).double()
        with torch.no_grad():
            for p in attn.parameters():
                p.zero_()
            eye_k, eye_v = torch.eye(K, dtype=torch.float64), torch.eye(V, dtype=torch.float64)
            attn.q_proj.weight[0:K, QA : QA + K] = 20 * eye_k
            attn.q_proj.weight[K : 2 * K, QB : QB + K] = 20 * eye_k
            for h in range(4):
                attn.k_proj.weight[h * K : (h + 1) * K, HK : HK + K] = eye_k
                attn.v_proj.weight[h * V : (h + 1) * V, HV : HV + V] = eye_v
            attn.out_proj.weight[0:V, 0:V] = eye_v  # head 0's output into channels 0..V-1
            attn.out_proj.weight[V : 2 * V, V : 2 * V] = eye_v  # head 1's into V..2V-1
        c = torch.arange(2 * V - 1, dtype=torch.float64) - (V - 1)  # c'
        values = torch.arange(V, dtype=torch.float64)
        self.register_buffer("readout", 2 * torch.cat([values[:, None] * c, -values[:, None] * c]))  # (2V, C)
        self.register_buffer("bias", -(c**2))

    def forward(self, tokens, padding_mask=None, need_weights=False, head_mask=None, copies=1, copied_at=0):
        # copies: the Encoder's (the batch's copies part at the attention's output, its only layer)
        out, weights = self.blocks[0].attn(features(tokens), padding_mask, need_weights, head_mask)
        return 2 * (out[..., : 2 * V] @ self.readout + self.bias), [weights]


def features(tokens: torch.Tensor) -> torch.Tensor:
    """(B, n, 2) token ids -> (B, n, D): a context position's key and value, a query's keys a and b, one-hot."""
    B, n, _ = tokens.shape
    x = torch.zeros(B, n, D, dtype=torch.float64)
    rows = torch.arange(B)[:, None]
    context, queries = torch.arange(P), torch.arange(P, n)
    x[rows, context, HK + tokens[:, :P, 0] - 1] = 1
    x[rows, context, HV + tokens[:, :P, 1] - 1 - K] = 1
    x[rows, queries, QA + tokens[:, P:, 0] - 1] = 1
    x[rows, queries, QB + tokens[:, P:, 1] - 1 - K - V] = 1
    return x


def batch(seed: int, n: int = 64) -> dict:
    tokens, labels = (np.stack(x) for x in zip(*TASK.sample(np.random.default_rng(seed), n), strict=True))
    tokens = torch.as_tensor(tokens)
    return {
        "tokens": tokens,
        "labels": torch.as_tensor(labels),
        "padding_mask": torch.zeros(tokens.shape[:2], dtype=bool),
    }


def test_the_hand_set_model_solves_the_task():
    b = batch(0)
    logits, _ = HandSet()(b["tokens"])
    scored = b["labels"] >= 0
    assert (logits.argmax(-1)[scored] == b["labels"][scored]).all()


@pytest.mark.parametrize(("role", "head"), [("key a", 0), ("key b", 1)])
def test_patching_finds_the_head_that_carries_each_corrupted_key(role, head):
    model, clean = HandSet(), batch(1)
    tokens, labels, position = TASK.corrupt(np.random.default_rng(2), clean["tokens"].numpy(), role)
    broken = {**clean, "tokens": torch.as_tensor(tokens), "labels": torch.as_tensor(labels)}
    shares = causal.patching_shares(model, clean, broken, torch.as_tensor(position))  # (1, 4)
    expected = torch.zeros(1, 4, dtype=torch.float64)
    expected[0, head] = 1.0
    torch.testing.assert_close(shares, expected, atol=1e-6, rtol=0)


def test_ablating_a_fetching_head_costs_and_an_idle_one_costs_nothing():
    model = HandSet()
    effects = causal.ablation_effects(model, [batch(3)], [batch(4)])
    for kind in causal.KINDS:
        loss, acc = effects[kind]["loss"][0], effects[kind]["acc"][0]
        assert (loss[:2] > 0.5).all() and (acc[:2] < -0.3).all(), kind  # heads 0, 1 carry the answer
        assert loss[2:].abs().max() == 0 and acc[2:].abs().max() == 0, kind  # heads 2, 3 reach nothing


def head_output(x: torch.Tensor, attn, h: int) -> torch.Tensor:
    """Head h's output computed by hand, (B, n, d_v): softmax(x Wq (x Wk)^T) x Wv."""
    rows = slice(h * attn.d_k, (h + 1) * attn.d_k)
    q = x @ attn.q_proj.weight[rows].T + attn.q_proj.bias[rows]
    k = x @ attn.k_proj.weight[rows].T + attn.k_proj.bias[rows]
    v_rows = slice(h * attn.d_v, (h + 1) * attn.d_v)
    v = x @ attn.v_proj.weight[v_rows].T + attn.v_proj.bias[v_rows]
    return torch.softmax(q @ k.transpose(1, 2) * attn.scale, -1) @ v


@pytest.mark.parametrize("kind", ["mean", "resample"])
def test_mean_and_resample_ablation_equal_a_hand_computation(kind):
    torch.manual_seed(0)
    model = HandSet()
    attn = model.blocks[0].attn
    with torch.no_grad():  # every weight moved: the heads' outputs all reach the readout
        for p in attn.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    measured, reference = batch(5, 16), batch(6, 24)
    effects = causal.ablation_effects(model, [measured], [reference])
    x, x_ref = features(measured["tokens"]), features(reference["tokens"])
    heads = [head_output(x, attn, h) for h in range(4)]  # (B, n, d_v) each

    def loss(outputs):
        out = torch.cat(outputs, -1) @ attn.out_proj.weight.T + attn.out_proj.bias
        logits = 2 * (out[..., : 2 * V] @ model.readout + model.bias)
        return float(_per_example_loss(logits, measured["labels"]).mean())

    base = loss(heads)
    for h in range(4):
        if kind == "mean":  # its mean at each position over the reference examples
            replacement = head_output(x_ref, attn, h).mean(0, keepdim=True).expand_as(heads[h])
        else:  # the next example's output
            replacement = torch.cat([heads[h][1:], heads[h][:1]])
        edited = [replacement if g == h else heads[g] for g in range(4)]
        assert effects[kind]["loss"][0, h].item() == pytest.approx(loss(edited) - base, rel=1e-9, abs=1e-12)


def test_roles_read_which_head_fetches_which_key():
    model, b = HandSet(), batch(7)
    with torch.no_grad():
        _, weights = model(b["tokens"], need_weights=True)
    names, by_position = TASK.attention_roles(b["tokens"].numpy())
    share = role_shares(weights, torch.as_tensor(by_position), b["labels"] >= 0, len(names))[0]  # (H, R)
    rows = head_report(weights)["rows"]
    restored = {}
    for role in TASK.corruptions:
        tokens, labels, position = TASK.corrupt(np.random.default_rng(8), b["tokens"].numpy(), role)
        broken = {**b, "tokens": torch.as_tensor(tokens), "labels": torch.as_tensor(labels)}
        restored[role] = causal.patching_shares(model, b, broken, torch.as_tensor(position))[0]
    roles = [
        causal.head_role(
            {r: float(share[h, names.index(r)]) for r in TASK.corruptions},
            {r: float(restored[r][h]) for r in TASK.corruptions},
            rows[h],
        )
        for h in range(4)
    ]
    assert roles == ["key a", "key b", "broad", "broad"]


@pytest.mark.parametrize(
    "a, b",
    [
        ([[0.3, 0.1, 0.9, 0.5]], [[2.0, 2.0, 7.0, 1.0]]),  # ties in one
        ([[1.0, 1.0, 1.0, 2.0], [3.0, 3.0, 0.5, 0.5]], [[4.0, 4.0, 0.0, 9.0], [9.0, 1.0, 1.0, 1.0]]),  # in both, 2-d
        ([[0.1, 0.2, 0.3, 0.4, 0.5]], [[5.0, 4.0, 3.0, 2.0, 1.0]]),  # reversed: -1
        ([[-3.0, 8.0, 0.0, 2.5, 1e-9, 7.0]], [[0.2, 0.1, 0.4, 0.3, 0.6, 0.5]]),  # no ties
    ],
)
def test_rank_agreement_is_spearmans_rho(a, b):
    a, b = torch.tensor(a), torch.tensor(b)
    assert causal.rank_agreement(a, b) == pytest.approx(stats.spearmanr(a.flatten(), b.flatten()).statistic)


def test_rank_agreement_of_a_constant_score_is_nan():
    assert math.isnan(causal.rank_agreement(torch.tensor([[0.3, 0.1, 0.9, 0.5]]), torch.ones(1, 4)))
    assert math.isnan(causal.rank_agreement(torch.full((2, 2), 0.5), torch.tensor([[1.0, 2.0], [3.0, 4.0]])))
    assert math.isnan(causal.rank_agreement(torch.tensor([0.3]), torch.tensor([2.0])))  # one head: no ranking


@pytest.mark.e2e
def test_a_run_records_ablations_patching_roles_and_group_ablations(tmp_path):
    shipped = "callbacks.attention.causal_batches=4"  # its default: every validation batch of the two (TINY's: one)
    done = train_here(*TINY, shipped, "logger=csv", "model.attention.n_kv_heads=2", "hydra.run.dir=run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    heads = json.loads((tmp_path / "run" / "heads.json").read_text())
    row = heads["rows"][0]
    for kind in causal.KINDS:
        assert isinstance(row[f"ablate_{kind}_loss"], float) and isinstance(row[f"ablate_{kind}_acc"], float)
    assert {"restore_key_a", "restore_key_b", "role"} <= row.keys() and heads["corruptions"] == ["key a", "key b"]
    assert set(heads["ablation_agreement"]) == set(causal.KINDS)
    assert len(heads["group_ablation"]["mean"]["loss"][0]) == 2  # (L, G): two key/value groups
    assert heads["causal_examples"] == 64
    metrics = (tmp_path / "run" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"heads/L0/H1/ablate_resample_loss", "heads/L0/H3/restore_key_b"} <= set(metrics)  # every logger has them

    drawn = cli_here("heads", "run", cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr[-2000:]
    assert (tmp_path / "run" / "heads" / "ablation.png").is_file() and (
        tmp_path / "run" / "heads" / "patching.png"
    ).is_file()
    table = list(csv.DictReader((tmp_path / "run" / "heads" / "statistics.csv").open()))
    assert [r["role"] for r in table] == [r["role"] for r in heads["rows"]]
    received_heads_json_is_read_as_data(tmp_path / "run", heads)


def received_heads_json_is_read_as_data(run, heads: dict) -> None:
    """A received run's heads.json: a role that is a formula or Rich markup is text in statistics.csv and on the
    terminal; a row missing or out of range, a text importance, a row that is no object: one line, the rest drawn."""
    hostile = json.loads(json.dumps(heads))
    hostile["rows"][0]["role"] = '=HYPERLINK("http://x","y")'
    hostile["rows"][1]["role"] = "[bold red]forged[/] \x1b[2J"
    (run / "heads.json").write_text(json.dumps(hostile))
    drawn = cli_here("heads", str(run), cwd=run.parent)
    assert drawn.returncode == 0, drawn.stderr[-2000:]
    table = list(csv.DictReader((run / "heads" / "statistics.csv").open()))
    assert table[0]["role"] == '\'=HYPERLINK("http://x","y")' and "\x1b" not in drawn.stdout
    assert "| [bold red]forged[/] \\x1b[2J |" in drawn.stdout  # shown as written: no markup, no escape sequence
    broken = {
        "a row missing": lambda rows: rows.pop(),
        "a head out of range": lambda rows: rows[0].update(head=99),
        "a text importance": lambda rows: rows[0].update(importance="high"),
        "a row that is no object": lambda rows: rows.__setitem__(0, [0, 0]),
    }
    said = {
        "a row missing": "1 of the model's 4 heads have no row",
        "a head out of range": "row 0 names no head of this model (layer 0, head 99)",
        "a text importance": "row 0's importance is 'high', not a number",
        "a row that is no object": "row 0 is not an object",
    }
    for case, breaking in broken.items():
        bad = json.loads(json.dumps(heads))
        breaking(bad["rows"])
        (run / "heads.json").write_text(json.dumps(bad))
        drawn = cli_here("heads", str(run), cwd=run.parent)
        assert drawn.returncode == 0 and "Traceback" not in drawn.stderr, (case, drawn.stderr[-2000:])
        assert f"headlab-heads: {run / 'heads.json'}: {said[case]}: its importance is left out" in drawn.stderr, case
        assert "importance" not in next(csv.DictReader((run / "heads" / "statistics.csv").open()))


def test_roles_across_seeds_count_the_runs_with_each_role_apart_for_solved_and_unsolved(tmp_path):
    """One head, 5 seeds: the 2 that solved have a head fetching both keys, the 3 that did not a broad one; four
    heads, 5 seeds, each with a key-a and a key-b head. Exact intervals as scipy's."""
    from headlab.cli.compare import main

    arms = {
        1: [["both"], ["both"], ["broad"], ["broad"], ["positional"]],
        4: [["key a", "key b", "broad", "other"]] * 5,
    }
    for heads, roles in arms.items():
        for seed, run_roles in enumerate(roles):
            run = tmp_path / f"h{heads}-{seed}"
            run.mkdir()
            solved = heads == 4 or seed < 2
            record = {
                "status": "completed",
                "metrics": {"test/acc": 1.0 if solved else 0.1, "val/acc_best": 1.0 if solved else 0.1},
                "config": {"model.attention.n_heads": heads, "seed": seed},
            }
            (run / "results.json").write_text(json.dumps(record))
            rows = [{"layer": 0, "head": h, "entropy": 1.0, "role": r} for h, r in enumerate(run_roles)]
            (run / "heads.json").write_text(json.dumps({"rows": rows}))
    main([str(tmp_path), "--roles", "--solved", "test/acc>=0.9", "--metric", "test/acc", "--no-plots"])
    table = (tmp_path / "compare.md").read_text()
    interval = stats.binomtest(2, 2).proportion_ci(0.95, method="exact")
    assert f"| model.attention.n_heads=1 (solved) | 2 | - | - | 2/2 [{interval.low:.2f}, 1.00] (1.0) | 0/2 " in table
    assert "| model.attention.n_heads=1 (not solved) | 3 | - | - | 0/3 [0.00, 0.71] (0.0) | 2/3 " in table
    assert "| model.attention.n_heads=4 (solved) | 5 | 5/5 [0.48, 1.00] (1.0) | 5/5 [0.48, 1.00] (1.0) | - |" in table
    assert "| group | runs | key a | key b | both | broad | positional | other |" in table


@pytest.mark.parametrize("bad", [["a", "list"], {"a": "dict"}, 3, None])
def test_roles_from_received_runs_are_text_in_the_table_and_a_role_that_is_no_name_leaves_its_run_out(tmp_path, bad):
    """A role with HTML, a cell separator and a heading stays one cell of text; a run whose role is a list, a dict,
    a number or null is left out with its reason, and the others are compared."""
    from headlab.cli.compare import main

    hostile = "<img src=x onerror=alert(1)>|x\n## injected"
    for seed, role in enumerate([hostile, hostile, bad]):
        run = tmp_path / f"run{seed}"
        run.mkdir()
        record = {"status": "completed", "metrics": {"test/acc": 0.9, "val/acc_best": 0.9},
                  "config": {"model.attention.n_heads": 1, "seed": seed}}  # fmt: skip
        (run / "results.json").write_text(json.dumps(record))
        (run / "heads.json").write_text(json.dumps({"rows": [{"layer": 0, "head": 0, "entropy": 1.0, "role": role}]}))
    main([str(tmp_path), "--roles", "--metric", "test/acc", "--no-plots"])
    table = (tmp_path / "compare.md").read_text()
    assert "| group | runs | &lt;img src=x onerror=alert(1)&gt;\\|x ## injected |" in table
    assert "<img" not in table and "\n## injected" not in table
    assert "| all runs | 2 | 2/2 " in table or "| model.attention.n_heads=1 | 2 | 2/2 " in table
    assert f"{tmp_path / 'run2'}/heads.json: not a head analysis" in table


def test_patching_by_position_finds_the_query_the_answer_is_read_at():
    """Key a's value changed for the query at position P + 1 of every example (by hand): head 0's clean output
    restores all of the difference there at that position, and none at any other."""
    model, clean = HandSet(), batch(9, 32)
    tokens = clean["tokens"].clone()
    rows = torch.arange(32)
    where = (tokens[:, :P, 0] == tokens[:, P + 1, 0][:, None]).int().argmax(1)  # the position holding its key a
    tokens[rows, where, 1] = 1 + K + (tokens[rows, where, 1] - 1 - K + 1) % V  # the next value
    broken = {**clean, "tokens": tokens, "labels": torch.as_tensor(TASK.labels(tokens.numpy()))}
    shares = causal.patching_shares(model, clean, broken, torch.full((32,), P + 1), by_position=True)  # (1, 4, n)
    expected = torch.zeros(1, 4, P + Q, dtype=torch.float64)
    expected[0, 0, P + 1] = 1.0
    torch.testing.assert_close(shares, expected, atol=1e-6, rtol=0)


def test_ablations_of_a_cls_model_on_padded_batches_of_different_lengths():
    """Sequence classification with the cls vector first (the attention sees n + 1 positions) on batches of two
    lengths: zero-ablation is masking the head, measured as importance.accuracies measures it."""
    from headlab.heads.importance import accuracies
    from headlab.model import Encoder

    torch.manual_seed(0)
    model = Encoder(12, 3, 9, "cls", d_model=16, attention={"n_heads": 4}).eval()
    batches = []
    for n, lengths in ((9, [9, 4, 6]), (6, [6, 2, 5])):
        tokens = torch.randint(1, 12, (3, n))
        padding = torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]
        batches.append(
            {"tokens": tokens.masked_fill(padding, 0), "padding_mask": padding, "labels": torch.tensor([0, 1, 2])}
        )
    effects = causal.ablation_effects(model, batches, batches)
    masks = [torch.ones(1, 4).index_fill_(1, torch.tensor([h]), 0.0) for h in range(4)]
    base = accuracies(model, batches, [None])[0]
    expected = [a - base for a in accuracies(model, batches, masks)]
    assert effects["zero"]["acc"][0].tolist() == pytest.approx(expected)
    assert all(torch.isfinite(e[m]).all() for e in effects.values() for m in e)


@pytest.mark.parametrize("design", IDS)
def test_a_pass_resumed_at_a_heads_output_is_the_whole_pass_with_that_output_replaced(design):
    """causal.resumed (ablations and patching skip the edited layer's projections and maps) against
    causal.replaced (the whole pass, the hook editing): the same logits, bit for bit, for every design, at every
    layer of three (the value residual's first values included), on a padded batch with a cls vector."""
    model, batch = perturbed_model(design)
    with torch.no_grad():
        _, passed = causal.passing(model, batch, ("hook_z", "hook_v"))
        for layer in range(3):

            def edit(z, layer=layer):
                z = z.clone()
                z[:, 0] = z[:, -1].roll(1, dims=0) + layer
                return z

            with causal.replaced(model, layer, "hook_z", edit):
                whole, _ = model(batch["tokens"], batch["padding_mask"])
            with causal.resumed(model, layer, passed, edit):
                resumed, _ = model(batch["tokens"], batch["padding_mask"])
            assert torch.equal(resumed, whole), (design, layer)
            assert not torch.equal(whole, model(batch["tokens"], batch["padding_mask"])[0])  # the edit reached them


@pytest.mark.parametrize("design", IDS)
def test_edits_on_copies_of_a_batch_are_each_edits_own_whole_pass(design):
    """causal.edited_logits (a layer's ablations and patches on copies of the batch, up to MASKS_PER_FORWARD a pass,
    resumed at the layer) against each edit alone through a hook on the whole pass (causal.replaced), at every layer
    of three, for every design: more edits than one pass takes (two passes, the second part-filled)."""
    from headlab.heads.importance import MASKS_PER_FORWARD

    model, batch = perturbed_model(design, torch.float64)
    H = model.blocks[0].attn.n_heads
    edits = [  # zero, shift or swap one head's output: MASKS_PER_FORWARD + 3 edits
        lambda z, h=i % H, k=i: z.index_fill(1, torch.tensor([h]), 0.0) if k % 3 == 0 else z.roll(k, dims=0)
        for i in range(MASKS_PER_FORWARD + 3)
    ]
    with torch.no_grad():
        _, passed = causal.passing(model, batch, ("hook_z", "hook_v"))
        for layer in range(3):
            together = causal.edited_logits(model, layer, batch, edits, passed)
            assert len(together) == len(edits)
            for k, edit in enumerate(edits):
                with causal.replaced(model, layer, "hook_z", edit):
                    alone, _ = model(batch["tokens"], batch["padding_mask"])
                torch.testing.assert_close(together[k], alone, rtol=0, atol=1e-12, msg=f"{design} {layer} {k}")
