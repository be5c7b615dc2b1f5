"""Native CPU kernels, compiled with the system's C compiler on first use and cached.

additive.c computes Bahdanau scores and their gradients without storing the (B, H, n, m, d_k) hidden tensor
(tanh(q + k) = 1 - 2 / (e^2q e^2k + 1): exponentials once per query and once per key). dropout.c applies
headlab's CPU dropout mask in one pass each way (headlab.model.dropout) where torch runs on one thread. Each is
built for the CPU it runs on (-march=native) into $HEADLAB_CACHE/kernels (~/.cache/headlab/kernels), once per
source, compiler and CPU, and loaded with ctypes. Without a compiler, or with HEADLAB_NATIVE=0, `additive_applies`
and `dropout_applies` are False and callers use torch ops instead (with one warning when a build failed). GPU
tensors always use torch ops.
"""

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from functools import cache
from pathlib import Path

import torch

from headlab.conventions import cache_root

HERE = Path(__file__).parent
ENABLED = os.environ.get("HEADLAB_NATIVE", "1") != "0"  # False: torch ops everywhere (the benchmark compares both)
FLAGS = ["-O3", "-march=native", "-fPIC", "-pthread"]
FAST_MATH = ["-ffast-math", "-fopenmp-simd"]  # additive.c's, in the compile step only: linked with it, GCC 12 adds
# crtfastmath.o, which flushes denormals in the whole process
if platform.machine().lower() in ("x86_64", "amd64"):  # reciprocal estimates refined by a Newton step
    FAST_MATH += ["-mrecip"]  # instead of divisions
SOURCES = {  # library: (source, its compile flags, its functions, each returning int or nothing)
    "additive": ("additive.c", FLAGS + FAST_MATH, {"additive_scores": ctypes.c_int, "additive_grads": ctypes.c_int}),
    "dropout": ("dropout.c", FLAGS, {"dropout_forward": None, "dropout_apply": None}),  # exact float: no fast math
}


def cpu_identity() -> str:
    """What a -march=native build depends on (and a pack's timed choice of how to compute): the CPU model and its
    feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags"))}))
    except OSError:
        return platform.processor() or platform.machine()


def _build(name: str, compiler: str) -> Path:
    """Compile library `name` unless its source, flags, compiler and CPU already have a build; returns the .so path."""
    source, flags, _ = SOURCES[name]
    source = HERE / source
    key = hashlib.sha256("\n".join([source.read_text(), compiler, *flags, cpu_identity()]).encode()).hexdigest()
    cache_dir = cache_root() / "kernels"
    library = cache_dir / f"{name}-{key[:16]}.so"
    if not library.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:  # concurrent builds (sweep jobs, DDP ranks) race
            built = Path(tmp) / library.name  # to os.replace, which is atomic: every loader sees a whole file
            for command in (
                [compiler, *flags, "-c", str(source), "-o", f"{built}.o"],
                [compiler, "-shared", "-pthread", f"{built}.o", "-lm", "-o", str(built)],
            ):
                subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
            os.replace(built, library)
    return library


@cache
def _library(name: str) -> ctypes.CDLL | None:
    """The compiled library `name`, or None (with one warning saying why) when it cannot be built here."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    try:
        if compiler is None:
            raise OSError("no C compiler found (set CC)")
        library = ctypes.CDLL(str(_build(name, compiler)))
    except (OSError, subprocess.SubprocessError) as error:  # no compiler, a failed or hung build, no cache dir
        detail = getattr(error, "stderr", None) or error
        warnings.warn(f"headlab: native {name} kernels unavailable, using torch ops (slower): {detail}", stacklevel=3)
        return None
    for function, result in SOURCES[name][2].items():
        getattr(library, function).restype = result
    return library


def additive_applies(q: torch.Tensor) -> bool:
    """Whether the native kernels take this tensor: on the CPU, not float64 (they compute in float32), and the
    kernels built."""
    return ENABLED and q.device.type == "cpu" and q.dtype != torch.float64 and _library("additive") is not None


