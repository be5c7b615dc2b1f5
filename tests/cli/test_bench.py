"""headlab-bench runs end to end (tiny sizes) and writes every section; timings are not asserted."""

import importlib.util
import re

import pytest
import torch
from omegaconf import OmegaConf

from conftest import TINY
from headlab.cli.bench import gpu, main, overhead, report

pytestmark = pytest.mark.e2e


def test_quick_bench_writes_every_section(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    out = tmp_path / "BENCHMARKS.md"
    keys = "peak encoder dropout freed_memory additive designs hooks memory capture startup default_run dry_run "
    keys += "sst2 "
    keys += "sst2_recipe sst2_overhead packs sweep parallel_packs"
    timed = ", ".join(f"{key}=60" for key in keys.split())  # the last run's line: each section took a minute
    out.write_text(f"<!-- section: cpu -->\n# Benchmarks\n{report.TIMES}{timed}; in all 18 min.\n")
    main(["--quick", "--out", str(out)])
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("headlab-bench: [")]
    assert said[0] == "headlab-bench: [1/18] matmul peak (0 s so far, about 18 min left by the last run's times)"
    assert len(said) == 18 and said[-1].endswith(", about 60 s left by the last run's times)")  # as it goes
    text = out.read_text()
    assert list(report.section_times(text)) == keys.split() and "; in all " in text  # what the next run reads
    for section in ("## Encoder training throughput", "## Additive scoring", "## Attention capture", "## Start-up"):
        assert section in text
    assert "| 32 | 0.1 | headlab, attention dropout 0 |" in text
    assert "On one thread, as packs and sweeps of several jobs run, the native dropout kernel" in text
    assert "with malloc keeping freed memory, as headlab's runs set it" in text
    assert "| additive, fused |" in text and "| additive, fused, torch ops |" in text
    assert "| compiled tokens/s | ceiling at the peak tokens/s (ratio) | its matmuls alone tokens/s (ratio) |" in text
    # --quick compiles nothing
    assert re.search(r" \| not measured \| [\d,]+ \([\d.]+x\) \| [\d,]+ \([\d.]+x\) \|\n", text)
    for scope in ("one layer", "4-layer encoder"):
        assert f"| {scope} | additive, native kernels |" in text and f"| {scope} | additive, torch ops |" in text


def test_a_runs_step_overhead_is_its_rate_against_the_bare_step_on_the_same_batches(tmp_path):
    r = overhead.step_overhead(tmp_path, "tiny", [*TINY, "logger=none"])
    assert r["run_tokens_per_s"] > 0 and r["bare_tokens_per_s"] > 0
    assert r["ratio"] == pytest.approx(r["bare_tokens_per_s"] / r["run_tokens_per_s"])
    bare = overhead.bare_step(OmegaConf.load(tmp_path / "tiny" / ".hydra" / "config.yaml"))
    assert bare["tokens"] == 256 * (16 + 16)  # one epoch of data.n_train=256: 16 fused pairs and 16 queries each


