"""A stack of E models steps exactly as E models stepped alone: forward, AdamW, gradient clipping."""

import copy

import pytest
import torch
from torch import nn

from headlab.model import Encoder
from headlab.training import optim
from headlab.training.vectorized import PackedAdamW, Stacked, clip_per_member


def models(E: int, seed: int = 0, readout: str = "mean") -> list[Encoder]:
    out = []
    for e in range(E):
        torch.manual_seed(seed + e)
        out.append(Encoder(20, 5, 9, readout=readout, d_model=16, n_layers=2, dropout=0.0).double())
    return out


@pytest.mark.parametrize("readout", ["mean", "max"])
def test_the_stack_computes_what_each_model_computes_alone(readout):
    alone = models(3, readout=readout)
    stack = Stacked([copy.deepcopy(m) for m in alone]).double()
    tokens = torch.randint(1, 20, (3, 4, 9))
    mask = torch.zeros(3, 4, 9, dtype=torch.bool)
    mask[:, 1, 6:] = True
    out = stack(tokens, mask)  # (E, B, C)
    for e, model in enumerate(alone):
        torch.testing.assert_close(out[e], model(tokens[e], mask[e])[0], atol=1e-12, rtol=0)


def test_a_stack_in_eval_mode_drops_nothing_as_its_models_in_eval_mode():
    """Dropout 0.3 everywhere: model.eval() of the pack (validation, test) reaches the members' code, on the CPU
    path (one member after another) and under vmap (the GPU path); .train(), or setting .training on every
    submodule as Lightning's loops restore the mode after validation, turns dropout back on."""
    alone = []
    for e in range(2):
        torch.manual_seed(e)
        alone.append(
            Encoder(20, 5, 9, "cls", d_model=16, dropout=0.3, attention={"n_heads": 2, "dropout": 0.3}).double()
        )
    module = nn.ModuleDict({"stack": Stacked([copy.deepcopy(m) for m in alone]).double()})  # as the pack holds it
    stack = module["stack"]
    tokens = torch.randint(1, 20, (2, 4, 9))
    mask = torch.zeros(2, 4, 9, dtype=torch.bool)
    module.eval()
    expected = torch.stack([m.eval()(tokens[e], mask[e])[0] for e, m in enumerate(alone)])
    with torch.no_grad():
        torch.testing.assert_close(stack(tokens, mask), expected, atol=1e-12, rtol=0)
        torch.testing.assert_close(stack.batched(tokens, mask), expected, atol=1e-12, rtol=0)
        module.train()
        assert not torch.allclose(stack(tokens, mask), expected)
        module.eval()
        for submodule in module.modules():  # lightning.pytorch.utilities.model_helpers._ModuleMode.restore
            submodule.training = True
        assert not torch.allclose(stack(tokens, mask), expected)
        assert not torch.allclose(stack.batched(tokens, mask), expected)


@pytest.mark.parametrize("fused", [None, False])
def test_packed_adamw_with_clipping_follows_torch_adamw_member_by_member(fused):
    """Three members with their own lr, weight decay and betas, five steps with gradient clipping at 1.0 (which
    bites: the gradients are scaled up), against three torch.optim.AdamW of their own and clip_grad_norm_: on the
    CPU by default each member through the fused kernel, exactly as a single run (optim.adamw); the stacked update
    of other devices (fused=False) as torch's single-tensor AdamW, to rounding."""
    alone = models(3)
    stack = Stacked([copy.deepcopy(m) for m in alone]).double()
    hyper = [(1e-2, 0.1, (0.9, 0.98)), (3e-3, 0.0, (0.8, 0.999)), (1e-1, 0.01, (0.95, 0.9))]
    packed = PackedAdamW(
        [{"params": [stack.flat], "decay": stack.decay_mask}],
        lr=[h[0] for h in hyper],
        weight_decay=[h[1] for h in hyper],
        betas=[h[2] for h in hyper],
        fused=fused,
    )
    references = []
    for model, (lr, wd, betas) in zip(alone, hyper, strict=True):
        groups = [
            {"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": wd},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0},
        ]
        if fused is None:
            references.append(optim.adamw(groups, lr, betas, use_fused=True))
        else:
            references.append(torch.optim.AdamW(groups, lr=lr, betas=betas, foreach=False))
    for step in range(5):
        packed.scale = torch.tensor([1.0, 0.5, 0.25]) * (step + 1) / 5  # a schedule per member
        torch.manual_seed(100 + step)
        stack.flat.grad = torch.randn_like(stack.flat) * 3
        grads = {n: g.clone() for n, g in stack.views(stack.flat.grad).items()}
        clip_per_member([stack.flat], 1.0)
        packed.step()
        for e, (model, optimizer) in enumerate(zip(alone, references, strict=True)):
            for group in optimizer.param_groups:
                group["lr"] = hyper[e][0] * float(packed.scale[e])
            for name, p in model.named_parameters():
                p.grad = grads[name][e].clone()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
    stacked = stack.stacked()
    for e, model in enumerate(alone):
        for name, p in model.named_parameters():
            torch.testing.assert_close(stacked[name][e], p, atol=1e-13, rtol=1e-12, msg=name)  # clipping's rounding


