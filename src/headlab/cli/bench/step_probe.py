"""A text-default model's training step in a fresh process, as a run's process makes it (its allocator set by
headlab.training.allocator, HEADLAB_KEEP_FREED=0 leaving glibc's defaults): `python step_probe.py B N STEPS`
prints the median seconds of a step and the page faults of a step. One thread, as packs and sweeps of several
jobs run: 8,000-token vocabulary, d_model 128, 16 heads, d_ff 512, dropout 0.3, mean readout, AdamW."""

import resource
import statistics
import sys
import time

import torch

from headlab.model import Encoder
from headlab.training import allocator


def main(batch: int, n: int, steps: int) -> tuple[float, float]:
    allocator.keep_freed_memory()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Encoder(8000, 2, n, readout="mean", d_model=128, d_ff=512, dropout=0.3, attention={"n_heads": 16})
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    tokens, labels = torch.randint(1, 8000, (batch, n)), torch.randint(0, 2, (batch,))

    def step():
        torch.nn.functional.cross_entropy(model(tokens)[0], labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step(), step()  # the first steps fault their pages in however malloc is set
    faults, times = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times), (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps


if __name__ == "__main__":
    print(*main(*map(int, sys.argv[1:4])))
