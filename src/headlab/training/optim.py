"""AdamW as headlab trains with it, stated once for single runs and packs: which parameters decay, the learning-rate
schedule, and which settings a pack's members may differ in (headlab.training.vectorized's AdamW takes those per
member; the others, sam_rho and rdrop, are one per pack).

Nothing heavy is imported at the top: the packed launcher reads PER_MEMBER before torch is loaded.
"""

import math

PER_MEMBER = ("lr", "weight_decay", "warmup", "betas")  # the optim.* keys a pack's members may differ in


def decays(shape) -> bool:
    """Whether weight decay applies to a parameter of this shape: matrices decay; biases, norms, vectors do not."""
    return len(shape) >= 2


def named_groups(module) -> tuple[list[str], list[str]]:
    """The names of a module's parameters in AdamW's two groups (decayed, then not), in the order of its state."""
    named = list(module.named_parameters())
    return [n for n, p in named if decays(p.shape)], [n for n, p in named if not decays(p.shape)]


def parameter_groups(module, weight_decay: float) -> list[dict]:
    """AdamW's parameter groups of a module: matrices with weight_decay, the rest without."""
    params = dict(module.named_parameters())
    decayed, plain = named_groups(module)
    return [
        {"params": [params[n] for n in decayed], "weight_decay": weight_decay},
        {"params": [params[n] for n in plain], "weight_decay": 0.0},
    ]


def fused(trainer) -> bool:
    """Whether AdamW runs torch's fused kernel: on the CPU (one pass a tensor where the single-tensor update makes
    several), except under mixed precision, where Lightning refuses to clip the gradients of an optimizer that
    could unscale them itself. A pack's members follow the same rule (vectorized.PackedAdamW's fused)."""
    return trainer.strategy.root_device.type == "cpu" and "mixed" not in str(trainer.precision)


def adamw(groups: list[dict], lr: float, betas, use_fused: bool):
    """torch's AdamW as a single run trains with it: its fused kernel where `use_fused` (optim.fused), else torch's
    default for the device."""
    import torch

    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), fused=True if use_fused else None)


def warmup_steps(warmup: float, total_steps: int) -> int:
    return max(1, int(warmup * total_steps))


def warmup_cosine(step: int, warmup_steps: int, total_steps: int) -> float:
    """Learning-rate multiplier: linear from 0 to 1 over warm-up, then cosine down to 0 at total_steps."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return 0.5 * (1.0 + math.cos(math.pi * progress))
