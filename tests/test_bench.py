"""headlab-bench runs end to end (tiny sizes) and writes every section; timings are not asserted."""

import pytest

from headlab.cli.bench import main

pytestmark = pytest.mark.e2e


def test_quick_bench_writes_every_section(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    out = tmp_path / "BENCHMARKS.md"
    main(["--quick", "--out", str(out)])
    text = out.read_text()
    for section in ("## Encoder training throughput", "## Additive scoring", "## Attention capture", "## Start-up"):
        assert section in text
    assert "| 32 | 0.1 | headlab, attention dropout 0 |" in text
    assert "| additive, fused |" in text and "| additive, fused, torch ops |" in text
    for scope in ("one layer", "4-layer encoder"):
        assert f"| {scope} | additive, native kernels |" in text and f"| {scope} | additive, torch ops |" in text
