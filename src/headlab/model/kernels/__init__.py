"""Native CPU kernels, compiled with the system's C compiler on first use and cached.

additive.c computes Bahdanau scores and their gradients without storing the (B, H, n, m, d_k) hidden tensor
(tanh(q + k) = 1 - 2 / (e^2q e^2k + 1): exponentials once per query and once per key). It is built for the CPU
it runs on (-march=native) into $HEADLAB_CACHE/kernels (~/.cache/headlab/kernels), once per source, compiler and CPU,
and loaded with ctypes. Without a compiler, or with HEADLAB_NATIVE=0, `additive_applies` is False and callers
use torch ops instead (with one warning when the build failed). GPU tensors always use torch ops.
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

SOURCE = Path(__file__).with_name("additive.c")
ENABLED = os.environ.get("HEADLAB_NATIVE", "1") != "0"  # False: torch ops everywhere (the benchmark compares both)
FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp-simd", "-fPIC", "-pthread"]  # fast math in the
# compile step only: linked with it, GCC 12 adds crtfastmath.o, which flushes denormals in the whole process
if platform.machine().lower() in ("x86_64", "amd64"):  # reciprocal estimates refined by a Newton step
    FLAGS += ["-mrecip"]  # instead of divisions


def _cpu_identity() -> str:
    """What a -march=native build depends on: the CPU model and its feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags"))}))
    except OSError:
        return platform.processor() or platform.machine()


def _build(compiler: str) -> Path:
    """Compile additive.c unless this source, compiler and CPU already have a build; returns the .so path."""
    key = hashlib.sha256("\n".join([SOURCE.read_text(), compiler, *FLAGS, _cpu_identity()]).encode()).hexdigest()
    cache_dir = cache_root() / "kernels"
    library = cache_dir / f"additive-{key[:16]}.so"
    if not library.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:  # concurrent builds (sweep jobs, DDP ranks) race
            built = Path(tmp) / library.name  # to os.replace, which is atomic: every loader sees a whole file
            for command in (
                [compiler, *FLAGS, "-c", str(SOURCE), "-o", f"{built}.o"],
                [compiler, "-shared", "-pthread", f"{built}.o", "-lm", "-o", str(built)],
            ):
                subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
            os.replace(built, library)
    return library


@cache
def _library() -> ctypes.CDLL | None:
    """The compiled kernels, or None (with one warning saying why) when they cannot be built here."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    try:
        if compiler is None:
            raise OSError("no C compiler found (set CC)")
        library = ctypes.CDLL(str(_build(compiler)))
    except (OSError, subprocess.SubprocessError) as error:  # no compiler, a failed or hung build, no cache dir
        detail = getattr(error, "stderr", None) or error
        warnings.warn(f"headlab: native additive kernels unavailable, using torch ops (slower): {detail}", stacklevel=3)
        return None
    for name in ("additive_scores", "additive_grads"):
        getattr(library, name).restype = ctypes.c_int
    return library


def additive_applies(q: torch.Tensor) -> bool:
    """Whether the native kernels take this tensor: on the CPU, not float64 (they compute in float32), and the
    kernels built."""
    return ENABLED and q.device.type == "cpu" and q.dtype != torch.float64 and _library() is not None


def _pointer(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def additive_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """w_h^T tanh(q_i + k_j): q (B, H, n, d_k), k (B, H, m, d_k), w (H, d_k) -> (B, H, n, m). No autograd."""
    B, H, n, d = q.shape
    m = k.shape[2]
    q, kt, w = q.contiguous(), k.transpose(-2, -1).contiguous(), w.detach().contiguous()  # kt (B, H, d_k, m)
    scores = q.new_empty(B, H, n, m)
    ok = _library().additive_scores(
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
    ok = _library().additive_grads(
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
