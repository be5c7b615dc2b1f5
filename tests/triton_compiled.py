"""The Triton kernels of additive attention compiled ahead of time for NVIDIA GPUs, down to machine code (cubin,
through Triton's bundled ptxas), on a machine without one: what the interpreter cannot show (layouts, tl.dot
shapes, registers and shared memory a real GPU must provide). Not collected with the suite: Triton is off the
path of the suite's process, so tests/model/test_attention.py runs this file in a process of its own."""

import os

import pytest

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip(
        "compiles for GPUs: run without TRITON_INTERPRET (tests/model/test_attention.py does)", allow_module_level=True
    )

from triton import compile as compile_kernel  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from headlab.model.kernels import additive_triton as kernels  # noqa: E402

SIZES = {"H", "n", "m", "D", "DV"}  # the kernels' integer arguments; every other non-constexpr one is a pointer
SHARED_MEMORY = {80: 163 * 1024, 90: 227 * 1024}  # bytes a block may use: A100, H100


@pytest.mark.parametrize(("arch", "precision", "d_v"), [(80, "ieee", 16), (90, "tf32", 64)])  # A100 strict fp32, H100
@pytest.mark.parametrize("kernel", ["_forward", "_backward_keys", "_backward_queries"])  # TF32 (the default)
def test_each_kernel_compiles_to_gpu_machine_code(kernel, arch, precision, d_v):
    fn = getattr(kernels, kernel)
    constants = {"BLOCK_M": kernels.BLOCK_M, "BLOCK_N": kernels.BLOCK_N, "BLOCK_D": kernels.BLOCK_D,
                 "BLOCK_DV": d_v, "PRECISION": precision}  # fmt: skip
    signature = {
        name: "constexpr" if name in constants else "i32" if name in SIZES else "*fp32" for name in fn.arg_names
    }
    compiled = compile_kernel(ASTSource(fn, signature, constexprs=constants), target=GPUTarget("cuda", arch, 32))
    assert compiled.asm["cubin"] and f".target sm_{arch}" in compiled.asm["ptx"]
    assert compiled.metadata.shared <= SHARED_MEMORY[arch]
