"""Steps beyond plain cross-entropy through a real Trainer, each update computed here independently: sharpness-aware
minimisation (optim.sam_rho), R-Drop (optim.rdrop), and mixture of heads' load-balance loss (moh.balance)."""

import copy

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from headlab.model import Encoder
from headlab.training.module import HeadLabModule
from headlab.training.objective import disagreement

RHO, ALPHA, LR, CLIP, SEED = 0.5, 2.0, 1e-2, 1.0, 7


def batch() -> dict:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 20, (8, 6), generator=g)
    padding = torch.zeros(8, 6, dtype=torch.bool)
    padding[::2, 4:] = True
    return {"tokens": tokens, "padding_mask": padding, "labels": torch.randint(0, 3, (8,), generator=g)}


class OneBatch(pl.LightningDataModule):
    batch_size = 8

    def train_dataloader(self):
        return DataLoader([batch()], batch_size=None)


class SeedEachBatch(pl.Callback):
    """Each step's dropout masks drawn from a known state, so that the test can draw the same ones."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        torch.manual_seed(SEED)


def trained(model: Encoder, **options) -> HeadLabModule:
    """One optimiser step of HeadLabModule in a Trainer, float64 (warm-up of one step: the full learning rate)."""
    module = HeadLabModule(copy.deepcopy(model), 3, lr=LR, weight_decay=0.1, **options)
    trainer = pl.Trainer(
        max_steps=1,
        precision="64-true",
        gradient_clip_val=CLIP,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[SeedEachBatch()],
    )
    trainer.fit(module, datamodule=OneBatch())
    return module


def adamw_step(model: Encoder) -> None:
    """What HeadLabModule's optimiser does with the gradients in model: clip, then AdamW (matrices decay)."""
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1}]
    groups.append({"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0})
    torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.98)).step()


def largest_difference(a: Encoder, b: Encoder) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a.parameters(), b.parameters(), strict=True))


def loss_gradients(model: Encoder) -> list[torch.Tensor]:
    model.zero_grad()
    b = batch()
    logits, _ = model(b["tokens"], b["padding_mask"])
    F.cross_entropy(logits, b["labels"]).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_a_sharpness_aware_step_is_adamw_from_w_with_the_gradient_at_the_ascended_point():
    torch.manual_seed(0)
    model = Encoder(20, 3, max_len=8, readout="mean", d_model=8, dropout=0.0, attention={"n_heads": 2}).double()

    # SAM by hand: g at w, e = rho g / ||g||, the gradient at w + e, clipped, AdamW's step from w
    expected = copy.deepcopy(model)
    g = loss_gradients(expected)
    norm = torch.linalg.vector_norm(torch.stack([x.norm() for x in g]))
    with torch.no_grad():
        for p, x in zip(expected.parameters(), g, strict=True):
            p.add_(RHO * x / norm)
    at_ascent = loss_gradients(expected)
    with torch.no_grad():
        for p, x in zip(expected.parameters(), g, strict=True):
            p.sub_(RHO * x / norm)
        for p, x in zip(expected.parameters(), at_ascent, strict=True):
            p.grad = x
    adamw_step(expected)

    sam, plain = trained(model, sam_rho=RHO).model, trained(model).model
    assert largest_difference(sam, expected) < 1e-12
    assert largest_difference(sam, plain) > 1e-4  # the ascent changed the step: the comparison above can fail


def test_a_sharpness_aware_step_logs_the_loss_at_w_not_at_the_ascended_point():
    torch.manual_seed(0)
    model = Encoder(20, 3, max_len=8, readout="mean", d_model=8, dropout=0.0, attention={"n_heads": 2}).double()
    b = batch()
    with torch.no_grad():
        at_w = F.cross_entropy(model(b["tokens"], b["padding_mask"])[0], b["labels"]).item()
    module = trained(model, sam_rho=RHO)
    assert module.trainer.callback_metrics["train/loss_epoch"].item() == pytest.approx(at_w, abs=1e-12)
    assert module.ascended is False


def test_an_rdrop_step_is_adamw_on_two_passes_cross_entropy_plus_their_symmetric_kl():
    torch.manual_seed(0)
    model = Encoder(20, 3, max_len=8, readout="mean", d_model=8, dropout=0.3, attention={"n_heads": 2}).double()

    # R-Drop by hand: two passes under different dropout masks, the mean cross-entropy plus ALPHA times the mean
    # of KL(p1 || p2) and KL(p2 || p1) per example (torch's kl_div), then the optimiser's step
    expected, b = copy.deepcopy(model).train(), batch()
    torch.manual_seed(SEED)
    first, second = (expected(b["tokens"], b["padding_mask"])[0] for _ in range(2))
    log_p, log_q = first.log_softmax(-1), second.log_softmax(-1)
    kl = F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")  # KL(p || q)
    kl = (kl + F.kl_div(log_p, log_q, log_target=True, reduction="batchmean")) / 2
    cross_entropy = (F.cross_entropy(first, b["labels"]) + F.cross_entropy(second, b["labels"])) / 2
    (cross_entropy + ALPHA * kl).backward()
    adamw_step(expected)

    rdrop, plain = trained(model, rdrop=ALPHA), trained(model).model
    assert largest_difference(rdrop.model, expected) < 1e-12
    assert largest_difference(rdrop.model, plain) > 1e-4  # the second pass and the KL term changed the step
    # the logged loss is the two passes' cross-entropy, comparable with a plain run's
    assert rdrop.trainer.callback_metrics["train/loss_epoch"].item() == pytest.approx(cross_entropy.item(), abs=1e-12)


