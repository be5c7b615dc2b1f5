"""The findings table of a results file: each claim an experiment file states, read from the tables (never typed),
refreshed by --into, checked and rewritten by --check [--update]; the verdict legend stated once there."""

import csv
import math
import statistics
from pathlib import Path

import pytest
from scipy import stats
from test_compare import write_run

from headlab.cli.compare import main
from headlab.compare import findings
from headlab.stats.contrasts import CompareError

CLAIMS = """compare:
  baseline: model.attention.n_heads=4
  metric: [test/acc]
claims:
  - {claim: one head is worse, arm: model.attention.n_heads=1, metric: test/acc, expect: lower}
  - {claim: one head matches, arm: model.attention.n_heads=1, metric: test/acc, expect: same}
"""
ACC = {1: [0.625, 0.635, 0.645], 4: [0.70, 0.71, 0.72]}  # test/acc of each seed
EMPTY_RESULTS = (
    f"# Results\n{findings.START}\n{findings.END}\n<!-- headlab-compare: demo -->\n<!-- /headlab-compare: demo -->\n"
)


def welch_by_hand(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """The difference of means and its 95% Welch interval, written out."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    d = statistics.mean(a) - statistics.mean(b)
    half = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    return d, d - half, d + half


@pytest.fixture
def results(tmp_path, monkeypatch):
    """An experiment file with two claims, its runs read into RESULTS.md (with a findings block) and archived."""
    monkeypatch.chdir(tmp_path)
    Path("demo.yaml").write_text(CLAIMS)
    for i, (heads, seed) in enumerate((h, s) for h in (1, 4) for s in range(3)):
        write_run(Path("sweep") / str(i), heads, "dot", seed, ACC[heads][seed], experiment="demo")
    Path("RESULTS.md").write_text(
        f"# Results\n{findings.START}\n{findings.END}\n"
        "<!-- headlab-compare: demo -->\n<!-- /headlab-compare: demo -->\n"
    )
    options = ["--baseline", "model.attention.n_heads=4", "--metric", "test/acc"]
    main(["sweep", *options, "--out", "results/demo", "--into", "RESULTS.md", "--archive", "results/demo/runs.tar.xz"])
    return Path("RESULTS.md")


def _row(text: str, claim: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith("| [demo]") and f"| {claim} |" in line)
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_each_claim_reads_its_contrast_from_the_table_with_its_interval(results):
    d, low, high = welch_by_hand(ACC[1], ACC[4])
    row = _row(results.read_text(), "one head is worse")
    assert row[0] == "[demo](results/demo/compare.md)" and row[2] == "n_heads=1; test/acc"
    assert row[3] == f"{d:+.3f} [{low:+.3f}, {high:+.3f}]" == "-0.075 [-0.098, -0.052]"
    p = stats.ttest_ind(ACC[1], ACC[4], equal_var=False).pvalue  # one contrast: Holm leaves it as it is
    assert row[4] == f"{p:.2g}"
    assert row[5] == "**supported**" and row[6] == "not run"
    assert _row(results.read_text(), "one head matches")[5] == "**contradicted**"
    # the compare.csv it is read from carries the same interval
    with open("results/demo/compare.csv", newline="") as f:
        arm = next(r for r in csv.DictReader(f) if r["model.attention.n_heads"] == "1")
    assert float(arm["test/acc_effect_low"]) == pytest.approx(low) and arm["test/acc_verdict"] == "significant"


def test_a_confirmation_is_read_beside_the_first_reading(results):
    for i, seed in enumerate(range(10, 13)):  # new seeds where one head is as good as four
        for heads in (1, 4):
            write_run(Path("confirm") / f"{heads}-{i}", heads, "dot", seed, 0.7 + 0.001 * i, experiment="demo")
    Path("RESULTS.md").write_text(
        Path("RESULTS.md").read_text()
        + "<!-- headlab-compare: demo/confirm -->\n<!-- /headlab-compare: demo/confirm -->\n"
    )
    options = ["--baseline", "model.attention.n_heads=4", "--metric", "test/acc", "--effect", "0.02"]
    main(["confirm", *options, "--out", "results/demo/confirm", "--into", "RESULTS.md", "--block", "demo/confirm"])
    text = results.read_text()
    assert _row(text, "one head is worse")[6] == "no difference found"
    assert _row(text, "one head matches")[6] == "**supported**"


def test_the_verdict_legend_is_stated_once_and_the_blocks_leave_it_out(results):
    text = results.read_text()
    table = Path("results/demo/compare.md").read_text()
    assert "\nVerdicts: " in table  # compare.md on its own keeps its legend
    assert text.count("\nVerdicts: ") == 1 and text.index("Verdicts: ") < text.index(findings.END)
    block = text.split("<!-- headlab-compare: demo -->")[1]
    assert "Verdicts: " not in block and "| 1 | 3 |" in block


def test_check_finds_a_findings_table_edited_by_hand_and_update_rewrites_it(results, capsys):
    with pytest.raises(SystemExit) as done:
        main(["--check", "results"])
    said = capsys.readouterr().out
    assert done.value.code == 0 and "same: RESULTS.md's findings table" in said, said
    generated = results.read_text()
    results.write_text(generated.replace("| **supported** |", "| **replicated** |", 1))
    with pytest.raises(SystemExit) as done:
        main(["--check", "results"])
    said = capsys.readouterr().out
    assert done.value.code == 1 and "differs: RESULTS.md's findings table" in said and "+| [demo]" in said
    with pytest.raises(SystemExit) as done:
        main(["--check", "--update", "results"])
    assert done.value.code == 0 and "updated: RESULTS.md's findings table" in capsys.readouterr().out
    assert results.read_text() == generated


def test_a_table_written_before_the_contrasts_interval_reads_as_welch_from_its_summaries(results):
    path = Path("results/demo/compare.csv")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    kept = [k for k in rows[0] if not k.endswith(("_effect", "_effect_low", "_effect_high", "_verdict"))]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, kept, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    claim = findings.claims(Path("."))[0]
    found = findings.read(claim, Path("results/demo"))
    d, low, high = welch_by_hand(ACC[1], ACC[4])
    assert (found["effect"], found["low"], found["high"]) == pytest.approx((d, low, high))
    assert found["verdict"] == "significant"


def test_a_claim_with_another_direction_names_its_file_and_the_directions(tmp_path):
    (tmp_path / "bad.yaml").write_text(
        "claims:\n  - {claim: x, arm: model.attention.n_heads=1, metric: test/acc, expect: worse}\n"
    )
    with pytest.raises(CompareError, match=r"bad.yaml's claims\[0\]: expect 'worse' is not one of lower, higher"):
        findings.claims(tmp_path)
    (tmp_path / "bad.yaml").write_text("claims:\n  - {claim: x, metric: test/acc}\n")
    with pytest.raises(CompareError, match=r"bad.yaml's claims\[0\] needs arm, expect"):
        findings.claims(tmp_path)


def test_an_arm_is_shown_by_its_keys_last_part_and_its_whole_value():
    claim = findings.Claim(
        "demo", "R-Drop helps", ["optim.rdrop=3.0", "model.attention.d_k=64"], "test/acc", "higher", "demo"
    )
    assert findings._arm(claim) == "rdrop=3.0, d_k=64; test/acc"


@pytest.mark.parametrize(
    "column, value, said",
    [
        ("test/acc_verdict", "</td><script>alert(1)</script>|x\n## injected", "verdict '</td><script>"),
        ("test/acc_effect", "nan", "effect nan"),
        ("test/acc_p_holm", "-3", "Holm p -3.0"),
        ("test/acc_effect_low", "inf", "interval [inf, "),
        ("test/acc_effect", "a lot", "cannot be read (could not convert string to float: 'a lot')"),
    ],
)  # fmt: skip
def test_a_received_table_whose_cells_compare_would_not_write_is_refused_and_nothing_is_written(
    results, column, value, said
):
    """A verdict cell with HTML and a heading, an effect of nan beside "significant", a p-value or an interval out
    of bounds: the findings block is not refreshed from it (RESULTS.md as it was), one CompareError naming the file."""
    before = results.read_text()
    table = Path("results/demo/compare.csv")
    with table.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        if row["model.attention.n_heads"] == "1":
            row[column] = value
    with table.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(CompareError, match="results/demo/compare.csv") as refused:
        findings.refresh(results)
    assert said in str(refused.value)
    assert results.read_text() == before and "<script>" not in results.read_text()


def test_a_pruning_claim_reads_its_step_and_a_claim_stated_after_the_runs_says_so(tmp_path, monkeypatch):
    """A claim on a pruning curve (pruning: true, its arm a step) reads compare_pruning.csv: the paired difference
    of the two orders at that step, its t interval and Holm p; a claim marked stated_after_runs is shown as such."""
    import json

    monkeypatch.chdir(tmp_path)
    Path("demo.yaml").write_text(
        "compare:\n  pruning: true\nclaims:\n"
        "  - {claim: importance beats random, arm: heads_pruned=1, metric: importance - random, expect: higher, "
        "pruning: true, stated_after_runs: true}\n"
    )
    importance, random = [0.8, 0.6, 0.75], [0.5, 0.4, 0.3]
    for seed in range(3):
        write_run(Path("sweep") / str(seed), 4, "dot", seed, 0.9, experiment="demo")
        curves = {
            "pruning_curve": [{"heads_pruned": 1, "fraction_pruned": 0.25, "metric": importance[seed]}],
            "pruning_baselines": {"random": [{"heads_pruned": 1, "fraction_pruned": 0.25, "metric": random[seed]}]},
        }
        Path("sweep", str(seed), "heads.json").write_text(json.dumps(curves))
    Path("RESULTS.md").write_text(EMPTY_RESULTS)
    main(["sweep", "--pruning", "--out", "results/demo", "--into", "RESULTS.md"])
    d = [a - b for a, b in zip(importance, random, strict=True)]
    half = stats.t.ppf(0.975, 2) * statistics.stdev(d) / math.sqrt(3)
    row = _row(Path("RESULTS.md").read_text(), "importance beats random *(stated after its runs)*")
    mean = statistics.mean(d)
    assert row[2] == "heads_pruned=1; importance - random"
    assert row[3] == f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"
    assert row[4] == f"{stats.ttest_rel(importance, random).pvalue:.2g}"  # one step, one order: Holm leaves it
    assert row[5] == "**supported**"
    assert "stated after its runs* was written down after its table was read" in Path("RESULTS.md").read_text()


def test_a_claim_whose_arm_had_a_run_still_improving_reads_at_this_budget(tmp_path, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    Path("demo.yaml").write_text(CLAIMS)
    for i, (heads, seed) in enumerate((h, s) for h in (1, 4) for s in range(3)):
        path = Path("sweep") / str(i)
        write_run(path, heads, "dot", seed, ACC[heads][seed], experiment="demo")
        record = json.loads((path / "results.json").read_text())
        rising = heads == 1 and seed == 0  # one run of the arm still improving at its last validation
        values = [0.5, 0.6, 0.7] if rising else [0.5, 0.7, 0.7]
        record["curve"] = [{"epoch": e, "step": 10 * (e + 1), "val/acc": v} for e, v in enumerate(values)]
        (path / "results.json").write_text(json.dumps(record))
    Path("RESULTS.md").write_text(EMPTY_RESULTS)
    main(["sweep", "--baseline", "model.attention.n_heads=4", "--metric", "test/acc", "--out", "results/demo",
          "--into", "RESULTS.md"])  # fmt: skip
    assert _row(Path("RESULTS.md").read_text(), "one head is worse")[5] == "**supported** at this budget"


def test_a_setting_across_datasets_reads_its_worst_gap_and_the_target(tmp_path, monkeypatch):
    """A claim across datasets (across: true, expect: within) reads compare_across.csv: the setting's largest gap to
    a dataset's best (chosen on val/acc_best), its paired t interval, and the table's target on each dataset."""
    monkeypatch.chdir(tmp_path)
    Path("demo.yaml").write_text(
        "compare:\n  across: data\nclaims:\n"
        "  - {claim: lr 3e-3 transfers, arm: optim.lr=0.003, metric: test/acc, expect: within, across: true}\n"
        "  - {claim: lr 1e-3 transfers, arm: optim.lr=0.001, metric: test/acc, expect: within, across: true}\n"
    )
    acc = {  # (dataset, lr): test/acc of seeds 0-2; val/acc_best is 0.01 above, so each dataset's best is its higher
        ("a", 0.003): [0.80, 0.82, 0.81],
        ("a", 0.001): [0.70, 0.73, 0.71],
        ("b", 0.003): [0.599, 0.609, 0.6195],
        ("b", 0.001): [0.60, 0.61, 0.62],
    }
    for i, ((data, lr), seeds) in enumerate(acc.items()):
        for seed, value in enumerate(seeds):
            write_run(
                Path("sweep") / f"{i}-{seed}", 4, "dot", seed, value, experiment="demo", data=data, **{"optim.lr": lr}
            )
    Path("RESULTS.md").write_text(EMPTY_RESULTS)
    options = ["--across", "data", "--paired", "--metric", "val/acc_best", "--metric", "test/acc", "--effect", "0.01"]
    main(["sweep", *options, "--out", "results/demo", "--into", "RESULTS.md", "--no-plots"])
    text = Path("RESULTS.md").read_text()
    d = [best - worse for best, worse in zip(acc["a", 0.003], acc["a", 0.001], strict=True)]  # lr 1e-3's gap on a
    half = stats.t.ppf(0.975, 2) * statistics.stdev(d) / math.sqrt(3)
    row = _row(text, "lr 1e-3 transfers")
    assert row[2] == "lr=0.001 (across); test/acc"
    assert row[3] == f"{statistics.mean(d):+.3f} [{statistics.mean(d) - half:+.3f}, {statistics.mean(d) + half:+.3f}]"
    assert row[4] == "" and row[5] == "target missed on a"  # a gap of 0.097, above 0.01
    small = [best - worse for best, worse in zip(acc["b", 0.001], acc["b", 0.003], strict=True)]
    assert statistics.mean(small) + stats.t.ppf(0.975, 2) * statistics.stdev(small) / math.sqrt(3) <= 0.01
    assert _row(text, "lr 3e-3 transfers")[5] == "**supported**"  # the best on a, within 0.01 of b's: met on both
    Path("demo.yaml").write_text(
        Path("demo.yaml").read_text().replace("expect: within, across: true}\n", "expect: within}\n", 1)
    )
    with pytest.raises(CompareError, match="demo.yaml's claims\\[0\\]: expect within goes with across: true"):
        findings.claims(Path("."))


def test_a_claim_read_in_rounds_takes_its_arms_round_from_the_sweeps_sequential_json(tmp_path, monkeypatch):
    """rounds: true: the arm's round as the sweep read it (sequential.json, kept in compare_rounds.csv): Δ and its
    repeated interval at the look it stopped at, that look's p; significant, within the margin, or undecided at the
    last look (inconclusive with a margin) read as the legend says; the table's own test is not what is read."""
    import json

    monkeypatch.chdir(tmp_path)
    Path("demo.yaml").write_text(
        "claims:\n"
        "  - {claim: one head is worse, arm: model.attention.n_heads=1, metric: test/acc, expect: lower, "
        "rounds: true}\n"
        "  - {claim: two heads match, arm: model.attention.n_heads=2, metric: test/acc, expect: same, rounds: true}\n"
        "  - {claim: eight heads are better, arm: model.attention.n_heads=8, metric: test/acc, expect: higher, "
        "rounds: true}\n"
    )
    for i, (heads, seed) in enumerate((h, s) for h in (1, 2, 4, 8) for s in range(3)):
        write_run(Path("sweep") / str(i), heads, "dot", seed, ACC.get(heads, ACC[4])[seed], experiment="demo")
    look = {"p": 0.0004, "level": 0.0015, "runs": [0, 1, 2]}
    arms = [
        {"arm": "model.attention.n_heads=1", "look": 1, "reading": "significant", "difference": -0.075,
         "interval": [-0.11, -0.04], **look},
        {"arm": "model.attention.n_heads=2", "look": 2, "reading": "within margin", "difference": 0.001,
         "interval": [-0.008, 0.009], **look, "p": 0.9},
        {"arm": "model.attention.n_heads=4", "look": None, "reading": "baseline", "runs": [6, 7, 8]},
        {"arm": "model.attention.n_heads=8", "look": 3, "reading": None, "difference": 0.004,
         "interval": [-0.02, 0.03], **look, "p": 0.6},
    ]  # fmt: skip
    said = {"looks": [1, 2, 3], "baseline": "model.attention.n_heads=4", "metric": "test/acc", "effect": 0.01}
    Path("sweep/sequential.json").write_text(json.dumps({**said, "alpha": 0.0167, "arms": arms}))
    Path("RESULTS.md").write_text(EMPTY_RESULTS)
    main(["sweep", "--baseline", "model.attention.n_heads=4", "--metric", "test/acc", "--out", "results/demo",
          "--into", "RESULTS.md"])  # fmt: skip
    text = Path("RESULTS.md").read_text()
    worse, same, better = (_row(text, c) for c in ("one head is worse", "two heads match", "eight heads are better"))
    assert worse[3:6] == ["-0.075 [-0.110, -0.040]", "0.0004 (level 0.0015)", "**supported**"]
    assert same[3:6] == ["+0.001 [-0.008, +0.009]", "0.9 (level 0.0015)", "**supported**"]
    assert better[3:6] == ["+0.004 [-0.020, +0.030]", "0.6 (level 0.0015)", "inconclusive"]
    with open("results/demo/compare_rounds.csv", newline="") as f:
        rows = {r["model.attention.n_heads"]: r for r in csv.DictReader(f)}
    assert rows["4"]["reading"] == "baseline" and rows["4"]["look"] == "" and rows["1"]["margin"] == "0.01"
