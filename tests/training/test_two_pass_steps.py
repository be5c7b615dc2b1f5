"""Two-pass steps through a real Trainer, each update computed here independently: sharpness-aware minimisation
(optim.sam_rho) and R-Drop (optim.rdrop)."""

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