def test_disagreement_averages_the_symmetric_kl_over_scored_positions_only():
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(2, 5, 4, generator=g, dtype=torch.float64) for _ in range(2))  # (E, N, C)
    scored = torch.tensor([[True, True, False, True, False], [False] * 5])

    def symmetric_kl(x, y):  # one position's (KL(p_x || p_y) + KL(p_y || p_x)) / 2
        p, q = x.softmax(-1), y.softmax(-1)
        return ((p * (p / q).log()).sum() + (q * (q / p).log()).sum()).item() / 2

    member_0 = sum(symmetric_kl(a[0, i], b[0, i]) for i in (0, 1, 3)) / 3
    assert disagreement(a, b, scored).tolist() == pytest.approx([member_0, 0.0], abs=1e-12)  # nothing scored: 0
    assert disagreement(a, a, scored.logical_not()).abs().max().item() < 1e-12  # one prediction agrees with itself


def naive_load_balance(model: Encoder, b: dict) -> torch.Tensor:
    """Jin et al. 2024, written per position: each layer's L_b = sum over routed heads i of f_i P_i, f_i the share
    of real positions whose k largest routing logits include i, P_i the mean of softmax(W_r x)_i over them; beta
    times the layers' sum. x: what each layer's attention reads, caught by a hook."""
    inputs = []
    hooks = [block.attn.register_forward_pre_hook(lambda m, a: inputs.append(a[0])) for block in model.blocks]
    model(b["tokens"], b["padding_mask"])
    for hook in hooks:
        hook.remove()
    total = 0
    for block, x in zip(model.blocks, inputs, strict=True):
        attn, real = block.attn, [(e, i) for e in range(x.shape[0]) for i in range(x.shape[1])]
        real = [(e, i) for e, i in real if not b["padding_mask"][e, i]]
        R = attn.route_routed.weight.shape[0]
        share, probability = [0.0] * R, [0.0] * R
        for e, i in real:
            logits = attn.route_routed.weight @ x[e, i]
            chosen = sorted(range(R), key=lambda h: -float(logits[h].detach()))[: attn.moh_k]
            for h in range(R):
                share[h] += (h in chosen) / len(real)
                probability[h] = probability[h] + torch.softmax(logits, 0)[h] / len(real)
        total = total + attn.moh_balance * sum(f * p for f, p in zip(share, probability, strict=True))
    return total


def test_a_mixture_of_heads_step_adds_the_papers_load_balance_loss_to_the_cross_entropy():
    torch.manual_seed(0)
    moh = {"n_heads": 4, "moh": {"k": 1, "shared": 1, "balance": 0.5}}  # 3 routed heads, 1 on at a position
    model = Encoder(20, 3, max_len=8, readout="mean", d_model=8, n_layers=2, dropout=0.0, attention=moh).double()

    expected, b = copy.deepcopy(model).train(), batch()
    balance = naive_load_balance(expected, b)
    (F.cross_entropy(expected(b["tokens"], b["padding_mask"])[0], b["labels"]) + balance).backward()
    adamw_step(expected)

    balanced = trained(model)
    without = copy.deepcopy(model)
    for block in without.blocks:
        block.attn.moh_balance = 0.0
    assert largest_difference(balanced.model, expected) < 1e-12
    assert largest_difference(balanced.model, trained(without).model) > 1e-4  # the loss moved the routers
    # train/loss stays the cross-entropy, comparable with a run without the balance term
    logged = balanced.trainer.callback_metrics["train/loss_epoch"].item()
    assert logged == pytest.approx(F.cross_entropy(model(b["tokens"], b["padding_mask"])[0], b["labels"]).item())


def test_an_rdrop_step_of_mixture_of_heads_adds_the_mean_of_its_two_passes_load_balance_losses():
    torch.manual_seed(0)
    moh = {"n_heads": 4, "moh": {"k": 1, "shared": 1, "balance": 0.5}}
    model = Encoder(20, 3, max_len=8, readout="mean", d_model=8, dropout=0.3, attention=moh).double()

    # by hand: two passes under different dropout masks, each pass's L_b (naive_load_balance, with the same masks)
    expected, b = copy.deepcopy(model).train(), batch()
    torch.manual_seed(SEED)
    first, second = (expected(b["tokens"], b["padding_mask"])[0] for _ in range(2))
    torch.manual_seed(SEED)
    balances = [naive_load_balance(expected, b) for _ in range(2)]  # each runs one pass, as the step's passes draw
    log_p, log_q = first.log_softmax(-1), second.log_softmax(-1)
    kl = F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")
    kl = (kl + F.kl_div(log_p, log_q, log_target=True, reduction="batchmean")) / 2
    cross_entropy = (F.cross_entropy(first, b["labels"]) + F.cross_entropy(second, b["labels"])) / 2
    assert balances[0].item() != balances[1].item()  # the two passes' routers saw different inputs
    (cross_entropy + ALPHA * kl + (balances[0] + balances[1]) / 2).backward()
    adamw_step(expected)

    assert largest_difference(trained(model, rdrop=ALPHA).model, expected) < 1e-12
