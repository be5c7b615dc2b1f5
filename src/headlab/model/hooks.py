"""Hook points: named places in a forward pass that plain torch forward hooks read and replace.

A HookPoint returns its input; a forward hook registered on it sees the tensor there, and one that returns a
tensor replaces it for the rest of the forward (torch's own rule for forward hooks), as TransformerLens's
HookPoint. Unused, a hook point costs one module call.
"""

from torch import nn


class HookPoint(nn.Identity):
    @property
    def hooked(self) -> bool:
        """Whether any hook is registered here (the attention then computes what the point shows)."""
        return bool(self._forward_hooks or self._forward_pre_hooks)
