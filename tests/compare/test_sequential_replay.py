"""headlab-compare --sequential K: an archived sweep's contrasts replayed as sweep.sequential's rounds would have
read them, seeds in order, and the runs those rounds would have needed."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from test_compare import write_run

from headlab.cli.compare import main
from headlab.stats import sequential


@pytest.fixture
def sweep(tmp_path):
    """design plain, broken and same at two rates, 10 seeds each: broken is far below plain at 1e-2 only."""
    rng = np.random.default_rng(3)
    acc = {}
    for design in ("plain", "broken", "same"):
        for lr in (0.001, 0.01):
            shift = -0.5 if (design, lr) == ("broken", 0.01) else 0.0
            acc[design, lr] = list(0.8 + shift + 0.02 * rng.standard_normal(10))
            for seed, value in enumerate(acc[design, lr]):
                path = tmp_path / "sweep" / f"{design}-{lr}-{seed}"
                write_run(path, 4, "dot", seed, float(value), design=design, **{"optim.lr": lr})
    return tmp_path / "sweep", acc


def _row(text: str, design: str, lr: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith(f"| {design} | {lr} |") and "| look " in x)
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_a_broken_arm_stops_at_the_first_look_and_the_runs_the_rounds_need_are_counted(sweep, tmp_path):
    root, acc = sweep
    options = ["--baseline", "design=plain", "--within", "optim.lr", "--metric", "test/acc", "--sequential", "3"]
    main([str(root), *options, "--out", str(tmp_path / "out"), "--no-plots"])
    text = (tmp_path / "out" / "compare.md").read_text()
    broken = _row(text, "broken", "0.01")
    assert broken[2:4] == ["look 1 of 3 (4 seeds)", "significant"]
    p = stats.ttest_ind(acc["broken", 0.01][:4], acc["plain", 0.01][:4], equal_var=False).pvalue
    level = sequential.level(sequential.boundaries((0.4, 0.7, 1.0))[0])
    assert broken[4] == f"{p:.3g} ({level:.3g})"
    assert math.isclose(
        float(broken[5].split()[0]), np.mean(acc["broken", 0.01][:4]) - np.mean(acc["plain", 0.01][:4]), abs_tol=1e-4
    )
    # no margin stated: an arm like its baseline cannot stop early, and reads undecided at 10 seeds as once
    assert _row(text, "same", "0.001")[2:4] == ["look 3 of 3 (10 seeds)", "undecided"]
    # at 1e-2, broken stops at 4 seeds and same runs 10, so plain there runs 10: 4 + 10 + 10 at 1e-2, 30 at 1e-3
    assert "**54 of 60 runs** (90%)" in text
    assert "sweep.sequential's rounds at 4, 7, 10 seeds" in text


def test_sequential_needs_a_baseline_and_replays_seeds_not_folds_or_selections(sweep, tmp_path, capsys):
    root, _ = sweep
    for options, says in (
        (["--sequential", "3"], "--sequential needs --baseline"),
        (["--baseline", "design=plain", "--sequential", "1"], "--sequential takes the number of looks, 2 or more"),
        (["--baseline", "design=plain", "--select", "optim.lr", "--sequential", "3"], "not with --select"),
    ):
        with pytest.raises(SystemExit) as refused:
            main([str(root), *options, "--out", str(tmp_path / "refused"), "--no-plots"])
        assert refused.value.code != 0 and says in str(refused.value.code) + capsys.readouterr().err
    assert not Path(tmp_path / "refused" / "compare.md").exists()


def test_a_received_sequential_json_is_text_in_the_table_and_a_wrong_one_is_refused_by_name(sweep):
    root, _ = sweep
    arm = {"arm": "x=<b>|y", "look": 1, "reading": "significant", "p": 0.001, "level": 0.002, "difference": 0.5}
    said = {"looks": [4, 10], "baseline": "design=plain", "metric": "test/acc"}
    (root / "sequential.json").write_text(json.dumps({**said, "arms": [{**arm, "interval": [0.1, 0.9], "runs": [0]}]}))
    main([str(root), "--no-plots"])
    assert (
        "| x=&lt;b&gt;\\|y | look 1 (1 runs) | significant | 0.001 (0.002) | +0.5000 [+0.1000, +0.9000] |"
        in (root / "compare.md").read_text()
    )
    for wrong in ({"p": "low"}, {"reading": "<b>decided</b>"}):  # a value, or a reading no sweep writes
        (root / "sequential.json").write_text(json.dumps({**said, "arms": [{**arm, **wrong, "interval": [0, 1]}]}))
        with pytest.raises(SystemExit, match="sequential.json: not a sequential.json a sweep writes"):
            main([str(root), "--no-plots"])


def test_a_sweeps_rounds_are_archived_with_its_runs_and_read_from_the_archive(sweep, tmp_path):
    """--archive keeps the sweep's sequential.json beside its runs' records; compare on the archive shows the same
    rounds (an arm stopped early is read by its round wherever its runs are read from)."""
    root, _ = sweep
    arm = {"arm": "design=broken", "look": 1, "reading": "significant", "p": 0.0001, "level": 0.0015}
    said = {"looks": [4, 7, 10], "baseline": "design=plain", "metric": "test/acc"}
    arms = [{**arm, "difference": -0.5, "interval": [-0.6, -0.4], "runs": [0, 1, 2, 3]}]
    (root / "sequential.json").write_text(json.dumps({**said, "arms": arms}))
    archived = tmp_path / "runs.tar.xz"
    main([str(root), "--no-plots", "--archive", str(archived)])
    row = "| design=broken | look 1 (4 runs) | significant | 0.0001 (0.0015) | -0.5000 [-0.6000, -0.4000] |"
    assert row in (root / "compare.md").read_text()
    main([str(archived), "--no-plots", "--out", str(tmp_path / "again")])
    again = (tmp_path / "again" / "compare.md").read_text()
    assert row in again and f"Rounds ({archived}:sweep: looks at 4, 7, 10 replicates" in again
