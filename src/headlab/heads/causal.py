"""What each head does, causally: ablations and activation patching. Pure torch.

A model's attention layers expose hook points (headlab.model.hooks) as `model.blocks[l].attn.hook_<point>`: a
forward hook there replaces the tensor passing. Here:
- ablation: a head's output (`hook_z`, (B, H, n, d_v)) replaced by zeros, by its mean over a reference set (at each
  position, over the examples where that position is real), or by its output on another input (resampling: the
  next example of the batch); a key/value group's values (`hook_v`, (B, G, n, d_v)) likewise. The effect is the
  change in loss and accuracy on the batches given (Michel et al. 2019 mask heads; Wang et al. 2022 mean-ablate;
  Chan et al. 2022 resample).
- activation patching: a head's output on a clean input put into the run on a corrupted one (a minimally changed
  input with another answer at one query), and the share of the clean-vs-corrupted logit difference that this
  restores: (LD_patched - LD_corrupted) / (LD_clean - LD_corrupted), LD the logit of the clean answer minus that of
  the corrupted one at that query, each averaged over the examples (Meng et al. 2022; Heimersheim & Nanda 2024).
Shapes: B examples, L layers, H heads, G key/value heads, n positions, d_v value size.
"""

import contextlib
import functools
from collections.abc import Callable, Iterable

import torch

from headlab.conventions import IGNORE_INDEX
from headlab.heads.importance import MASKS_PER_FORWARD, _per_example_loss

KINDS = ("zero", "mean", "resample")  # ablations


@contextlib.contextmanager
def replaced(model: torch.nn.Module, layer: int, point: str, edit: Callable[[torch.Tensor], torch.Tensor]):
    """Layer `layer`'s hook point `point` ("hook_z", "hook_v") passes edit(tensor) while the context is open."""
    handle = getattr(model.blocks[layer].attn, point).register_forward_hook(lambda module, args, out: edit(out))
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def resumed(model: torch.nn.Module, layer: int, passed: dict[str, list[torch.Tensor]], edit: Callable):
    """While the context is open, a forward pass of the input that `passed` was recorded on (passing: its hook_z and
    hook_v in every layer) takes layer `layer`'s heads' outputs as edit(what passed its hook_z) without computing
    that layer's projections and attention maps again: what `replaced(model, layer, "hook_z", edit)` computes, for
    less (the maps are most of a one-layer model's pass)."""
    attn = model.blocks[layer].attn
    z, v = passed["hook_z"][layer], passed["hook_v"][layer]  # (B, H, n, d_v), (B, G, n, d_v)

    def forward(x, key_padding_mask=None, need_weights=False, head_mask=None, pass_state=None):
        if pass_state is not None:  # what its projection leaves for later layers (the value residual's first values)
            attn.mix_values(v, pass_state)
        return attn.merge(edit(z), head_mask), None

    attn.forward = forward
    try:
        yield
    finally:
        del attn.forward


def passing(model: torch.nn.Module, batch: dict, points: tuple[str, ...]) -> tuple[torch.Tensor, dict]:
    """The logits of a batch and what passed each of `points` in every layer: (logits, {point: [tensor per
    layer]})."""
    seen: dict[str, list[torch.Tensor]] = {point: [] for point in points}
    handles = [
        getattr(b.attn, point).register_forward_hook(lambda m, a, out, point=point: seen[point].append(out))
        for b in model.blocks
        for point in points
    ]
    try:
        logits, _ = model(batch["tokens"], batch["padding_mask"])
    finally:
        for handle in handles:
            handle.remove()
    return logits, seen


