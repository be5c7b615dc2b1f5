"""Medians of interleaved repeats: how headlab times two ways of computing the same thing on a shared, noisy machine
(a pack's choice of how its members compute, and the benchmarks)."""

import statistics
import time
from collections.abc import Callable


def interleaved(steps: dict[str, Callable[[], object]], repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each step, timed in turn (A, B, A, B, ...) after `warmup` untimed calls of each."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}
