"""Peak memory of one attention op's forward and backward: `python memory_probe.py PATH N` prints MiB.

Run in a fresh process per measurement (headlab-bench does, with MALLOC_MMAP_THRESHOLD_ low, so that freed
tensors leave the resident size at once): B = 8, 4 heads, d_k = 32, sequence N. PATH is one of micro.MEMORY_PATHS.
"""

import sys

import torch

from headlab.model import dispatch
from headlab.model.additive import AdditiveAttention, additive_scores_naive


def rss(field: str) -> int:
    """kB, from /proc/self/status."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field))


def main(path: str, n: int) -> float:
    B, H, d = 8, 4, 32
    q, k, v = (torch.randn(B, H, n, d, requires_grad=True) for _ in range(3))
    w = torch.randn(H, d, requires_grad=True)

    def step():
        if path == "dot":
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        elif path.startswith("additive, fused"):
            ops = dispatch.additive_ops(q)
            chunk = dispatch.queries_per_chunk(q, k, ops, fused=True)
            y = AdditiveAttention.apply(q, k, v, w, torch.zeros(B, 1, 1, n), ops, chunk)
        else:
            scores = dispatch.additive_scores if path == "additive, lean scores" else additive_scores_naive
            y = scores(q, k, w).softmax(-1) @ v
        y.sum().backward()

    step()  # the first step also loads kernels and sizes thread-local buffers: not what a training step costs
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # reset the peak resident size (VmHWM) to the current one
    base = rss("VmRSS:")
    step()
    return (rss("VmHWM:") - base) / 1024


if __name__ == "__main__":
    print(main(sys.argv[1], int(sys.argv[2])))