def recorded(model: torch.nn.Module, batch: dict, point: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The logits of a batch and what passed `point` in every layer: (logits, [tensor per layer])."""
    logits, seen = passing(model, batch, (point,))
    return logits, seen[point]


def loss_and_correct(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, int, int]:
    """Summed per-example loss, correct predictions and scored predictions of a batch."""
    scored = labels != IGNORE_INDEX
    right = (logits.argmax(-1) == labels) & scored
    return float(_per_example_loss(logits, labels).sum()), int(right.sum()), int(scored.sum())


def position_means(batches: Iterable[dict], model: torch.nn.Module, point: str) -> list[torch.Tensor]:
    """Each layer's mean of `point` over the batches' examples at each position where it is real: per layer
    (H or G, n, d) (n the longest batch's length, with the positions a model puts first, its cls vector; 0 where
    no example is real)."""
    sums, counts = None, None
    for batch in batches:
        _, seen = recorded(model, batch, point)
        padding = batch["padding_mask"]
        if hasattr(model, "attention_padding_mask"):  # the attention's own positions: a cls vector first
            padding = model.attention_padding_mask(padding)
        real = (~padding).to(seen[0].dtype)  # (B, n)
        n = real.shape[1]
        batch_sums = [(t * real[:, None, :, None]).sum(0) for t in seen]  # (H, n, d) per layer
        if sums is None:
            sums, counts = batch_sums, real.sum(0)
            continue
        width = max(n, counts.shape[0])
        sums = [_padded(s, width) + _padded(b, width) for s, b in zip(sums, batch_sums, strict=True)]
        counts = _padded(counts[None, :, None], width)[0, :, 0] + _padded(real.sum(0)[None, :, None], width)[0, :, 0]
    return [s / counts.clamp(min=1)[None, :, None] for s in sums]


def _padded(t: torch.Tensor, n: int) -> torch.Tensor:
    """(·, m, d) -> (·, n, d), zeros after position m."""
    return torch.nn.functional.pad(t, (0, 0, 0, n - t.shape[1]))


def _replacement(kind: str, t: torch.Tensor, index: int, mean: torch.Tensor | None) -> torch.Tensor:
    """What replaces head (or group) `index` of t (B, H, n, d): zeros, its mean (H, n', d) or the next example's."""
    if kind == "zero":
        return torch.zeros_like(t[:, index])
    if kind == "mean":
        return _padded(mean[index][None], t.shape[2])[0, : t.shape[2]].expand_as(t[:, index])
    return t[:, index].roll(-1, dims=0)  # resample: example b gets example b + 1's


def edited_logits(
    model: torch.nn.Module, layer: int, batch: dict, edits: list[Callable], passed: dict | None, point: str = "hook_z"
) -> list[torch.Tensor]:
    """The batch's logits (B, ...) with what passes layer `layer`'s `point` edited by each of `edits` (t -> its
    edited copy): resumed at the layer from what `passed` recorded (resumed), up to MASKS_PER_FORWARD edits in one
    forward pass, each on its own copy of the batch from that layer on (the model's copies); with passed None,
    through a hook on `point` (a key/value group's values, inside the layer), one edit a pass."""
    per_forward = MASKS_PER_FORWARD if passed is not None else 1
    logits = []
    for start in range(0, len(edits), per_forward):
        chunk = edits[start : start + per_forward]

        def edit(t, chunk=chunk):  # (B, H, n, d) -> (K B, H, n, d): copy k edited by chunk[k]
            return torch.cat([e(t) for e in chunk])

        with resumed(model, layer, passed, edit) if passed is not None else replaced(model, layer, point, edit):
            out = model(batch["tokens"], batch["padding_mask"], copies=len(chunk), copied_at=layer)[0]
        logits.extend(out.chunk(len(chunk)))
    return logits


@torch.no_grad()
def ablation_effects(
    model: torch.nn.Module, batches: list[dict], reference: list[dict], groups: bool = False
) -> dict[str, dict[str, torch.Tensor]]:
    """{kind: {"loss": (L, H), "acc": (L, H)}}: the change in mean per-example loss and in accuracy on `batches`
    when one head's output (groups: one key/value group's values, (L, G)) is ablated by each kind of KINDS, the
    means taken over the `reference` batches."""
    point = "hook_v" if groups else "hook_z"
    means = position_means(reference, model, point)
    kept = () if groups else ("hook_z", "hook_v")  # a head's ablation resumes at its layer from them
    passes = [passing(model, b, kept) for b in batches]
    base = [loss_and_correct(logits, b["labels"]) for (logits, _), b in zip(passes, batches, strict=True)]
    examples, scored = sum(len(b["labels"]) for b in batches), sum(s for *_, s in base)
    base_loss, base_acc = sum(loss for loss, *_ in base) / examples, sum(c for _, c, _ in base) / max(1, scored)
    L, width = len(means), means[0].shape[0]
    out = {kind: {m: torch.zeros(L, width, dtype=torch.float64) for m in ("loss", "acc")} for kind in KINDS}
    ablations = [(kind, index) for kind in KINDS for index in range(width)]
    for layer in range(L):

        def ablated(t, kind, index, mean=means[layer]):
            t = t.clone()
            t[:, index] = _replacement(kind, t, index, mean)
            return t

        edits = [functools.partial(ablated, kind=kind, index=index) for kind, index in ablations]
        seen = [[] for _ in ablations]  # per ablation: (loss, correct, scored) of each batch
        for b, (_, passed) in zip(batches, passes, strict=True):
            for k, logits in enumerate(edited_logits(model, layer, b, edits, None if groups else passed, point)):
                seen[k].append(loss_and_correct(logits, b["labels"]))
        for (kind, index), results in zip(ablations, seen, strict=True):
            out[kind]["loss"][layer, index] = sum(loss for loss, *_ in results) / examples - base_loss
            out[kind]["acc"][layer, index] = sum(c for _, c, _ in results) / max(1, scored) - base_acc
    return out


def logit_difference(logits: torch.Tensor, position: torch.Tensor | None, right: torch.Tensor, wrong: torch.Tensor):
    """logit[right] - logit[wrong] of each example, at its query position for a token task: (B,)."""
    rows = torch.arange(len(right), device=logits.device)
    at = logits if position is None else logits[rows, position]  # (B, C)
    return at[rows, right] - at[rows, wrong]


@torch.no_grad()
def patching_shares(
    model: torch.nn.Module, clean: dict, corrupted: dict, position: torch.Tensor | None, by_position: bool = False
) -> torch.Tensor:
    """(L, H): the share of the clean-vs-corrupted logit difference that putting each head's clean output
    (hook_z) into the corrupted run restores; position (B,) the query whose answer the corruption changed (None:
    a sequence task). 1: the head alone carries the difference; 0: it carries none of it. by_position: (L, H, n),
    each head's clean output put in at one position at a time."""
    rows = torch.arange(len(clean["labels"]))
    pick = (lambda labels: labels) if position is None else (lambda labels: labels[rows, position])
    right, wrong = pick(clean["labels"]), pick(corrupted["labels"])
    clean_logits, clean_z = recorded(model, clean, "hook_z")
    corrupt_logits, passed = passing(model, corrupted, ("hook_z", "hook_v"))  # each patched pass resumes from it
    high = logit_difference(clean_logits, position, right, wrong).mean()
    low = logit_difference(corrupt_logits, position, right, wrong).mean()
    L, H, n = len(clean_z), clean_z[0].shape[1], clean_z[0].shape[2]
    where = [slice(None)] if not by_position else [slice(i, i + 1) for i in range(n)]
    shares = torch.zeros(L, H, len(where), dtype=torch.float64)
    patches = [(head, i, at) for head in range(H) for i, at in enumerate(where)]
    for layer in range(L):

        def patch(t, head, at, clean=clean_z[layer]):
            t = t.clone()
            t[:, head, at] = clean[:, head, at]
            return t

        edits = [functools.partial(patch, head=head, at=at) for head, _, at in patches]
        for (head, i, _), patched in zip(patches, edited_logits(model, layer, corrupted, edits, passed), strict=True):
            restored = logit_difference(patched, position, right, wrong).mean()
            shares[layer, head, i] = (restored - low) / (high - low) if high != low else 0.0
    return shares if by_position else shares[..., 0]


def rank_agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation of two per-head scores (any shape, flattened): the Pearson correlation of their
    ranks, tied scores sharing their mean rank; nan where either is constant."""
    x, y = (_ranks(t.flatten().double()) for t in (a, b))
    if x.min() == x.max() or y.min() == y.max():
        return float("nan")
    x, y = x - x.mean(), y - y.mean()
    return float((x * y).sum() / ((x * x).sum() * (y * y).sum()).sqrt())


def _ranks(t: torch.Tensor) -> torch.Tensor:
    """(N,) -> (N,) ranks 1..N, equal values sharing the mean of theirs."""
    _, which, counts = torch.unique(t, return_inverse=True, return_counts=True)  # sorted distinct values
    last = counts.cumsum(0).double()  # (distinct,) the highest rank of each value
    return (last - (counts - 1) / 2)[which]


# A head's role (on a task whose corruptions name the roles they change: pair_recall's "key a", "key b"), by
# rules stated once: it fetches a role when at least FETCH_SHARE of its attention lies on that role's keys and
# patching its clean output restores at least FETCH_RESTORE of that corruption's logit difference; a head that
# fetches two roles is "both"; otherwise "broad" (normalised entropy >= BROAD), "positional" (attention on self,
# previous, next and first token together >= POSITIONAL), or "other".
FETCH_SHARE = 0.25
FETCH_RESTORE = 0.25
BROAD = 0.8
POSITIONAL = 0.5
ROLES_BEYOND_FETCHING = ("both", "broad", "positional", "other")


def head_role(attention: dict[str, float], restored: dict[str, float], row: dict) -> str:
    """The role of one head: attention, the share of its attention on each corrupted role's keys; restored, the
    share of each corruption's logit difference patching it restores; row, its statistics (entropy_normalised,
    attn_self, attn_prev, attn_next, attn_first)."""
    fetched = [r for r in restored if attention.get(r, 0.0) >= FETCH_SHARE and restored[r] >= FETCH_RESTORE]
    if len(fetched) > 1:
        return "both"
    if fetched:
        return fetched[0]
    if row["entropy_normalised"] >= BROAD:
        return "broad"
    if sum(row[k] for k in ("attn_self", "attn_prev", "attn_next", "attn_first")) >= POSITIONAL:
        return "positional"
    return "other"
