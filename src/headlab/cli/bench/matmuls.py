"""A pack step's matmuls alone: the products one member's training step computes (its linear layers forward and
both gradients, its attention forward and backward), recorded at their shapes as they are dispatched, then computed
for E members together and nothing else. Its time bounds what any way of packing E members can reach on this
device: the rest of a step (elementwise work, the optimizer, Python) only adds to it."""

from collections import Counter
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from headlab.timing import interleaved

PRODUCTS = ("mm", "addmm", "bmm")  # a product of Linear's and of the explicit attention's: its last two operands
ATTENTION = ("_scaled_dot_product_flash_attention_for_cpu",)  # the fused attention (its backward implied): q, k, v


class _Recording(TorchDispatchMode):
    """The products ops dispatched in its block compute (those of other ops' kernels are not dispatched here)."""

    def __init__(self):
        super().__init__()
        self.counted = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in PRODUCTS or name in ATTENTION:
            shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
            kind = "product" if name in PRODUCTS else "attention"
            self.counted[(kind, shapes[-2:] if kind == "product" else shapes[:3])] += 1
        return func(*args, **(kwargs or {}))


def recorded(step: Callable[[], object]) -> Counter:
    """The products one call of step computes, as ((kind, shapes), count): mm, bmm and addmm as ("product", (a, b))
    (addmm's bias added), the fused attention as ("attention", (q, k, v))."""
    with _Recording() as recording:
        step()
    return recording.counted


def _product(a: tuple, b: tuple, E: int) -> Callable[[], object]:
    """E members' product of a by b (one member's shapes): for 2-d operands the faster measured of one bmm over the
    members and a loop of mm (neither is the faster at every shape on a CPU); 3-d ones batched along their first."""
    if len(a) == 3:
        A, B = torch.randn(E * a[0], *a[1:]), torch.randn(E * b[0], *b[1:])
        return lambda: torch.bmm(A, B)
    A, B = torch.randn(E, *a), torch.randn(E, *b)  # (E, m, k), (E, k, n)
    ways = {"bmm": lambda: torch.bmm(A, B), "mm": lambda: [torch.mm(A[e], B[e]) for e in range(E)]}
    seconds = interleaved(ways, 3, warmup=1)
    return ways[min(seconds, key=seconds.get)]


def _attention(q: tuple, k: tuple, v: tuple, E: int) -> Callable[[], object]:
    """E members' attention (one member's (B, H, n, d) shapes), forward and backward: the faster measured of one
    fused call over the members' batches and a fused call a member (at short sequences, one call over E batches
    runs slower than E calls on a CPU)."""
    Q, K, V = (torch.randn(E * s[0], *s[1:], requires_grad=True) for s in (q, k, v))  # (E B, H, n, d)
    chunks = zip(*(t.detach().chunk(E) for t in (Q, K, V)), strict=True)  # member e's (B, H, n, d) each
    members = [[c.clone().requires_grad_() for c in member] for member in chunks]

    def fused(Q, K, V):
        out = F.scaled_dot_product_attention(Q, K, V)
        out.backward(torch.ones_like(out))
        Q.grad = K.grad = V.grad = None

    ways = {"one call": lambda: fused(Q, K, V), "a call a member": lambda: [fused(*m) for m in members]}
    seconds = interleaved(ways, 3, warmup=1)
    return ways[min(seconds, key=seconds.get)]


def alone(one_member_step: Callable[[], object], E: int) -> Callable[[], object]:
    """A call computing, for E members, the products one member's step computes (recorded), each as often."""
    work = [
        (count, _product(*shapes, E) if kind == "product" else _attention(*shapes, E))
        for (kind, shapes), count in recorded(one_member_step).items()
    ]

    def call():
        for count, product in work:
            for _ in range(count):
                product()

    return call
