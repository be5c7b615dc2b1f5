"""headlab-compare: grouping by the keys that vary, means and t confidence intervals over seeds."""

import csv
import json
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from conftest import TINY
from headlab.cli.compare import compare, load_dirs, main


def write_run(path, heads, scoring, seed, acc, status="completed"):
    path.mkdir(parents=True)
    record = {
        "status": status,
        "metrics": {"test/acc": acc, "val/acc_best": acc + 0.01},
        "config": {
            "model.attention.n_heads": heads,
            "model.attention.scoring": scoring,
            "seed": seed,
            "data.seed": seed,
            "model.d_model": 64,
            "trainer.default_root_dir": str(path),
        },
        "params": {"total": 1000 * heads, "attention": 10},
        "throughput": {"train_tokens_per_s": 5000.0},
    }
    (path / "results.json").write_text(json.dumps(record))


@pytest.fixture
def sweep(tmp_path):
    rng = np.random.default_rng(0)
    accs = {}
    for i, (heads, scoring, seed) in enumerate(
        (h, s, k) for h in (1, 4) for s in ("dot", "additive") for k in range(3)
    ):
        accs.setdefault((heads, scoring), []).append(acc := float(rng.uniform(0.5, 1.0)))
        write_run(tmp_path / "sweep" / str(i), heads, scoring, seed, acc)
    return tmp_path / "sweep", accs


def test_groups_means_and_confidence_intervals_match_scipy(sweep):
    root, accs = sweep
    keys, rows = compare(load_dirs([root]).completed, ["test/acc"])
    assert keys == ["model.attention.n_heads", "model.attention.scoring"]  # seed and paths do not count
    assert len(rows) == 4
    for row in rows:
        values = accs[(row["model.attention.n_heads"], row["model.attention.scoring"])]
        low, high = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
        summary = row["test/acc"]
        assert summary["n"] == 3 and summary["mean"] == pytest.approx(np.mean(values))
        assert summary["std"] == pytest.approx(np.std(values, ddof=1))
        assert summary["ci95"] == pytest.approx((high - low) / 2)


def test_baseline_difference_uses_welch_t_test(sweep):
    root, accs = sweep
    _, rows = compare(load_dirs([root]).completed, ["test/acc"], ("model.attention.n_heads", "1"))
    row = next(r for r in rows if r["model.attention.n_heads"] == 4 and r["model.attention.scoring"] == "dot")
    a, b = accs[(4, "dot")], accs[(1, "dot")]
    assert row["test/acc"]["delta"] == pytest.approx(np.mean(a) - np.mean(b))
    assert row["test/acc"]["p_value"] == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)


def test_corrupt_missing_and_failed_runs_are_reported_and_the_rest_compared(sweep, capsys):
    root, _ = sweep
    (root / "0" / "results.json").write_text("{not json")
    (root / "empty").mkdir()
    write_run(root / "failed", 8, "dot", 0, 0.0, status="failed")
    (root / "bare").mkdir()
    (root / "bare" / "results.json").write_text('{"status": "completed", "metrics": {"test/acc": 1.0}}')
    main([str(root), str(root / "empty")])
    err = capsys.readouterr().err
    assert f"skipped {root / 'bare' / 'results.json'}: a completed record without config" in err
    assert f"skipped {root / '0' / 'results.json'}: JSONDecodeError" in err
    assert f"skipped {root / 'empty'}: no results.json below it" in err
    assert f"failed run {root / 'failed'}" in err
    table = list(csv.DictReader((root / "compare.csv").open()))
    assert [int(r["runs"]) for r in table] == [3, 2, 3, 3]  # (1, additive), then (1, dot) without its corrupt seed
    assert (root / "compare_test_acc.png").read_bytes()[:4] == b"\x89PNG"
    assert "Left out:" in (root / "compare.md").read_text()


@pytest.mark.e2e
def test_two_by_two_multirun_then_compare(run_cli, tmp_path):
    result = run_cli(
        "-m",
        *TINY,
        "trainer.max_epochs=1",
        "callbacks.attention=null",
        "model.attention.n_heads=1,2",
        "seed=0,1",
        "hydra.sweep.dir=sweep",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = load_dirs([tmp_path / "sweep"]).completed
    assert len(records) == 4
    cli = subprocess.run(
        [sys.executable, "-m", "headlab.cli.compare", str(tmp_path / "sweep")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    table = list(csv.DictReader((tmp_path / "sweep" / "compare.csv").open()))
    assert [r["model.attention.n_heads"] for r in table] == ["1", "2"]
    for row in table:
        accs = [
            r["metrics"]["test/acc"]
            for r in records
            if str(r["config"]["model.attention.n_heads"]) == row["model.attention.n_heads"]
        ]
        assert float(row["test/acc_mean"]) == pytest.approx(np.mean(accs))
        assert float(row["test/acc_std"]) == pytest.approx(np.std(accs, ddof=1))


def test_pruning_curves_are_averaged_over_seeds(tmp_path):
    curves = [[0.9, 0.8, 0.5], [0.7, 0.6, 0.3]]
    for seed, curve in enumerate(curves):
        write_run(tmp_path / str(seed), 4, "dot", seed, 0.9)
        points = [{"heads_pruned": i, "fraction_pruned": i / 2, "metric": m} for i, m in enumerate(curve)]
        (tmp_path / str(seed) / "heads.json").write_text(json.dumps({"pruning_curve": points}))
    main([str(tmp_path), "--pruning"])
    text = (tmp_path / "compare.md").read_text()
    half_width = stats.t.ppf(0.975, 1) * np.std([0.8, 0.6], ddof=1) / np.sqrt(2)
    assert f"| 1 | 0.50 | 0.7000 ± {half_width:.4f} |" in text and "| 2 | 1.00 | 0.4000" in text


def test_wandb_summaries_with_max_dicts_become_numbers(monkeypatch):
    """What W&B's API returns for a run whose val/acc was defined with summary="max" (headlab's loggers do)."""
    import wandb

    from headlab.cli.compare import load_wandb

    class Run:
        summary = {"val/acc": {"max": 0.75}, "test/acc": 0.7, "heads/table": {"_type": "table-file"}, "_step": 9}
        config = {"model.attention.n_heads": 4, "seed": 1}
        url, state = "https://wandb.example/run", "finished"

    monkeypatch.setattr(wandb, "Api", lambda timeout: type("Api", (), {"runs": lambda self, path, filters: [Run()]})())
    runs = load_wandb("entity/project", None)
    assert runs.completed[0]["metrics"] == {"val/acc_best": 0.75, "val/acc": 0.75, "test/acc": 0.7, "_step": 9}
