"""What only a GPU can show: mixed precision on the fused paths, packs under vmap, a packed sweep on CUDA.
Marked gpu; skipped without CUDA (CI has none: these run on a lent GPU machine)."""

import json
import subprocess
import sys

import pytest
import torch

from conftest import PACKED, TINY, cli_env
from headlab.model import Encoder, MultiHeadAttention
from headlab.training.vectorized import Stacked

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [32, 600])  # stored weights; fused (B H n^2 above FUSED_ABOVE)
def test_additive_attention_under_autocast_matches_float32(dtype, n):
    torch.manual_seed(0)
    layer = MultiHeadAttention(64, 4, scoring="additive").cuda()
    x = torch.randn(4, n, 64, device="cuda", requires_grad=True)
    out, _ = layer(x, need_weights=False)
    (grad_ref,) = torch.autograd.grad(out.square().sum(), x)
    with torch.autocast("cuda", dtype=dtype):
        low, _ = layer(x, need_weights=False)
    (grad_low,) = torch.autograd.grad(low.float().square().sum(), x)
    eps = torch.finfo(dtype).eps  # q, k, v and the output are rounded to dtype: errors of a few eps relative
    torch.testing.assert_close(low.float(), out, atol=16 * eps * out.abs().max().item(), rtol=16 * eps)
    assert torch.isfinite(grad_low).all()
    assert (grad_low - grad_ref).norm() / grad_ref.norm() < 64 * eps


@pytest.mark.parametrize("n", [600, 2048])
def test_the_triton_kernels_equal_the_chunked_path_on_cuda_and_store_no_weights(monkeypatch, n):
    pytest.importorskip("triton")
    from headlab.model import dispatch

    torch.manual_seed(0)
    layer = MultiHeadAttention(128, 4, scoring="additive").cuda()
    x = torch.randn(4, n, 128, device="cuda", requires_grad=True)
    padding = torch.arange(n, device="cuda")[None, :] >= torch.tensor([n, n // 2, 7, n], device="cuda")[:, None]

    def run():
        out, _ = layer(x, padding, need_weights=False)
        return out[~padding], *torch.autograd.grad(out[~padding].square().sum(), [x, layer.score_vector])

    results = []
    for use_triton in (True, False):
        monkeypatch.setenv("HEADLAB_TRITON", "1" if use_triton else "0")
        dispatch.triton_kernels.cache_clear()
        run()  # compiled, and cuBLAS's workspace taken (tens of MiB on Hopper), before memory is counted
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        results.append((*run(), torch.cuda.max_memory_allocated() - base))
    dispatch.triton_kernels.cache_clear()
    (out, gx, gw, peak), (ref, ref_gx, ref_gw, chunked_peak) = results
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)  # TF32 in both paths' value products
    assert (gx - ref_gx).norm() / ref_gx.norm() < 1e-3 and (gw - ref_gw).norm() / ref_gw.norm() < 1e-3
    assert peak < 4 * n * n * 4 * 4  # less than the (B, H, n, n) fp32 weights: none are stored
    assert peak < chunked_peak / 8  # and a fraction of the chunked path's (B, H, c, m, d_k) hidden tensor


@pytest.mark.parametrize("E", [3, 1])  # under vmap; a pack of one runs its model as it is
def test_a_pack_under_vmap_computes_what_each_model_computes_alone(E):
    torch.manual_seed(0)
    models = [Encoder(30, 5, 12, readout="mean", d_model=32, n_layers=2).cuda().eval() for _ in range(E)]
    stack = Stacked(models).cuda().eval()
    assert stack.one_after_another(torch.device("cuda")) == (E == 1)
    tokens = torch.randint(1, 30, (E, 8, 12), device="cuda")
    mask = torch.zeros(E, 8, 12, dtype=torch.bool, device="cuda")
    out = stack(tokens, mask)
    for e, model in enumerate(models):
        torch.testing.assert_close(out[e], model(tokens[e], mask[e])[0], atol=1e-5, rtol=1e-5)


def test_a_packed_sweep_trains_on_the_gpu(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "headlab.cli.train", "-m", *PACKED, "seed=0,1,2", "trainer=gpu",
         *TINY, "logger=csv", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        env=cli_env(), capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "sweep").glob("*/results.json"))]
    assert [r["status"] for r in records] == ["completed"] * 3
    assert {r["pack"]["size"] for r in records} == {3} and records[0]["resources"]["accelerator"] == "gpu"


def test_a_non_finite_loss_on_the_gpu_is_caught_without_a_sync_per_step_and_names_its_first_step(tmp_path):
    """On a GPU the loss is read every trainer.log_every_n_steps steps and before validation, not at every step:
    the run still stops before any checkpoint holds spoilt weights, naming the first bad step."""
    done = subprocess.run(
        [sys.executable, "-m", "headlab.cli.train", *TINY, "trainer=gpu", "optim.lr=1e30",
         "trainer.gradient_clip_val=null", "logger=csv", f"hydra.run.dir={tmp_path / 'run'}"],
        env=cli_env(), capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "non-finite training objective at step 1 " in done.stderr and "no checkpoint was written" in done.stderr