def test_members_compute_as_pack_compute_says_and_a_pack_of_one_as_its_model_alone():
    """pack.compute: `auto` runs members one after another on a CPU (until a pack has timed both ways: pack.compute)
    and batches them on a GPU; `each` and `batched` on any device; a pack of one (every headlab-train run) runs its
    model as it is, with its fused kernels, whatever it says. The GPU's side is tests/model/test_gpu.py."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")  # a device named, not used: no GPU needed
    for compute in ("auto", "each", "batched"):
        one = Stacked(models(1), compute=compute)
        assert one.one_after_another(cpu) and one.one_after_another(cuda)
    auto, each, batched = (Stacked(models(2), compute=c) for c in ("auto", "each", "batched"))
    assert auto.one_after_another(cpu) and not auto.one_after_another(cuda)
    assert each.one_after_another(cpu) and each.one_after_another(cuda)
    assert not batched.one_after_another(cpu) and not batched.one_after_another(cuda)


def test_a_frozen_member_does_not_move_and_the_others_do():
    stack = Stacked(models(2)).double()
    params = list(stack.parameters())
    before = [p.detach().clone() for p in params]
    optimizer = PackedAdamW(
        [{"params": params, "decay": True}], lr=[0.1, 0.1], weight_decay=[0.1, 0.1], betas=[(0.9, 0.99)] * 2
    )
    optimizer.alive = torch.tensor([True, False])
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    assert all(torch.equal(p[1], b[1]) for p, b in zip(params, before, strict=True))
    assert all(not torch.equal(p[0], b[0]) for p, b in zip(params, before, strict=True))


def test_on_the_cpu_each_member_draws_its_dropout_from_its_own_stream_whatever_its_pack():
    """Dropout 0.3 in training mode: member e of a stack with streams computes what its model computes alone
    from that random state, two steps running, in a pack of 3 and as the only member of a pack of 1; the
    process's own random state is left as it was."""
    alone = []
    for e in range(3):
        torch.manual_seed(e)
        alone.append(
            Encoder(20, 5, 9, "cls", d_model=16, dropout=0.3, attention={"n_heads": 2, "dropout": 0.3}).double()
        )
    streams = [torch.Generator().manual_seed(100 + e).get_state() for e in range(3)]
    tokens = torch.randint(1, 20, (3, 4, 9)).expand(2, 3, 4, 9)  # (steps, E, B, n): the same batch twice
    mask = torch.zeros(3, 4, 9, dtype=torch.bool)
    expected = []  # (steps, E, B, C): each model alone, its stream in the process's place
    for e, model in enumerate(alone):
        torch.set_rng_state(streams[e])
        expected.append(torch.stack([model(tokens[step, e], mask[e])[0] for step in range(2)]))
    expected = torch.stack(expected, dim=1)
    pack = Stacked([copy.deepcopy(m) for m in alone], streams).double()
    single = Stacked([copy.deepcopy(alone[2])], streams[2:]).double()
    torch.manual_seed(7)
    outer = torch.get_rng_state()
    for step in range(2):
        torch.testing.assert_close(pack(tokens[step], mask), expected[step], atol=1e-12, rtol=0)
        torch.testing.assert_close(single(tokens[step, 2:], mask[2:])[0], expected[step, 2], atol=1e-12, rtol=0)
    assert torch.equal(torch.get_rng_state(), outer)
    assert not torch.allclose(expected[0], expected[1])  # each stream goes on: new masks at the next step


def test_on_the_cpu_each_member_of_a_pack_runs_on_its_own_batchs_positions():
    """Members' batches of different lengths (bucketed text), padded to the longest of them: the pack computes
    what each model computes on its own batch (its single run's shapes), for sequence and token outputs."""
    from headlab.training.pack.module import PackedModule

    for readout in ("mean", "max", "token"):
        alone = []
        for e in range(3):
            torch.manual_seed(e)
            alone.append(Encoder(20, 5, 12, readout=readout, d_model=16, n_layers=2, dropout=0.0).double())
        pack = PackedModule([copy.deepcopy(m) for m in alone], [{}] * 3).double()
        lengths = [3, 12, 7]  # each member's longest example; the batch is padded to 12
        tokens = torch.randint(1, 20, (3, 4, 12))
        padding = (torch.arange(12) >= torch.tensor(lengths).view(3, 1, 1)).expand(3, 4, 12).clone()  # (E, B, n)
        padding[:, 1, 2:] = True  # a shorter example in every batch
        tokens[padding] = 0
        out = pack({"tokens": tokens, "padding_mask": padding})
        for e, (model, n) in enumerate(zip(alone, lengths, strict=True)):
            own = model(tokens[e, :, :n], padding[e, :, :n])[0]  # (B, C) or (B, n, C)
            torch.testing.assert_close(out[e, :, :n] if readout == "token" else out[e], own, atol=1e-12, rtol=0)
            assert readout != "token" or not out[e, :, n:].any()  # padded positions: no logits (labels ignore them)