def test_the_gpu_sections_code_runs_on_a_cpu_at_tiny_sizes():
    """`headlab-bench --device cuda` runs where a GPU is lent for minutes: its measurements and report must not
    first break there."""
    cpu = torch.device("cpu")
    encoders = gpu.encoders(1, 1e12, cpu, sizes=((32, 1),), batch=2, n=8)
    expected = {"torch", "headlab"} | ({"BertModel"} if importlib.util.find_spec("transformers") else set())
    assert {r["model"] for r in encoders} == expected
    assert next(r["ratio_to_torch"] for r in encoders if r["model"] == "torch") == 1
    additive = gpu.additive(1, cpu, lengths=(8, 1024), batch=2, d=16)  # stored weights; fused above FUSED_ABOVE
    assert [(r["n"], r["path"], r["precision"]) for r in additive] == [
        (8, "dot (SDPA)", "fp32"), (8, "dot (SDPA)", "bf16"),
        (8, "additive, stored weights", "fp32"), (8, "additive, stored weights", "bf16"),
        (1024, "dot (SDPA)", "fp32"), (1024, "dot (SDPA)", "bf16"),
        (1024, "additive, chunked torch ops", "fp32"), (1024, "additive, chunked torch ops", "bf16"),
    ]  # fmt: skip
    designs = gpu.designs(1, cpu, d=32, heads=4, batch=2, n=8)
    assert designs[0]["design"] == "plain" and designs[0]["ratio_to_plain"] == 1
    assert {"differential", "talking_heads"} <= {r["design"] for r in designs}
    sweep = {"jobs": 4, "packed_s": 10.0, "completed": 4, "one_run_s": 5.0}
    step = {"command": "headlab-train x=1", "run_tokens_per_s": 50.0, "bare_tokens_per_s": 60.0, "ratio": 1.2}
    figures = {"device": "cpu", "date": "2026-12-04", "peak": 1e12, "encoders": encoders, "additive": additive}
    text = "\n".join(gpu.report({**figures, "designs": designs, "packs": [], "sweep": sweep, "sst2_overhead": step}))
    assert "| 32 | 1 | headlab |" in text and "| 8 | additive, stored weights | bf16 |" in text
    assert "| plain |" in text and "| 1.00x |" in text
    assert "4-seed sweep" in text and "2.0x the wall time of one run" in text and "1.20x slower" in text
    reached = "\n".join(gpu.report({"device": "cpu", "date": "2026-12-04", "peak": 1e12, "additive": additive}))
    assert "| 1024 | dot (SDPA) | fp32 |" in reached and "Encoder" not in reached  # a stopped run: what it measured


def test_a_packs_ceiling_is_its_training_flops_at_the_matmul_peak():
    """The ceiling of a pack row: 6 N + 6 L n H (d_k + d_v) training FLOPs a token (N the non-embedding parameters,
    Kaplan et al. 2020) at the peak given, against the members one at a time."""
    from headlab.cli.bench import packing

    (row,) = packing.pack_throughput(torch.device("cpu"), (2,), 1, ("default run",), peak=100.0)
    shape = packing.SHAPES["default run"]
    model = packing._models(shape, 1, torch.device("cpu"))[0]
    n_params = sum(p.numel() for name, p in model.named_parameters() if name not in ("tok_emb.weight", "pos_emb"))
    flops = 6 * n_params + 6 * 1 * shape["n"] * 4 * (16 + 16)  # one layer, 4 heads of d_k = d_v = 64 / 4
    assert row["ceiling_tokens_per_s"] == pytest.approx(100e9 / flops)
    assert row["ceiling_ratio"] == pytest.approx(row["ceiling_tokens_per_s"] / row["solo_tokens_per_s"])
    said = report.cpu_packs([row])
    assert f"| {row['ceiling_tokens_per_s']:,.0f} ({row['ceiling_ratio']:.2f}x) |" in said[-1]
    assert said[-1].endswith(f"| {row['matmuls_tokens_per_s']:,.0f} ({row['matmuls_ratio']:.2f}x) |")
    assert row["matmuls_ratio"] == pytest.approx(row["matmuls_tokens_per_s"] / row["solo_tokens_per_s"])


def test_a_packs_matmuls_alone_are_every_linear_layers_three_products_and_its_attention():
    """What the matmuls-alone ceiling computes: for each Linear of the default run's model (in -> out, on M = B n
    rows), its forward (M, in) x (in, out) and its gradients' (M, out) x (out, in) and (out, M) x (M, in), and the
    attention's fused call on (B, H, n, d_k), written out from the model's sizes."""
    from headlab.cli.bench import matmuls, packing

    shape, cpu = packing.SHAPES["default run"], torch.device("cpu")
    model = packing._models(shape, 1, cpu)[0]
    M, B, n, d = shape["batch"] * shape["n"], shape["batch"], shape["n"], shape["d_model"]
    expected = {}
    for layer in (m for m in model.modules() if isinstance(m, torch.nn.Linear)):
        i, o = layer.in_features, layer.out_features
        for a, b in (((M, i), (i, o)), ((M, o), (o, i)), ((o, M), (M, i))):
            expected[("product", (a, b))] = expected.get(("product", (a, b)), 0) + 1
    expected[("attention", ((B, 4, n, d // 4),) * 3)] = 1
    assert dict(matmuls.recorded(packing.solo_steps(shape, 1, cpu))) == expected
