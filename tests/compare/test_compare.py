"""headlab-compare: grouping by the keys that vary; bootstrap, exact and test statistics against independent
computations; per-arm selection of a key; provenance of every table."""

import csv
import itertools
import json
import math
import os
import re
import shutil
import statistics
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from conftest import ROOT, TINY, as_interrupted, cli_here
from headlab.cli.compare import main
from headlab.compare import blocks
from headlab.record import read_record
from headlab.stats import inference
from headlab.stats.comparison import compare
from headlab.stats.contrasts import Design
from headlab.stats.runs import load_dirs


def write_run(path, heads, scoring, seed, acc, status="completed", val=None, **config):
    path.mkdir(parents=True)
    record = {
        "status": status,
        "metrics": {"test/acc": acc, "val/acc_best": acc + 0.01 if val is None else val},
        "config": {
            "model.attention.n_heads": heads,
            "model.attention.scoring": scoring,
            "seed": seed,
            "data.seed": seed,
            "callbacks.attention.seed": seed,  # follows the seed: not an arm
            "model.d_model": 64,
            "trainer.default_root_dir": str(path),
            **config,
        },
        "git_sha": "abc123",
        "resources": {"accelerator": "cpu", "devices": 1, "threads": 2},
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


def test_groups_means_and_bootstrap_intervals_match_an_independent_computation(sweep):
    root, accs = sweep
    keys, rows = compare(load_dirs([root]).completed, Design(["test/acc"]))
    assert keys == ["model.attention.n_heads", "model.attention.scoring"]  # seed and paths do not count
    assert len(rows) == 4
    for row in rows:
        values = accs[(row["model.attention.n_heads"], row["model.attention.scoring"])]
        summary = row["test/acc"]
        assert summary["n"] == 3 and summary["mean"] == pytest.approx(np.mean(values))
        assert summary["std"] == pytest.approx(np.std(values, ddof=1))
        scipy_ci = stats.bootstrap((values,), np.mean, method="percentile", n_resamples=10_000, random_state=1)
        # two bootstraps of 10,000 resamples: their quantiles agree to a few hundredths of the values' range
        tolerance = 0.03 * (max(values) - min(values))
        assert summary["low"] == pytest.approx(scipy_ci.confidence_interval.low, abs=tolerance)
        assert summary["high"] == pytest.approx(scipy_ci.confidence_interval.high, abs=tolerance)


def test_intervals_of_bimodal_accuracies_stay_inside_what_an_accuracy_can_be():
    values = [0.098, 0.918, 0.101]  # one seed of three solves the task
    t_low, _ = stats.t.interval(0.95, 2, loc=np.mean(values), scale=stats.sem(values))
    assert t_low < 0  # the Student-t interval runs below 0
    low, high = inference.bootstrap_interval(values)
    assert min(values) <= low < high <= max(values)


def test_solve_rates_get_exact_clopper_pearson_intervals_and_fisher_tests():
    one_of_three = inference.solve_rate([0.098, 0.918, 0.101], 0.9)
    assert (one_of_three["k"], one_of_three["n"]) == (1, 3)
    # the exact interval for 1 of 3, from the beta quantiles that define it
    assert one_of_three["low"] == pytest.approx(stats.beta.ppf(0.025, 1, 3))
    assert one_of_three["high"] == pytest.approx(stats.beta.ppf(0.975, 2, 2))
    assert (round(one_of_three["low"], 4), round(one_of_three["high"], 4)) == (0.0084, 0.9057)
    all_three = inference.solve_rate([0.95, 0.99, 0.91], 0.9)
    assert inference.fisher_p(one_of_three, all_three) == pytest.approx(0.4)  # the reviewer's 1/3 vs 3/3


def test_holm_adjusts_by_rank_and_keeps_the_order_monotone():
    assert inference.holm([0.01, 0.04, 0.03, float("nan")])[:3] == pytest.approx([0.03, 0.06, 0.06])
    assert inference.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_baseline_difference_uses_welch_or_paired_tests_with_holm_over_the_comparisons(sweep):
    root, accs = sweep
    design = Design(["test/acc"], baseline=("model.attention.n_heads", "1"))
    _, rows = compare(load_dirs([root]).completed, design)
    row = next(r for r in rows if r["model.attention.n_heads"] == 4 and r["model.attention.scoring"] == "dot")
    a, b = accs[(4, "dot")], accs[(1, "dot")]
    assert row["test/acc"]["delta"] == pytest.approx(np.mean(a) - np.mean(b))
    welch = stats.ttest_ind(a, b, equal_var=False).pvalue
    assert row["test/acc"]["p_value"] == pytest.approx(welch)
    other = next(r for r in rows if r["model.attention.n_heads"] == 4 and r["model.attention.scoring"] == "additive")
    p_other = stats.ttest_ind(accs[(4, "additive")], accs[(1, "additive")], equal_var=False).pvalue
    smaller, larger = sorted([welch, p_other])  # Holm for two tests: 2 x the smaller, then at least that
    expected = {smaller: min(1, 2 * smaller), larger: max(min(1, 2 * smaller), larger)}
    assert row["test/acc"]["p_holm"] == pytest.approx(expected[welch])
    assert other["test/acc"]["p_holm"] >= other["test/acc"]["p_value"]
    paired = compare(load_dirs([root]).completed, Design(["test/acc"], baseline=design.baseline, paired=True))[1]
    row = next(r for r in paired if r["model.attention.n_heads"] == 4 and r["model.attention.scoring"] == "dot")
    assert row["test/acc"]["p_value"] == pytest.approx(stats.ttest_rel(a, b).pvalue)  # seeds 0, 1, 2 in both


def test_within_compares_each_arm_with_the_baseline_of_its_own_head_count(tmp_path, capsys):
    """The parameter-matched design: per head count, d_k = d_model / h (d_ff default or raised to match) against
    a fixed head size d_k = 32; the matched d_ff differs per head count."""
    arms = {(4, None, None): 0.6, (4, 32, None): 0.9, (4, None, 383): 0.7, (16, None, None): 0.2, (16, 32, None): 0.95}
    arms[16, None, 1145] = 0.3
    i = 0
    for (heads, d_k, d_ff), acc in arms.items():
        for seed in range(3):
            extra = {"model.attention.d_k": d_k, "model.d_ff": d_ff}
            write_run(tmp_path / str(i), heads, "dot", seed, acc + seed / 100, **extra)
            i += 1
    main([str(tmp_path), "--baseline", "model.attention.d_k=32", "--within", "model.attention.n_heads"])
    with (tmp_path / "compare.csv").open() as f:
        table = list(csv.DictReader(f))

    def arm(row):
        return tuple(None if v in ("", "None") else int(v) for v in [row[k] for k in ("model.attention.n_heads",
                     "model.attention.d_k", "model.d_ff")])  # fmt: skip

    rows = {arm(row): row for row in table}
    assert set(rows) == set(arms)

    def seeds(key):
        return [arms[key] + s / 100 for s in range(3)]

    for row, base in [((16, None, 1145), (16, 32, None)), ((4, None, 383), (4, 32, None))]:
        p = stats.ttest_ind(seeds(row), seeds(base), equal_var=False).pvalue
        assert float(rows[row]["test/acc_p_value"]) == pytest.approx(p)
    assert [a for a, row in rows.items() if row["test/acc_p_value"] == "nan"] == [(4, 32, None), (16, 32, None)]
    for null in ("None", "null"):  # as the table shows it, and as Hydra spells it
        with pytest.raises(
            SystemExit, match=f"2 groups have model.attention.d_k={null} and the same model.attention.n_"
        ):
            main([str(tmp_path), "--baseline", f"model.attention.d_k={null}", "--within", "model.attention.n_heads"])
    with pytest.raises(
        SystemExit, match=r"--baseline model.attention.d_k=64 matches no group: model.attention.d_k takes 32, null$"
    ):
        main([str(tmp_path), "--baseline", "model.attention.d_k=64", "--within", "model.attention.n_heads"])
    main([str(tmp_path), "--baseline", "model.attention.d_k=32.0", "--within", "model.attention.n_heads", "--no-plots"])
    with (tmp_path / "compare.csv").open() as f:
        assert [r["test/acc_p_value"] for r in csv.DictReader(f)] == [r["test/acc_p_value"] for r in table]


def test_in_a_pipe_or_a_file_the_table_is_compare_mds_rows_whole(tmp_path, capsys, monkeypatch):
    """stdout that is no terminal (`headlab-compare ... > out.txt`): no cell folded or cut, each row of compare.md's
    table as it is there, keys by their last part."""
    monkeypatch.setenv("COLUMNS", "80")
    for i, (heads, acc) in enumerate([(1, 0.6), (4, 0.9)] * 3):
        write_run(tmp_path / str(i), heads, "dot", i // 2, acc + i / 100)
    main([str(tmp_path), "--baseline", "model.attention.n_heads=4", "--effect", "0.05", "--no-plots"])
    shown = capsys.readouterr().out
    assert "…" not in shown and "┃" not in shown
    table = [line for line in (tmp_path / "compare.md").read_text().splitlines() if line.startswith("| ")]
    assert all(line in shown for line in table[1:]), shown
    assert "| n_heads |" in shown


def test_the_terminal_table_shows_every_cell_of_compare_md_in_full(tmp_path, capsys, monkeypatch):
    """Thirteen columns on an 80-column terminal: each word of every cell is there whole (folded between words,
    never cut with an ellipsis), keys by their last part."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # a terminal (capsys's stdout is none) without
    monkeypatch.setenv("TERM", "dumb")  # colours
    for i, (heads, d_k, d_ff, acc) in enumerate([(4, None, None, 0.6), (4, 32, None, 0.9), (4, None, 383, 0.7)] * 3):
        write_run(
            tmp_path / str(i), heads, "dot", i // 3, acc + i / 100, **{"model.attention.d_k": d_k, "model.d_ff": d_ff}
        )
    main([str(tmp_path), "--baseline", "model.attention.d_k=32", "--effect", "0.05", "--power", "--no-plots"])
    shown = capsys.readouterr().out
    assert "…" not in shown and "┃ d_k " in shown and "model.attention.d_k ┃" not in shown
    words = set(re.split(r"[\s│┃]+", shown))
    table = [line for line in (tmp_path / "compare.md").read_text().splitlines() if line.startswith("| ")][1:]
    cells = [cell for line in table for cell in line.strip("| ").split(" | ")]
    assert any("inconclusive" in cell or "significant" in cell for cell in cells)
    assert [w for cell in cells for w in cell.split() if w not in words] == []


def test_select_picks_each_arms_learning_rate_on_validation_and_reports_test_there(tmp_path):
    """Arm h=1 is best on validation at lr 1e-3, arm h=4 at 3e-3; the test accuracies reported are there."""
    val = {(1, 1e-3): 0.9, (1, 3e-3): 0.5, (4, 1e-3): 0.6, (4, 3e-3): 0.95}
    test = {(1, 1e-3): 0.8, (1, 3e-3): 0.99, (4, 1e-3): 0.7, (4, 3e-3): 0.85}  # test alone would pick otherwise
    for i, ((heads, lr), v) in enumerate(val.items()):
        for seed in range(3):
            run = tmp_path / f"{i}-{seed}"
            write_run(run, heads, "dot", seed, test[heads, lr] + seed / 100, val=v, **{"optim.lr": lr})
    main([str(tmp_path), "--select", "optim.lr", "--metric", "test/acc", "--baseline", "model.attention.n_heads=1"])
    table = list(csv.DictReader((tmp_path / "compare.csv").open()))
    assert [(r["model.attention.n_heads"], r["optim.lr"]) for r in table] == [("1", "0.001"), ("4", "0.003")]
    assert [float(r["test/acc_mean"]) for r in table] == pytest.approx([0.81, 0.86])
    welch = stats.ttest_ind([0.85, 0.86, 0.87], [0.80, 0.81, 0.82], equal_var=False).pvalue
    assert float(table[1]["test/acc_p_value"]) == pytest.approx(welch)  # between the selected learning rates
    text = (tmp_path / "compare.md").read_text()
    assert "optim.lr (selected on val/acc_best)" in text


def test_where_keeps_the_runs_of_one_value_and_tests_among_them_only(tmp_path):
    """Two rates: --where optim.lr=3e-2 (0.03 in the records) compares the arms at that rate alone, Holm over its
    one contrast; a value no run has is an error naming the values there are."""
    test = {(1, 1e-2): 0.9, (1, 3e-2): 0.2, (4, 1e-2): 0.95, (4, 3e-2): 0.6}
    for i, ((heads, lr), acc) in enumerate(test.items()):
        for seed in range(3):
            write_run(tmp_path / f"{i}-{seed}", heads, "dot", seed, acc + seed / 100, **{"optim.lr": lr})
    main([str(tmp_path), "--where", "optim.lr=3e-2", "--metric", "test/acc", "--baseline", "model.attention.n_heads=4"])
    table = list(csv.DictReader((tmp_path / "compare.csv").open()))
    assert [(r["model.attention.n_heads"], float(r["test/acc_mean"])) for r in table] == [
        ("1", pytest.approx(0.21)),
        ("4", pytest.approx(0.61)),
    ]
    welch = stats.ttest_ind([0.20, 0.21, 0.22], [0.60, 0.61, 0.62], equal_var=False).pvalue
    assert float(table[0]["test/acc_p_value"]) == pytest.approx(welch)  # one contrast: Holm leaves it
    assert "--where optim.lr=3e-2" in (tmp_path / "compare.md").read_text()
    with pytest.raises(SystemExit, match=r"--where optim.lr=0.1: no run has it; optim.lr is 0.01, 0.03"):
        main([str(tmp_path), "--where", "optim.lr=0.1"])


def test_every_table_records_the_command_the_commits_and_the_hardware(sweep):
    root, _ = sweep
    main([str(root), "--solved", "test/acc>=0.75"])
    text = (root / "compare.md").read_text()
    assert f"Command: `headlab-compare {root} --solved 'test/acc>=0.75'`" in text
    assert "headlab commit (compare): " in text and "Runs' commits: abc123 (12 runs)" in text
    assert "Runs' hardware: cpu x1, 2 threads (12 runs)" in text
    assert "solved (test/acc >= 0.75; exact 95% CI)" in text
    assert list(root.glob("compare_*.png"))
    tables = root / "tables only"  # --no-plots: the same table, no figures
    main([str(root), "--solved", "test/acc>=0.75", "--no-plots", "--out", str(tables)])
    assert sorted(p.name for p in tables.iterdir()) == ["compare.csv", "compare.json", "compare.md"]
    assert json.loads((tables / "compare.json").read_text()) == {
        "sources": {"dirs": [str(root)]},
        "analysis": {"solved": "test/acc>=0.75"},
    }
    assert (tables / "compare.md").read_text().split("\n| ")[1:] == text.split("\n| ")[1:]


def test_a_table_says_when_its_runs_trained_in_packs_of_different_sizes(tmp_path):
    """train tokens/s is a member's share of its pack's rate: where arms trained in packs of different sizes (or
    alone) the table says the column does not compare their speed; where all trained alike it says nothing."""
    for i, heads in enumerate((1, 1, 4, 4)):
        write_run(tmp_path / str(i), heads, "dot", i, 0.8 + i / 100)
    main([str(tmp_path), "--no-plots"])
    assert "Speed:" not in (tmp_path / "compare.md").read_text()
    for i, size in enumerate((30, 30, 15, None)):  # None: a run trained alone
        record = json.loads((tmp_path / str(i) / "results.json").read_text())
        record["pack"] = {"id": f"p{size}", "size": size, "index": i} if size else None
        (tmp_path / str(i) / "results.json").write_text(json.dumps(record))
    main([str(tmp_path), "--no-plots"])
    assert (
        "Speed: these runs trained in packs of 1 (1 run), 15 (1 run), 30 (2 runs), and a run's train tokens/s is "
        "its share of its pack's rate: the column does not compare the arms' speed (headlab-bench does)."
    ) in (tmp_path / "compare.md").read_text()


def test_a_run_read_twice_under_other_directories_is_one_replicate(tmp_path, capsys):
    """Two sweeps of one arm read together, or one sweep given seed=0,0: a seed that ran twice is one replicate (the
    first read), the other said to repeat it; its interval is that of the distinct seeds, not of a doubled sample."""
    accs = {0: 0.50, 1: 0.60, 2: 0.70}
    for sweep_, seeds in (("first", (0, 1)), ("again", (1, 2)), ("twice", (2,))):
        for seed in seeds:
            write_run(tmp_path / sweep_ / str(seed), 4, "dot", seed, accs[seed])
    write_run(tmp_path / "other_arm" / "1", 2, "dot", 1, 0.9)  # the same seed in another arm: its own replicate
    main([str(tmp_path / d) for d in ("first", "again", "twice", "other_arm")] + ["--no-plots"])
    err = capsys.readouterr().err
    same = "the same run (configuration and seed) as"
    assert f"skipped {tmp_path / 'again' / '1'}: {same} {tmp_path / 'first' / '1'}: counted once" in err
    assert f"skipped {tmp_path / 'twice' / '2'}: {same} {tmp_path / 'again' / '2'}: counted once" in err
    rows = {r["model.attention.n_heads"]: r for r in csv.DictReader((tmp_path / "first" / "compare.csv").open())}
    assert int(rows["4"]["runs"]) == 3 and int(rows["2"]["runs"]) == 1
    values = list(accs.values())
    mean, sd = sum(values) / 3, statistics.stdev(values)
    assert float(rows["4"]["test/acc_mean"]) == pytest.approx(mean) and float(
        rows["4"]["test/acc_std"]
    ) == pytest.approx(sd)


def test_a_sweep_given_a_value_twice_says_so_first_and_compare_counts_the_run_once(run_cli, tmp_path):
    done = run_cli("-m", "seed=0,0", *TINY, "logger=csv", "hydra.sweep.dir=sweep")
    assert done.returncode == 0, done.stderr[-2000:]
    said = done.stdout + done.stderr
    assert "the sweep's jobs 0 and 1 are the same run (seed=0 " in said  # before the first job: with its overrides
    assert said.index("the sweep's jobs 0 and 1") < said.index("#0 : seed=0")
    compared = cli_here("compare", "sweep", "--no-plots", cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr[-2000:]
    same = "the same run (configuration and seed) as"
    assert f"skipped sweep/1: {same} sweep/0: counted once" in compared.stderr
    assert [int(r["runs"]) for r in csv.DictReader((tmp_path / "sweep" / "compare.csv").open())] == [1]


def test_corrupt_missing_and_failed_runs_are_reported_and_the_rest_compared(sweep, capsys):
    root, _ = sweep
    (root / "0" / "results.json").write_text("{not json")
    (root / "empty").mkdir()
    write_run(root / "failed", 8, "dot", 0, 0.0, status="failed")
    write_run(root / "stopped", 8, "dot", 1, 0.0, status="interrupted")
    record = read_record(root / "stopped")
    (root / "stopped" / "results.json").write_text(json.dumps({**record, "error": "SystemExit"}))
    (root / "bare").mkdir()
    (root / "bare" / "results.json").write_text('{"status": "completed", "metrics": {"test/acc": 1.0}}')
    main([str(root), str(root / "empty"), str(root / "misspelt")])
    err = capsys.readouterr().err
    assert f"skipped {root / 'bare' / 'results.json'}: a completed record without config" in err
    assert f"skipped {root / '0' / 'results.json'}: not JSON (" in err
    assert f"skipped {root / 'empty'}: no results.json below it" in err
    assert f"skipped {root / 'misspelt'}: it does not exist" in err
    assert f"left out {root / 'failed'}: failed\n" in err
    assert f"left out {root / 'stopped'}: interrupted: SystemExit\n" in err  # a SIGTERM'd run, resumable
    table = list(csv.DictReader((root / "compare.csv").open()))
    assert [int(r["runs"]) for r in table] == [3, 2, 3, 3]  # (1, additive), then (1, dot) without its corrupt seed
    assert (root / "compare_test_acc.png").read_bytes()[:4] == b"\x89PNG"
    assert f"- {root / 'stopped'}: interrupted: SystemExit" in (root / "compare.md").read_text().split("Left out:")[1]


@pytest.mark.parametrize(
    "options, says",
    [
        (["--metric", "test/acuracy"], "no run has the metric 'test/acuracy'; theirs: test/acc, val/acc_best"),
        (["--solved", "tset/acc>=0.9"], "no run has the metric 'tset/acc'; theirs: test/acc, val/acc_best"),
        (["--reach", "val/acc>=0.9"], "--reach val/acc: no run's validation curve has it; theirs: none"),
        (
            ["--select", "model.attention.n_heads", "--select-on", "val/acc_bset"],
            "no run has the metric 'val/acc_bset'",
        ),
        (["--log", "test/loss"], "--log test/loss is not a metric compared (test/acc, val/acc_best): add --metric"),
    ],
)
def test_a_misspelt_or_absent_metric_is_an_error_naming_the_runs_metrics(sweep, options, says):
    """Not a table with an empty column: the command names what the runs have, and writes nothing."""
    root, _ = sweep
    with pytest.raises(SystemExit, match=re.escape(f"headlab-compare: {says}")):
        main([str(root), *options])
    assert not (root / "compare.md").exists()


@pytest.mark.parametrize("order", ["dirs first", "metrics first"])
def test_several_metrics_after_one_flag_are_each_compared(sweep, order):
    """--metric test/acc val/acc_best, before or after the directories, as --metric given twice."""
    root, _ = sweep
    flags = ["--metric", "test/acc", "val/acc_best", "--no-plots"]
    main([str(root), *flags] if order == "dirs first" else [*flags[:3], str(root), "--no-plots"])
    with (root / "compare.csv").open() as f:
        header = next(csv.reader(f))
    assert "test/acc_mean" in header and "val/acc_best_mean" in header


def test_a_sweep_still_running_is_one_line_of_counts_and_compare_md_lists_each_run(sweep, capsys):
    root, _ = sweep
    for i in range(7):
        write_run(root / f"later{i}", 8, "dot", i, 0.0, status="interrupted" if i < 5 else "running")
    main([str(root), "--no-plots"])
    said = [line for line in capsys.readouterr().err.splitlines() if "left out" in line]
    assert said == ["headlab-compare: left out 7 runs that did not complete (5 interrupted, 2 running): compare.md "
                    "lists each"]  # fmt: skip
    assert (root / "compare.md").read_text().count(": interrupted\n") == 5


def test_runs_of_one_data_config_that_read_different_files_are_flagged_in_the_table(sweep, capsys):
    """Same data config, another file content (a file edited between runs, another hub revision): said in
    compare.md and on stderr. Different data configs with different files are simply different data."""
    root, _ = sweep

    def set_files(path, test_digest, test_file):
        record = read_record(path)
        record["config"].update({"data": "files", "data.files.test": test_file})
        record["data"] = {"digests": {"files": {"train": "a" * 64, "test": test_digest}}}
        (path / "results.json").write_text(json.dumps(record))

    runs = sorted(root.glob("*/results.json"), key=lambda p: int(p.parent.name))
    for path in runs:
        set_files(path.parent, "b" * 64, "/data/test.tsv")
    main([str(root), "--no-plots"])
    assert "Mixed data" not in (root / "compare.md").read_text() and "mixed data" not in capsys.readouterr().err
    set_files(runs[0].parent, "c" * 64, "/data/test.tsv")
    main([str(root), "--no-plots"])
    said = "data=files: its test file has 2 versions (bbbbbbbbbbbb in 11 runs, cccccccccccc in 1 runs)"
    assert "**Mixed data**: runs of one data config read different files" in (root / "compare.md").read_text()
    assert (
        said in (root / "compare.md").read_text() and f"headlab-compare: mixed data: {said}" in capsys.readouterr().err
    )
    set_files(runs[0].parent, "c" * 64, "/data/other.tsv")  # another file named: another data config
    main([str(root), "--no-plots"])
    assert "Mixed data" not in (root / "compare.md").read_text()


def test_an_arm_without_the_selection_metric_is_an_error_not_a_missing_row(sweep):
    root, _ = sweep
    for path in root.glob("*/results.json"):
        record = json.loads(path.read_text())
        if record["config"]["model.attention.n_heads"] == 4:
            del record["metrics"]["val/acc_best"]
            path.write_text(json.dumps(record))
    with pytest.raises(SystemExit, match="no run of the arm model.attention.n_heads=4 has val/acc_best to choose on"):
        main([str(root), "--select", "model.attention.scoring"])


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
    cli = cli_here("compare", str(tmp_path / "sweep"), cwd=tmp_path)
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

    # a sweep stopped on one machine (job 1 interrupted) is archived, the sweep gone, the records put back on the
    # next: sweep.resume=true skips the completed runs, under another logger too (where a run reports does not
    # define it), and trains job 1 from its start (no checkpoint travels)
    as_interrupted(tmp_path / "sweep" / "1")
    main([str(tmp_path / "sweep"), "--out", str(tmp_path / "table"), "--archive", str(tmp_path / "runs.tar.xz")])
    shutil.rmtree(tmp_path / "sweep")
    with tarfile.open(tmp_path / "runs.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    assert json.loads(next((tmp_path / "sweep").glob("*/results.json")).read_text())["config"]["logger"] != "csv"
    assert read_record(tmp_path / "sweep" / "1")["status"] == "interrupted"
    again = run_cli(*result.args[3:], "sweep.resume=true", "logger=csv")
    assert again.returncode == 0, again.stderr[-2000:]
    assert (again.stdout + again.stderr).count("completed before with the same config") == 3
    assert read_record(tmp_path / "sweep" / "1")["status"] == "completed"
    assert {p.parent.parent.name for p in (tmp_path / "sweep").rglob("*.ckpt")} == {"1"}  # job 1 alone trained

    # a changed grid: jobs 2 and 3 (now n_heads=4) refuse the directories of the n_heads=2 runs, which keep their
    # records, and the sweep says that they did not complete
    changed = run_cli(*[a.replace("n_heads=1,2", "n_heads=1,4") for a in result.args[3:]], "sweep.resume=true")
    assert changed.returncode == 1, changed.stderr[-2000:]
    assert "2 of 4 jobs did not complete" in changed.stderr
    assert "not completed: 2 jobs in sweep (2-3) (refused: <its directory> holds another run's" in changed.stderr
    heads = [read_record(tmp_path / "sweep" / job)["config"]["model.attention.n_heads"] for job in "0123"]
    assert heads == [1, 1, 2, 2]
    assert not (tmp_path / "sweep" / ".refused").exists()


def test_an_archive_holds_the_runs_records_and_compares_as_its_sweep_did(sweep, capsys):
    root, _ = sweep
    write_run(root / "failed", 8, "dot", 0, 0.0, status="failed")
    (root / "1" / "heads.json").write_text(json.dumps({"rows": [{"layer": 0, "head": 0, "entropy": 0.5}]}))
    (root / "1" / ".hydra").mkdir()
    (root / "1" / ".hydra" / "config.yaml").write_text("seed: 1\n")
    (root / "1" / "checkpoints").mkdir()
    (root / "1" / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    metrics = ["--metric", "test/acc", "--metric", "heads/entropy"]
    main([str(root), *metrics, "--archive", str(root.parent / "a.tar.xz")])
    assert "archived 13 runs' records" in capsys.readouterr().err
    with tarfile.open(root.parent / "a.tar.xz") as tar:
        names = set(tar.getnames())
    assert {"sweep/1/results.json", "sweep/1/heads.json", "sweep/1/.hydra/config.yaml"} <= names
    assert "sweep/failed/results.json" in names and not any(n.endswith(".ckpt") or n.endswith(".png") for n in names)

    main([str(root.parent / "a.tar.xz"), *metrics, "--out", str(root.parent)])
    assert f"left out {root.parent / 'a.tar.xz'}:sweep/failed: failed" in capsys.readouterr().err
    from_sweep, from_archive = (list(csv.DictReader((d / "compare.csv").open())) for d in (root, root.parent))
    assert from_archive == from_sweep
    assert any(r["heads/entropy_mean"] for r in from_archive)


def test_archive_refuses_what_it_cannot_archive(sweep, tmp_path):
    root, _ = sweep
    main([str(root), "--archive", str(tmp_path / "a.tar.xz")])
    with pytest.raises(SystemExit) as refused:
        main([str(tmp_path / "a.tar.xz"), "--archive", str(tmp_path / "b.tar.xz")])
    assert refused.value.code == 2 and not (tmp_path / "b.tar.xz").exists()


def test_an_archive_holding_a_path_twice_is_reported_by_check_and_rebuilt_by_update(sweep, tmp_path, capsys,
                                                                                  monkeypatch):  # fmt: skip
    """Two sweeps of one root name archived before roots got names of their own: sweep/0/results.json twice, so
    `tar -x` keeps one and a continued sweep loses runs. --check says so; --update rebuilds it (sweep, sweep-2),
    after which tar -x holds every run and the table is the same."""
    from headlab.cli.compare import main as compare_main
    from headlab.stats import archive

    root, _ = sweep
    defective = tmp_path / "old.tar.xz"
    with tarfile.open(defective, "w:xz") as tar:  # as the older writer did: both roots named "sweep"
        for copy in range(2):
            for run in sorted(root.iterdir()):
                tar.add(run / "results.json", arcname=f"sweep/{run.name}/results.json")
            if copy == 0:
                for run in sorted(root.iterdir()):  # the second copy: other accuracies, one of each run
                    record = json.loads((run / "results.json").read_text())
                    record["metrics"]["test/acc"] -= 0.1
                    (run / "results.json").write_text(json.dumps(record))
    assert len(archive.duplicates(defective)) == 12
    monkeypatch.chdir(tmp_path)
    compare_main(["old.tar.xz", "--metric", "test/acc", "--out", "table"])
    capsys.readouterr()
    from headlab.compare.check import check

    assert check([Path("table")]) == 1
    assert "old.tar.xz (12 members twice): each copy needs a root of its own" in capsys.readouterr().out
    assert check([Path("table")], update=True) == 0
    assert archive.duplicates(defective) == [] and "rebuilt old.tar.xz" in capsys.readouterr().out
    with tarfile.open(defective) as tar:
        names = tar.getnames()
    assert len(names) == 24 and "sweep-2/0/results.json" in names
    assert check([Path("table")]) == 0


def test_archives_of_roots_of_one_name_hold_every_run_once_for_tar(tmp_path):
    from headlab.stats import archive

    for where in ("one/sweep", "two/sweep"):
        (tmp_path / where / "0").mkdir(parents=True)
        (tmp_path / where / "0" / "results.json").write_text(json.dumps({"where": where}))
    assert archive.write(tmp_path / "x.tar.xz", [tmp_path / "one" / "sweep", tmp_path / "two" / "sweep"]) == 2
    assert archive.duplicates(tmp_path / "x.tar.xz") == []
    with tarfile.open(tmp_path / "x.tar.xz") as tar:
        tar.extractall(tmp_path / "out", filter="data")
    assert sorted(json.loads(p.read_text())["where"] for p in (tmp_path / "out").rglob("results.json")) == [
        "one/sweep",
        "two/sweep",
    ]


def test_the_same_runs_given_again_are_counted_once(sweep, tmp_path, capsys):
    """A directory given three times, a directory and one inside it, a hard-linked copy, an archive twice: each
    run once (n 3 per group, as from the sweep alone), and a line saying which were skipped."""
    import os

    root, _ = sweep
    linked = tmp_path / "linked"
    for results in root.rglob("results.json"):
        (linked / results.parent.name).mkdir(parents=True)
        os.link(results, linked / results.parent.name / "results.json")
    main([str(root), "--archive", str(tmp_path / "a.tar.xz"), "--out", str(tmp_path / "once")])
    for sources in ([root, root, root], [root, root / "3"], [root, linked], [tmp_path / "a.tar.xz"] * 2):
        capsys.readouterr()
        main([*map(str, sources), "--out", str(tmp_path / "again"), "--no-plots"])
        assert [r["runs"] for r in csv.DictReader((tmp_path / "again" / "compare.csv").open())] == ["3"] * 4, sources
        said = capsys.readouterr().err
        assert "counted once" in said or "the same archive as" in said


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--baseline", "model.attention.n_heads=1", "--effect", "-1"], "--effect takes a difference > 0"),
        (["--baseline", "model.attention.n_heads=1", "--effect", "nan"], "--effect takes a difference > 0"),
        (["--solved", "test/acc>=nan"], "--solved takes a finite threshold"),
        (["--select", "seed"], "--select takes a setting chosen per arm (optim.lr, say), not seed"),
    ],
)
def test_values_that_mean_nothing_are_refused_in_one_line(sweep, capsys, options, says):
    root, _ = sweep
    with pytest.raises(SystemExit) as refused:
        main([str(root), *options])
    assert refused.value.code == 2 and says in capsys.readouterr().err


def test_record_contents_stay_text_in_compare_md_results_md_and_the_csv(tmp_path):
    """A failed record's error with a line break, a block's end marker and a tag; a config value with a cell
    separator and a spreadsheet formula: shown as text, the block still updatable, no formula in the CSV."""
    for seed in range(2):
        write_run(tmp_path / "sweep" / f"a{seed}", 1, '=HYPERLINK("http://x")|<b>', seed, 0.5)
        write_run(tmp_path / "sweep" / f"b{seed}", 1, "dot", seed, 0.6)
    evil = "boom\n<!-- /headlab-compare: x -->\n<img src=x onerror=alert(1)> | cell"
    write_run(tmp_path / "sweep" / "f", 1, "dot", 0, 0.0, status="failed")
    record = json.loads((tmp_path / "sweep" / "f" / "results.json").read_text())
    (tmp_path / "sweep" / "f" / "results.json").write_text(json.dumps({**record, "error": evil}))
    results = tmp_path / "RESULTS.md"
    results.write_text("# R\n<!-- headlab-compare: x -->\nold\n<!-- /headlab-compare: x -->\ntail\n")
    for _ in range(2):  # written, then updated again: the block is still one block
        main([str(tmp_path / "sweep"), "--metric", "test/acc", "--no-plots", "--into", str(results), "--block", "x"])
    text = results.read_text()
    assert text.count("<!-- /headlab-compare: x -->") == 1 and text.endswith("tail\n") and "<img" not in text
    assert "&lt;img src=x onerror=alert(1)&gt; \\| cell" in text
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == 3 and len({line.replace("\\|", "").count("|") for line in table}) == 1
    assert '| =HYPERLINK("http://x")\\|&lt;b&gt; |' in text
    cells = list(csv.reader((tmp_path / "sweep" / "compare.csv").open()))
    assert [c[0] for c in cells[1:]] == ['\'=HYPERLINK("http://x")|<b>', "dot"]


def test_a_full_disk_leaves_results_md_and_the_table_as_they_were(sweep, small_disk, capsys):
    root, _ = sweep
    results = small_disk / "RESULTS.md"
    document = "# R\n<!-- headlab-compare: x -->\nold\n<!-- /headlab-compare: x -->\n" + "tail\n" * 20_000
    results.write_text(document)
    out = small_disk / "table"
    main([str(root), "--out", str(out), "--no-plots"])
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    (small_disk / "filler").write_bytes(b"\0" * (free - 16 * 1024))  # room for a table, not for RESULTS.md again
    with pytest.raises(SystemExit) as stopped:
        main(
            [str(root), "--out", str(out), "--no-plots", "--into", str(results), "--block", "x", "--metric", "test/acc"]
        )
    assert "no space left on the device" in str(stopped.value.code) and "half written" in str(stopped.value.code)
    assert results.read_text() == document  # its tail is there
    assert not [p.name for p in small_disk.rglob("*.tmp")]


def test_ctrl_c_while_archiving_leaves_no_partial_archive(sweep, tmp_path, monkeypatch):
    root, _ = sweep
    added = []

    def add(self, *args, **kwargs):
        added.append(args)
        if len(added) == 3:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    original = tarfile.TarFile.add
    monkeypatch.setattr(tarfile.TarFile, "add", add)
    with pytest.raises(SystemExit, match="interrupted: nothing written is half written"):
        main([str(root), "--no-plots", "--archive", str(tmp_path / "a.tar.xz")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep"]


def test_pruning_curves_are_averaged_over_seeds_beside_their_baselines(tmp_path):
    curves = [[0.9, 0.8, 0.5], [0.7, 0.6, 0.3], [0.8, 0.75, 0.2]]
    random = [[0.9, 0.5, 0.4], [0.7, 0.4, 0.3], [0.8, 0.3, 0.2]]

    def points(curve):
        return [{"heads_pruned": i, "fraction_pruned": i / 2, "metric": m} for i, m in enumerate(curve)]

    for seed, (curve, other) in enumerate(zip(curves, random, strict=True)):
        write_run(tmp_path / str(seed), 4, "dot", seed, 0.9)
        heads = {"pruning_curve": points(curve), "pruning_baselines": {"random": points(other)}, "pruning_split": "val"}
        (tmp_path / str(seed) / "heads.json").write_text(json.dumps(heads))
    main([str(tmp_path), "--pruning"])
    text = (tmp_path / "compare.md").read_text()
    assert "| heads pruned | fraction | importance order | random order | importance - random |" in text
    low, high = inference.bootstrap_interval([0.8, 0.6, 0.75])
    r_low, r_high = inference.bootstrap_interval([0.5, 0.4, 0.3])
    p = stats.ttest_rel([0.8, 0.6, 0.75], [0.5, 0.4, 0.3]).pvalue
    expected = f"| 1 | 0.50 | 0.7167 [{low:.4f}, {high:.4f}] | 0.4000 [{r_low:.4f}, {r_high:.4f}] | +0.3167 p={p:.3g} |"
    assert expected in text and "val accuracy" in text
    # compare_pruning.csv (what the findings table reads): the paired difference with its t interval, written out
    d = [0.8 - 0.5, 0.6 - 0.4, 0.75 - 0.3]
    half = stats.t.ppf(0.975, 2) * statistics.stdev(d) / math.sqrt(3)
    with open(tmp_path / "compare_pruning.csv", newline="") as f:
        rows = {(r["heads_pruned"], r["metric"]): r for r in csv.DictReader(f)}
    step = rows[("1", "importance - random")]
    assert float(step["effect"]) == pytest.approx(statistics.mean(d))
    assert float(step["low"]) == pytest.approx(statistics.mean(d) - half)
    assert float(step["high"]) == pytest.approx(statistics.mean(d) + half)
    assert float(step["p_value"]) == pytest.approx(p) and step["verdict"] in ("significant", "not significant")
    assert rows[("0", "importance - random")]["verdict"] == ""  # the same accuracy: no test made


def test_head_statistics_become_metrics_averaged_over_heads(tmp_path):
    for seed, entropies in enumerate([[1.0, 2.0, 3.0], [2.0, 2.0, 5.0]]):
        write_run(tmp_path / str(seed), 3, "dot", seed, 0.9)
        rows = [{"layer": 0, "head": h, "entropy": e, "score_std": 2 * e} for h, e in enumerate(entropies)]
        (tmp_path / str(seed) / "heads.json").write_text(json.dumps({"rows": rows}))
    write_run(tmp_path / "3", 3, "dot", 3, 0.8)
    runs = load_dirs([tmp_path])
    keys, rows = compare(runs.completed, Design(["test/acc", "heads/entropy", "heads/score_std"]))
    assert rows[0]["test/acc"]["n"] == 3 and rows[0]["heads/entropy"]["values"] == [2.0, 3.0]
    assert rows[0]["heads/score_std"]["mean"] == pytest.approx(5.0)


def test_head_similarity_is_a_metric_of_each_run_comparable_per_arm(tmp_path):
    """heads/similarity: 1 - mean JS / ln 2 over the pairs of distinct heads of heads.json's divergence matrix."""
    ln2 = np.log(2)
    matrices = {1: [[0, ln2, 0.5 * ln2], [ln2, 0, 0], [0.5 * ln2, 0, 0]], 4: [[0, 0.1], [0.1, 0]]}
    for seed, (heads, divergence) in enumerate(matrices.items()):
        write_run(tmp_path / str(seed), heads, "dot", seed, 0.9)
        rows = [{"layer": 0, "head": h, "entropy": 1.0} for h in range(len(divergence))]
        (tmp_path / str(seed) / "heads.json").write_text(json.dumps({"rows": rows, "similarity": divergence}))
    main([str(tmp_path), "--metric", "heads/similarity", "--no-plots"])
    table = list(csv.DictReader((tmp_path / "compare.csv").open()))
    assert [float(r["heads/similarity_mean"]) for r in table] == pytest.approx([1 - 0.5, 1 - 0.1 / ln2])


def test_wandb_summaries_with_max_dicts_become_numbers(monkeypatch):
    """What W&B's API returns for a run whose val/acc was defined with summary="max" (headlab's loggers do)."""
    import wandb

    from headlab.compare.sources import load_wandb

    class Run:
        summary = {"val/acc": {"max": 0.75}, "test/acc": 0.7, "heads/table": {"_type": "table-file"}, "_step": 9}
        config = {"model.attention.n_heads": 4, "seed": 1}
        url, state = "https://wandb.example/run", "finished"

    monkeypatch.setattr(wandb, "Api", lambda timeout: type("Api", (), {"runs": lambda self, path, filters: [Run()]})())
    runs = load_wandb("entity/project", None)
    assert runs.completed[0]["metrics"] == {"val/acc_best": 0.75, "val/acc": 0.75, "test/acc": 0.7, "_step": 9}


def test_an_experiments_pre_stated_analysis_comes_from_its_file_and_its_table_is_spliced(tmp_path, capsys):
    """Runs of heads_fixed_width get the analysis experiments/heads_fixed_width.yaml states (per-arm learning rate,
    baseline h = 4, solve rates); what a record says it was is data, and options or paths never come from it."""
    crafted = ["--archive", str(tmp_path / "victim.tar.xz"), "--out", str(tmp_path / "elsewhere")]
    for i, (heads, lr, seed) in enumerate((h, lr, k) for h in (1, 4) for lr in (1e-3, 3e-3) for k in range(3)):
        acc = 0.95 if heads == 4 else 0.1 + 0.3 * (seed == 0)
        write_run(tmp_path / "sweep" / str(i), heads, "dot", seed, acc, **{"optim.lr": lr})
        record_file = tmp_path / "sweep" / str(i) / "results.json"
        record = json.loads(record_file.read_text())
        record["config"].update(experiment="heads_fixed_width", compare=crafted)
        record_file.write_text(json.dumps(record))
    path = tmp_path / "sweep"
    results = tmp_path / "RESULTS.md"
    results.write_text(
        "# Results\n\n<!-- headlab-compare: heads_fixed_width -->\nold table\n<!-- /headlab-compare: "
        "heads_fixed_width -->\nReading.\n"
    )
    main([str(path), "--into", str(results)])
    err = capsys.readouterr().err
    assert "the runs record another analysis than experiments/heads_fixed_width.yaml states now" in err
    assert not (tmp_path / "victim.tar.xz").exists() and not (tmp_path / "elsewhere").exists()
    table = (path / "compare.md").read_text()
    assert "--select optim.lr --baseline model.attention.n_heads=4 --solved 'test/acc>=0.9'`" in table
    assert "(baseline)" in table and "optim.lr (selected on val/acc_best)" in table
    text = results.read_text()
    assert "old table" not in text and blocks.brief(table, results, path) in text
    assert text.endswith("heads_fixed_width -->\nReading.\n")
    main([str(path), "--metric", "test/acc"])  # options of its own: the stated analysis is not added
    assert "(baseline)" not in (path / "compare.md").read_text()
    results.write_text("no block\n")
    with pytest.raises(SystemExit, match="needs one block from <!-- headlab-compare: heads_fixed_width -->"):
        main([str(path), "--into", str(results)])


def test_learning_curves_count_the_runs_still_improving_and_are_plotted(tmp_path):
    curves = {0: [0.5, 0.7, 0.9], 1: [0.5, 0.9, 0.903], 2: [0.2, 0.6, 0.4]}  # improving; within the margin; not
    for seed, values in curves.items():
        write_run(tmp_path / str(seed), 4, "dot", seed, 0.9)
        record = json.loads((tmp_path / str(seed) / "results.json").read_text())
        record["curve"] = [{"epoch": e, "step": 10 * (e + 1), "val/acc": v} for e, v in enumerate(values)]
        (tmp_path / str(seed) / "results.json").write_text(json.dumps(record))
    write_run(tmp_path / "3", 4, "dot", 3, 0.9)  # a CSV logger's metrics.csv, for runs that record no curve
    rows = ["epoch,step,train/loss_step,val/acc,val/loss", "0,5,2.0,,", "0,9,,0.3,1.9", "1,19,,0.8,0.5"]
    (tmp_path / "3" / "metrics.csv").write_text("\n".join(rows) + "\n")
    main([str(tmp_path)])
    with (tmp_path / "compare.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert (row["improving_k"], row["improving_n"]) == ("2", "4")
    assert (tmp_path / "compare_curves.png").stat().st_size > 10_000
    assert "improving at end (last val/acc best by > 0.005)" in (tmp_path / "compare.md").read_text()


def test_confirm_applies_the_confirmation_the_experiment_file_states_and_every_stated_analysis_parses(tmp_path):
    from headlab.compare import analysis

    for i, (heads, lr, seed) in enumerate((h, lr, k) for h in (1, 4) for lr in (1e-3, 3e-3) for k in range(10, 13)):
        acc = 0.9 - 0.1 * (heads == 1)
        run = tmp_path / "sweep" / str(i)
        write_run(run, heads, "dot", seed, acc, experiment="heads_fixed_width", **{"optim.lr": lr})
        record = read_record(run)  # a learning curve, which the stated --reach reads
        curve = [{"epoch": e, "step": 100 * (e + 1), "val/acc": acc * (e + 1) / 2} for e in range(2)]
        (run / "results.json").write_text(json.dumps({**record, "curve": curve}))
    results = tmp_path / "RESULTS.md"
    names = ("heads_fixed_width", "heads_fixed_width/confirm")
    results.write_text(
        "".join(f"<!-- headlab-compare: {n} -->\n{n} table\n<!-- /headlab-compare: {n} -->\n" for n in names)
    )
    main([str(tmp_path / "sweep"), "--confirm", "--into", str(results)])
    table = (tmp_path / "sweep" / "compare.md").read_text()
    assert "--reach 'val/acc>=0.9' --power" in table and "steps to val/acc>=0.9 (Kaplan-Meier median" in table
    text = results.read_text()  # the confirmation in its own block; the first reading's stays
    assert "heads_fixed_width table" in text and "heads_fixed_width/confirm table" not in text
    assert text.index(blocks.brief(table, results, tmp_path / "sweep")) > text.index(
        "<!-- headlab-compare: heads_fixed_width/confirm -->"
    )
    for record in (tmp_path / "sweep").glob("*/results.json"):
        stored = json.loads(record.read_text())
        stored["config"]["experiment"] = "heads_vs_depth"  # a file that states no confirmation
        record.write_text(json.dumps(stored))
    with pytest.raises(SystemExit, match="experiments/heads_vs_depth.yaml states no confirmation analysis"):
        main([str(tmp_path / "sweep"), "--confirm"])
    results = (ROOT / "experiments" / "RESULTS.md").read_text()
    for experiment in (ROOT / "experiments").glob("*.yaml"):
        stated = yaml.safe_load(experiment.read_text())
        for key in ("compare", "confirm"):
            analysis.analysis(analysis.options(stated.get(key) or {}, key))  # analysis options only, each valid
        if stated.get("confirm"):  # make confirmations puts its table there
            assert results.count(f"<!-- headlab-compare: {experiment.stem}/confirm -->") == 1, experiment.stem


def test_importance_order_doing_worse_than_a_baseline_is_stated_as_a_finding(tmp_path):
    """Ten runs whose importance order keeps less accuracy than reverse order at the middle step and more than it at
    the last: the reading names both, at Holm p over every step and baseline written out here."""

    def points(curve):
        return [{"heads_pruned": i, "fraction_pruned": i / 4, "metric": m} for i, m in enumerate(curve)]

    importance, reverse = [], []
    for seed in range(10):
        noise = 0.002 * (seed % 3)
        importance.append([0.9, 0.6 + noise, 0.3 + noise])
        reverse.append([0.9, 0.7 + noise + 0.001 * seed, 0.1 + 0.001 * seed])
        write_run(tmp_path / str(seed), 4, "dot", seed, 0.9)
        heads = {"pruning_curve": points(importance[-1]), "pruning_baselines": {"reverse": points(reverse[-1])}}
        (tmp_path / str(seed) / "heads.json").write_text(json.dumps({**heads, "pruning_split": "val"}))
    main([str(tmp_path), "--pruning"])
    text = (tmp_path / "compare.md").read_text()
    p = [stats.ttest_rel([c[k] for c in importance], [c[k] for c in reverse]).pvalue for k in (1, 2)]
    holm = sorted(p)[0] * 2, max(sorted(p)[0] * 2, sorted(p)[1])  # both steps below 0.05: both named
    assert max(holm) < 0.05
    delta = [sum(i[k] - r[k] for i, r in zip(importance, reverse, strict=True)) / 10 for k in (1, 2)]
    assert (
        f"Reading (Holm over the differences above, p < 0.05): importance order is better than reverse order at "
        f"0.50 ({delta[1]:+.4f}); importance order is worse than reverse order at 0.25 ({delta[0]:+.4f}): where it "
        "is worse, the importance ranking misorders these heads." in text
    )


@pytest.mark.parametrize("seeds, warned", [(2, True), (4, True), (5, False)])
def test_arms_of_too_few_seeds_are_warned_of_with_how_far_their_spread_may_be_off(tmp_path, seeds, warned):
    for heads, seed in itertools.product((1, 4), range(seeds)):
        write_run(tmp_path / f"{heads}-{seed}", heads, "dot", seed, 0.8 + 0.01 * seed + 0.05 * (heads == 4))
    main([str(tmp_path), "--metric", "test/acc"])
    text = (tmp_path / "compare.md").read_text()
    if not warned:
        assert "Few replicates" not in text
        return
    df = seeds - 1  # the chi-square interval of a standard deviation, written out
    low, high = math.sqrt(df / stats.chi2.ppf(0.975, df)), math.sqrt(df / stats.chi2.ppf(0.025, df))
    assert (
        f"**Few replicates**: 2 arm(s) have fewer than 5 seeds of a metric: model.attention.n_heads=1 ({seeds}); "
        f"model.attention.n_heads=4 ({seeds}). A standard deviation from {seeds} values may be {low:.2f} to "
        f"{high:.1f} times the true one (95%)" in text
    )


@pytest.mark.e2e
def test_runs_that_differ_only_in_how_often_heads_are_logged_train_alike_and_are_one_arm(run_cli, tmp_path):
    """The logging cadence (callbacks.attention.every_n_val_epochs, figures_every_n_val_epochs) runs the probe in
    eval mode on its own generator: the same training, so compare reads it as no arm (LOGGING_CADENCE)."""
    for every in (1, 5):
        done = run_cli(
            *TINY, "trainer.max_epochs=3", "model.dropout=0.2", "logger=csv", "callbacks.attention.importance=false",
            f"callbacks.attention.every_n_val_epochs={every}", f"hydra.run.dir=every{every}",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    one, five = (read_record(tmp_path / f"every{n}") for n in (1, 5))
    assert one["curve"] == five["curve"] and one["metrics"]["test/acc"] == five["metrics"]["test/acc"]
    assert one["config"]["callbacks.attention.every_n_val_epochs"] == 1
    header, rows = compare(load_dirs([tmp_path / "every1", tmp_path / "every5"]).completed, Design(["test/acc"]))
    assert len(rows) == 1 and rows[0]["runs"] == 2


def test_a_contrast_with_a_run_still_improving_in_either_arm_reads_at_this_budget(tmp_path):
    """The budget's reading: where a run of the arm or of its baseline improved val/acc at its last validation, the
    contrast's verdict (of every metric and the solve rate) says "at this budget", in compare.md and compare.csv;
    an arm whose runs and baseline's all converged reads without it."""
    plateau, rising = [0.5, 0.9, 0.9], [0.5, 0.7, 0.9]
    arms = {1: [plateau] * 3, 2: [plateau, plateau, rising], 4: [plateau] * 3}  # 4: the baseline, converged
    accs = {1: [0.60, 0.62, 0.64], 2: [0.80, 0.81, 0.83], 4: [0.90, 0.91, 0.92]}
    for heads, curves in arms.items():
        for seed, values in enumerate(curves):
            path = tmp_path / f"{heads}-{seed}"
            write_run(path, heads, "dot", seed, accs[heads][seed])
            record = json.loads((path / "results.json").read_text())
            record["curve"] = [{"epoch": e, "step": 10 * (e + 1), "val/acc": v} for e, v in enumerate(values)]
            (path / "results.json").write_text(json.dumps(record))
    main([str(tmp_path), "--baseline", "model.attention.n_heads=4", "--solved", "test/acc>=0.7", "--no-plots"])
    with (tmp_path / "compare.csv").open() as f:
        rows = {r["model.attention.n_heads"]: r for r in csv.DictReader(f)}
    assert rows["2"]["test/acc_budget"] == rows["2"]["solved_budget"] == "at this budget"
    assert rows["1"]["test/acc_budget"] == rows["4"]["test/acc_budget"] == ""
    table = (tmp_path / "compare.md").read_text()
    two = next(line for line in table.splitlines() if line.startswith("| 2 |"))
    one = next(line for line in table.splitlines() if line.startswith("| 1 |"))
    assert "significant at this budget" in two and "at this budget" not in one
    assert '"at this budget": a run of either arm was still improving at its last validation' in table