@pytest.mark.parametrize(
    "design",
    [
        {"gate": "elementwise", "talking_heads": "both", "normalizer": "sink", "qk_norm": True, "latent_kv": 6},
        {"differential": True, "gate": "headwise", "n_kv_heads": 1},
        {"normalizer": "sigmoid", "talking_heads": "pre"},
        {"normalizer": "softmax1", "scoring": "additive"},
        {"mta": {"query_kernel": 3, "key_kernel": 5, "head_group": 2, "group_norm": True}},  # a CPU's own layout
    ],
)
def test_the_head_designs_stack_on_both_paths_as_each_model_alone(design):
    """The CPU path (one member after another) and the batched one of a GPU (torch.func.vmap) on every design."""
    alone = []
    for e in range(2):
        torch.manual_seed(e)
        alone.append(Encoder(20, 5, 9, "mean", d_model=16, n_layers=2, attention={"n_heads": 2, **design}).double())
    stack = Stacked([copy.deepcopy(m) for m in alone]).double()
    tokens = torch.randint(1, 20, (2, 4, 9))
    mask = torch.zeros(2, 4, 9, dtype=torch.bool)
    mask[:, 1, 6:] = True
    expected = torch.stack([m(tokens[e], mask[e])[0] for e, m in enumerate(alone)])
    torch.testing.assert_close(stack(tokens, mask), expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(stack.batched(tokens, mask), expected, atol=1e-12, rtol=0)


def test_the_load_balance_loss_stacks_on_both_paths_as_each_model_alone():
    """Mixture of heads' weighted load-balance loss comes out of a stack beside the logits (need_balance), member by
    member as each model alone returns it, one after another and under vmap (the GPU path)."""
    alone = []
    for e in range(2):
        torch.manual_seed(e)
        design = {"n_heads": 4, "moh": {"k": 1, "shared": 1, "balance": 0.5}}
        alone.append(Encoder(20, 5, 9, "mean", d_model=16, n_layers=2, attention=design).double().train())
    stack = Stacked([copy.deepcopy(m) for m in alone]).double().train()
    tokens = torch.randint(1, 20, (2, 4, 9))
    mask = torch.zeros(2, 4, 9, dtype=torch.bool)
    mask[:, 1, 6:] = True
    own = [m(tokens[e], mask[e], need_balance=True) for e, m in enumerate(alone)]
    logits, balance = torch.stack([o[0] for o in own]), torch.stack([o[2] for o in own])
    assert balance.min() > 0 and balance[0] != balance[1]  # each member's own routers
    for path in (stack, stack.batched):
        got_logits, got_balance = path(tokens, mask, need_balance=True)
        torch.testing.assert_close(got_logits, logits, atol=1e-12, rtol=0)
        torch.testing.assert_close(got_balance, balance, atol=1e-12, rtol=0)


def test_a_compiled_stack_computes_and_differentiates_as_each_model_alone_from_one_graph():
    """model.compile in a pack: the members' forward through torch.compile, one graph for every member (each its
    own tensors, on views of the one flat parameter), and the batched computation compiled; values and gradients
    those of each model alone, also when the models were compiled in place first (as build() compiles them)."""
    torch._dynamo.reset()
    alone = []
    for e in range(2):  # one layer: each compilation takes seconds per layer
        torch.manual_seed(e)
        alone.append(Encoder(20, 5, 9, readout="mean", d_model=16, n_layers=1, dropout=0.0).double())
    compiled_models = [copy.deepcopy(m) for m in alone]
    for m in compiled_models:
        m.compile()  # in place, as a run's build does: the stack must compute from its own tensors all the same
    stack = Stacked(compiled_models, compile=True).double()
    tokens = torch.randint(1, 20, (2, 4, 9))
    mask = torch.zeros(2, 4, 9, dtype=torch.bool)
    mask[:, 1, 6:] = True
    expected = [m(tokens[e], mask[e])[0] for e, m in enumerate(alone)]
    torch.testing.assert_close(stack(tokens, mask), torch.stack(expected), atol=1e-10, rtol=0)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # one graph serves both members
    stack(tokens, mask).sum().backward()
    sum(x.sum() for x in expected).backward()
    for e, model in enumerate(alone):
        grads = {n: p.grad for n, p in model.named_parameters()}
        got = dict(zip(stack.names, [g[e] for g in stack.views(stack.flat.grad).values()], strict=True))
        for name, grad in grads.items():
            torch.testing.assert_close(got[name], grad, atol=1e-10, rtol=0, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(stack.batched(tokens, mask), torch.stack(expected), atol=1e-10, rtol=0)
