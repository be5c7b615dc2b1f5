"""Timing helpers: the machine's matmul peak, whole commands (medians of interleaved repeats: headlab.timing)."""

import math
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch

from headlab.training.cores import usable_cores

CPU = torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU, where every op has finished when it returns)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synchronized(step, device: torch.device):
    """step, then a wait for the device: what a timed call must include on a GPU."""

    def run():
        step()
        synchronize(device)

    return run


def matmul_peak(
    n: int = 1024, repeats: int = 20, device: torch.device = CPU, dtype: torch.dtype = torch.float32
) -> float:
    """GFLOP/s of a square matmul on device, the practical peak: its fastest of `repeats` calls after three untimed
    (a peak is what the device reaches; a median of a few calls of ~10 ms falls with any neighbour's burst, and the
    ceilings and MFU figures built on it would read as reached when they are not)."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    step = synchronized(lambda: a @ b, device)
    for _ in range(3):
        step()
    fastest = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        fastest = min(fastest, time.perf_counter() - started)
    return 2 * n**3 / fastest / 1e9


def command_seconds(argv: list[str] | Callable[[int], list[str]], repeats: int, expect: int = 0) -> float:
    """The median seconds of `repeats` runs of a command, start to exit; argv(k) gives repeat k's own command (a
    run directory of its own: headlab-train refuses one that holds another run)."""
    times = []
    for k in range(repeats):
        command = argv(k) if callable(argv) else argv
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
        times.append(time.perf_counter() - start)
        if done.returncode != expect:
            raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-500:]}")
    return statistics.median(times)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    models = (
        [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        if cpuinfo.exists()
        else []
    )
    cpu = models[0] if models else cpu
    return f"{cpu}, {usable_cores()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"
