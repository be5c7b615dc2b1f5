"""Freed memory kept for the next step: a training step allocates the same large buffers every time (gradients,
activations, a pack's (E, P) flat gradient), and glibc's malloc hands those back to the system when they are freed
(buffers above its mmap threshold are unmapped, a heap's free top is trimmed), so that the next step faults every
page in again, zero-filled by the kernel: about a tenth of a CPU pack worker's time went to the kernel
(docs/speed.md). Telling malloc to keep them holds the resident size near the step's peak, not above it, and
changes no number: only where buffers live (64-byte aligned either way)."""

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
KEPT = 1 << 30  # mallopt takes a C int: buffers up to 1 GiB are kept, the heap's top is not trimmed below it


def _mallopt():
    """glibc's mallopt, or None (another C library, another system)."""
    if not sys.platform.startswith("linux"):
        return None
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def keep_freed_memory() -> bool:
    """Make this process's malloc keep freed memory for reuse; True where it took effect. HEADLAB_KEEP_FREED=0
    leaves glibc's defaults (the benchmark compares both)."""
    mallopt = _mallopt()
    if mallopt is None or os.environ.get("HEADLAB_KEEP_FREED", "1") == "0":
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, KEPT)) and bool(mallopt(M_TRIM_THRESHOLD, KEPT))
