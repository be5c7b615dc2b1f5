"""A pack's end-of-training head analysis, every member at once: head importance and pruning curves measured
through the stacked model (on a GPU one batched computation for all members, where member after member would
pay every kernel launch E times). What each member gets is what AttentionLogger.analyse gives its single run.

Shapes: E members, B batch, L layers, H heads.
"""

import time

import torch

from headlab.heads import importance
from headlab.training.attention_logging import AttentionLogger, HeadAnalysis, run_eagerly
from headlab.training.vectorized import Stacked


class MembersModel:
    """A pack's members as one model for headlab.heads.importance: inputs (E, B, ...), head masks
    (E, B, L, H) -> ((E, B, C) logits, None); the Encoder's copies and copied_at, the same for every member."""

    def __init__(self, stack: Stacked):
        self.stack = stack
        self.n_layers, self.n_heads = stack.template.n_layers, stack.template.n_heads

    def __call__(self, tokens, padding_mask, head_mask=None, **copies):
        return self.stack(tokens, padding_mask, head_mask=head_mask, **copies), None


@run_eagerly  # as a single run's analysis, also when the members' forward is compiled
def analyse_members(
    stack: Stacked, analysts: list[AttentionLogger], batches: list[tuple[list, list]], stacked: tuple[list, list]
) -> list[HeadAnalysis]:
    """Each member's importance and pruning curves (AttentionLogger.head_analysis), measured together.

    analysts: each member's AttentionLogger (their settings are the pack's, but for the random order's seed);
    batches: each member's (importance, pruning) batches, as its single run draws them; stacked: the same batches
    stacked over members, (E, B, ...) each."""
    E = stack.size
    was_training = stack.training
    stack.eval()
    started = time.perf_counter()
    model = MembersModel(stack)
    scores = importance.head_importance(model, stacked[0])  # (E, L, H)
    # every member's distinct curve masks side by side: slot k holds member e's k-th (or no mask, past its last)
    distinct = [importance.curve_masks(scores[e], a.pruning_step, a.orders, a.seed) for e, a in enumerate(analysts)]
    slots = max(len(d) for d in distinct)
    unmasked = torch.ones(model.n_layers, model.n_heads, device=scores.device)
    masks = [torch.stack([[*d.values(), *[unmasked] * slots][k] for d in distinct]) for k in range(slots)]
    # on a CPU members run one after another, each with all its masks' copies; on a GPU they run together
    per_forward = importance.MASKS_PER_FORWARD
    if scores.device.type != "cpu":
        per_forward = max(1, per_forward // E)
    measured = importance.accuracies(model, stacked[1], masks, per_forward)  # slots x E
    stack.train(was_training)
    seconds = (time.perf_counter() - started) / E  # a member's share
    out = []
    for e, (analyst, (ranked_on, scored_on)) in enumerate(zip(analysts, batches, strict=True)):
        metrics = {key: measured[k][e] for k, key in enumerate(distinct[e])}
        curves = importance.pruning_curves(scores[e], metrics, analyst.pruning_step, analyst.orders, analyst.seed)
        examples = {analyst.importance_split: ranked_on, analyst.pruning_split: scored_on}
        out.append(analyst.head_analysis(scores[e], curves, seconds, examples))
    return out
