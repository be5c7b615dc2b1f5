"""Sharpness-aware steps through a real Trainer: the update is SAM's, computed here independently."""

import copy

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from headlab.model import Encoder
from headlab.training.module import HeadLabModule

RHO, LR, CLIP = 0.5, 1e-2, 1.0


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


def trained(model: Encoder, sam_rho: float) -> Encoder:
    """One optimiser step of HeadLabModule in a Trainer, float64 (warm-up of one step: the full learning rate)."""
    module = HeadLabModule(copy.deepcopy(model), 3, lr=LR, weight_decay=0.1, sam_rho=sam_rho)
    trainer = pl.Trainer(
        max_steps=1,
        precision="64-true",
        gradient_clip_val=CLIP,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule=OneBatch())
    return module.model


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
    torch.nn.utils.clip_grad_norm_(expected.parameters(), CLIP)
    params = list(expected.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1}]
    groups.append({"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0})
    torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.98)).step()

    sam, plain = trained(model, RHO), trained(model, 0.0)
    for ours, theirs in zip(sam.parameters(), expected.parameters(), strict=True):
        assert torch.allclose(ours, theirs, rtol=0, atol=1e-12)
    moved = max((a - b).abs().max().item() for a, b in zip(sam.parameters(), plain.parameters(), strict=True))
    assert moved > 1e-4  # the ascent changed the step: the comparison above can fail


def test_a_sharpness_aware_step_logs_the_loss_at_w_not_at_the_ascended_point():
    torch.manual_seed(0)
    model = Encoder(20, 3, max_len=8, readout="mean", d_model=8, dropout=0.0, attention={"n_heads": 2}).double()
    b = batch()
    with torch.no_grad():
        at_w = F.cross_entropy(model(b["tokens"], b["padding_mask"])[0], b["labels"]).item()
    module = HeadLabModule(copy.deepcopy(model), 3, lr=LR, sam_rho=RHO)
    trainer = pl.Trainer(max_steps=1, precision="64-true", logger=False, enable_checkpointing=False)
    trainer.fit(module, datamodule=OneBatch())
    assert trainer.callback_metrics["train/loss_epoch"].item() == pytest.approx(at_w, abs=1e-12)
    assert module.ascended is False
