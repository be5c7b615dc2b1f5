"""Hook points: named places in a forward pass that plain torch forward hooks read and replace.

A HookPoint returns its input; a forward hook registered on it sees the tensor there, and one that returns a
tensor replaces it for the rest of the forward (torch's own rule for forward hooks), as TransformerLens's
HookPoint. Unused, a hook point costs one module call.
"""

import contextlib

import torch
from torch import nn


class HookPoint(nn.Identity):
    @property
    def hooked(self) -> bool:
        """Whether any hook is registered here (the attention then computes what the point shows)."""
        return bool(self._forward_hooks or self._forward_pre_hooks)


@contextlib.contextmanager
def recorded(model: nn.Module, point: str):
    """What passes the hook points named `point` (e.g. "hook_attn_scores") of every module of a model while the
    context is open: a list, one tensor a call, in the order of the forward (layer by layer)."""
    seen: list[torch.Tensor] = []
    points = [m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] == point]
    handles = [m.register_forward_hook(lambda module, args, out: seen.append(out)) for m in points]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()