def _pointer(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def additive_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """w_h^T tanh(q_i + k_j): q (B, H, n, d_k), k (B, H, m, d_k), w (H, d_k) -> (B, H, n, m). No autograd."""
    B, H, n, d = q.shape
    m = k.shape[2]
    q, kt, w = q.contiguous(), k.transpose(-2, -1).contiguous(), w.detach().contiguous()  # kt (B, H, d_k, m)
    scores = q.new_empty(B, H, n, m)
    ok = _library("additive").additive_scores(
        _pointer(q), _pointer(kt), _pointer(w), _pointer(scores), *map(ctypes.c_long, (B * H, H, n, m, d)),
        ctypes.c_long(torch.get_num_threads()),
    )  # fmt: skip
    if not ok:
        raise MemoryError("headlab.kernels.additive_scores: no memory for its scratch buffers")
    return scores


def additive_grads(q, k, w, grad) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of additive_scores(q, k, w) for grad (B, H, n, m): (grad_q, grad_k, grad_w), shaped as q, k, w."""
    B, H, n, d = q.shape
    m = k.shape[2]
    q, kt, w, grad = q.contiguous(), k.transpose(-2, -1).contiguous(), w.detach().contiguous(), grad.contiguous()
    grad_q, grad_kt, grad_w = q.new_empty(B, H, n, d), q.new_empty(B, H, d, m), q.new_empty(B, H, d)
    ok = _library("additive").additive_grads(
        _pointer(q), _pointer(kt), _pointer(w), _pointer(grad), _pointer(grad_q), _pointer(grad_kt), _pointer(grad_w),
        *map(ctypes.c_long, (B * H, H, n, m, d)), ctypes.c_long(torch.get_num_threads()),
    )  # fmt: skip
    if not ok:
        raise MemoryError("headlab.kernels.additive_grads: no memory for its scratch buffers")
    return grad_q, grad_kt.transpose(-2, -1), grad_w.sum(0)


class NativeOps:
    """A chunk of additive scores by the native kernels (the interface of headlab.model.additive.TorchOps)."""

    stores_hidden = False

    @staticmethod
    def scores(qc, k, w) -> tuple[torch.Tensor, None]:
        return additive_scores(qc, k, w), None

    @staticmethod
    def grads(qc, k, w, grad, hidden=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return additive_grads(qc, k, w, grad)


def dropout_applies(x: torch.Tensor) -> bool:
    """Whether the native dropout takes this tensor: a contiguous float32 CPU tensor, torch on one thread (packs,
    sweeps of several jobs at a time; on more, torch's elementwise ops run in parallel and are as fast:
    docs/speed.md), and the kernels built."""
    return (
        ENABLED
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.is_contiguous()
        and torch.get_num_threads() == 1
        and _library("dropout") is not None
    )


def dropout_forward(bits: torch.Tensor, x: torch.Tensor, threshold: int, scale: float):
    """(x * keep * scale, keep) for keep = (bits' 15-bit uniforms >= threshold), as uint8 shaped as x."""
    y, keep = torch.empty_like(x), torch.empty(x.shape, dtype=torch.uint8)
    _library("dropout").dropout_forward(
        _pointer(bits), _pointer(x), _pointer(y), _pointer(keep), ctypes.c_long(x.numel()), ctypes.c_long(threshold),
        ctypes.c_float(scale),
    )  # fmt: skip
    return y, keep


def dropout_apply(x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
    """x * keep * scale for a contiguous float32 x and a uint8 keep of its shape (the backward pass's product)."""
    out = torch.empty_like(x)
    lib = _library("dropout")
    lib.dropout_apply(_pointer(x), _pointer(keep), _pointer(out), ctypes.c_long(x.numel()), ctypes.c_float(scale))
    return out
