"""A pack's members analysed at once give what each member's own analysis gives: importance, accuracies under
head masks, and whole pruning curves, through the CPU path (member after member) and the batched one (vmap, what
a GPU runs), with members' batches of different lengths padded to a common one."""

import copy

import pytest
import torch

from headlab.heads.importance import accuracies, head_importance
from headlab.model.encoder import Encoder
from headlab.training.attention_logging import AttentionLogger
from headlab.training.pack.analysis import MembersModel, analyse_members
from headlab.training.pack.data import stack_split
from headlab.training.vectorized import Stacked

E, B, N, VOCAB, C = 3, 6, 10, 15, 4


class Batched(MembersModel):
    """The members as the GPU runs them: one vmap over all members (on the CPU here)."""

    def __call__(self, tokens, padding_mask, head_mask=None, **copies):
        return self.stack.batched(tokens, padding_mask, head_mask=head_mask, **copies), None


def members(readout: str) -> tuple[list[Encoder], Stacked]:
    alone = []
    for e in range(E):
        torch.manual_seed(e)
        model = Encoder(VOCAB, C, N, readout=readout, d_model=16, n_layers=2, dropout=0.0, attention={"n_heads": 4})
        alone.append(model.double().eval())
    return alone, Stacked([copy.deepcopy(m) for m in alone]).double()


def batches(readout: str, seed: int) -> list[dict]:
    """Two batches of one member, each padded to its own longest example (as its loader gives them)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(2):
        lengths = torch.randint(2, N + 1, (B,), generator=g)
        n = int(lengths.max())
        padding = torch.arange(n)[None, :] >= lengths[:, None]
        tokens = torch.randint(1, VOCAB, (B, n), generator=g).masked_fill(padding, 0)
        labels = torch.randint(0, C, (B, n) if readout == "token" else (B,), generator=g)
        if readout == "token":
            labels = labels.masked_fill(padding, -100)
        out.append({"tokens": tokens, "padding_mask": padding, "labels": labels})
    return out


@pytest.mark.parametrize("readout", ["mean", "token"])
@pytest.mark.parametrize("path", [MembersModel, Batched])
def test_members_measured_at_once_match_each_measured_alone(readout, path):
    alone, stack = members(readout)
    own = [batches(readout, seed=10 + e) for e in range(E)]
    stacked = stack_split(own)
    model = path(stack.eval())
    scores = head_importance(model, stacked)  # (E, L, H)
    masks = [
        None,
        *(torch.bernoulli(torch.full((E, 2, 4), 0.5), generator=torch.Generator().manual_seed(k)) for k in range(5)),
    ]
    together = accuracies(model, stacked, masks, per_forward=4)  # 6 masks: two forward passes a batch
    for e, single in enumerate(alone):
        torch.testing.assert_close(scores[e], head_importance(single, own[e]), atol=1e-10, rtol=0)
        own_masks = [None if m is None else m[e] for m in masks]
        assert [a[e] for a in together] == pytest.approx(accuracies(single, own[e], own_masks), abs=1e-12)
    assert len({a[0] for a in together}) >= 2  # the masks matter


def test_a_packs_pruning_curves_are_each_members_own(tmp_path):
    """analyse_members against AttentionLogger.analyse's arithmetic, member by member: the importance curve and
    the random baseline drawn with each member's own seed."""
    readout = "mean"
    alone, stack = members(readout)
    analysts = [
        AttentionLogger(str(tmp_path / str(e)), pruning_step=0.25, pruning_baselines=["random", "reverse"], seed=e)
        for e in range(E)
    ]
    own = [(batches(readout, seed=10 + e), batches(readout, seed=20 + e)) for e in range(E)]
    stacked = [stack_split([b[i] for b in own]) for i in (0, 1)]
    measured = analyse_members(stack, analysts, own, stacked)
    for e, single in enumerate(alone):
        scores = head_importance(single, own[e][0])
        torch.testing.assert_close(measured[e].scores, scores, atol=1e-10, rtol=0)
        for order in ("importance", "random", "reverse"):
            curve = measured[e].curves[order]
            assert [p["heads_pruned"] for p in curve] == [0, 2, 4, 6, 8]
            masks = [torch.ones(2, 4)]
            for p in curve[1:]:
                mask = torch.ones(2, 4)
                for layer, head in p["pruned"]:
                    mask[layer, head] = 0
                masks.append(mask)
            expected = accuracies(single, own[e][1], masks)
            assert [p["metric"] for p in curve] == pytest.approx(expected, abs=1e-12)
        assert measured[e].examples == {"train": 2 * B, "val": 2 * B}
    random_orders = {tuple(map(tuple, m.curves["random"][2]["pruned"])) for m in measured}
    assert len(random_orders) > 1  # each member's own seed
