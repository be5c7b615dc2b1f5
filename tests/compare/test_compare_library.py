"""headlab.compare as a library: an analysis stated as a mapping (an experiment's compare key, a compare.json) or as
flags is one Analysis; report() makes the table headlab-compare makes; --check replays compare.json."""

import csv
import json
from pathlib import Path

import pytest
import yaml
from test_compare import sweep, write_run  # noqa: F401 (sweep: a fixture)

from conftest import ROOT
from headlab.cli.compare import main
from headlab.compare import analysis
from headlab.compare.check import check
from headlab.compare.report import report
from headlab.stats import archive
from headlab.stats.contrasts import CompareError
from headlab.stats.runs import load_dirs


def test_a_mapping_and_the_flags_that_say_the_same_make_one_analysis():
    flags = ["--select", "optim.lr", "--baseline", "design=plain", "--effect", "0.02", "--metric", "test/acc"]
    mapping = {"select": "optim.lr", "baseline": "design=plain", "effect": "0.02", "metric": "test/acc"}
    from_flags = analysis.analysis(analysis.options(flags, "flags"))
    from_mapping = analysis.analysis(analysis.options(mapping, "mapping"))
    assert from_flags == from_mapping
    design = from_mapping.design
    assert design.baseline == ("design", "plain") and design.effect == 0.02 and design.metrics == ["test/acc"]
    assert design.select == ("optim.lr", "val/acc_best")
    assert analysis.to_flags(analysis.options(mapping, "mapping")) == flags


@pytest.mark.parametrize(
    ("stated", "says"),
    [
        ({"baseline": "design=plain", "efect": 0.02}, "the key: efect is not an analysis option; they are metric,"),
        ({"effect": "large", "baseline": "a=b"}, "the key: effect takes a number, got 'large'"),
        ({"power": True}, "--power needs --baseline (power is a contrast's)"),
        ({"baseline": "design"}, "--baseline takes KEY=VALUE, got 'design'"),
    ],
)
def test_an_analysis_that_means_nothing_is_refused_naming_the_option(stated, says):
    with pytest.raises(CompareError, match=says.replace("(", r"\(").replace(")", r"\)")):
        analysis.analysis(analysis.options(stated, "the key"))


def test_every_experiment_states_its_analysis_as_a_mapping_that_checks():
    for path in sorted((ROOT / "experiments").glob("*.yaml")):
        stated = yaml.safe_load(path.read_text())
        for key in ("compare", "confirm"):
            if stated.get(key) is not None:
                assert isinstance(stated[key], dict), f"{path.name}: {key} is not a mapping"
                analysis.analysis(analysis.options(stated[key], f"{path.name}'s {key}"))


def test_report_from_python_writes_the_table_the_command_writes(sweep, tmp_path):  # noqa: F811
    root, _ = sweep
    main([str(root), "--baseline", "model.attention.n_heads=1", "--metric", "test/acc", "--out", str(tmp_path / "a")])
    chosen = analysis.analysis(analysis.options({"baseline": "model.attention.n_heads=1", "metric": "test/acc"}, "x"))
    done = report(load_dirs([root]), chosen, tmp_path / "b", {"dirs": [str(root)]}, plots=False)
    rows = lambda folder: [line for line in (folder / "compare.md").read_text().splitlines() if line.startswith("|")]  # noqa: E731
    assert rows(tmp_path / "a") == rows(tmp_path / "b") and len(rows(tmp_path / "b")) == 2 + len(done.rows)
    assert done.keys == ["model.attention.n_heads", "model.attention.scoring"] and done.n_runs == 12
    recorded = json.loads((tmp_path / "b" / "compare.json").read_text())
    assert recorded == {
        "sources": {"dirs": [str(root)]},
        "analysis": {"baseline": "model.attention.n_heads=1", "metric": ["test/acc"]},
    }


def test_check_replays_the_analysis_compare_json_records(sweep, tmp_path, monkeypatch, capsys):  # noqa: F811
    root, _ = sweep
    monkeypatch.chdir(tmp_path)
    main([str(root), "--metric", "test/acc", "--out", "table", "--archive", "table/runs.tar.xz"])
    capsys.readouterr()
    assert check([Path("table")]) == 0 and "same: table/compare.md" in capsys.readouterr().out
    record = json.loads(Path("table/compare.json").read_text())
    record["analysis"]["baseline"] = "model.attention.n_heads=1"  # another analysis than the table's
    Path("table/compare.json").write_text(json.dumps(record))
    assert check([Path("table")]) == 1
    assert "differs: table/compare.md" in capsys.readouterr().out


@pytest.mark.parametrize("metric, value", [("test/acc", float("inf")), ("test/loss", float("nan"))])
def test_a_run_with_a_metric_that_is_not_a_finite_number_is_left_out_whole(sweep, capsys, metric, value):  # noqa: F811
    """Infinity in a record, or a NaN loss (a model whose last update made its weights NaN: its accuracies are
    those of chance): the run is left out, none of its metrics counted."""
    root, _ = sweep
    record = json.loads((root / "0" / "results.json").read_text())
    record["metrics"][metric] = value  # json writes Infinity and NaN, and reads them back as floats
    (root / "0" / "results.json").write_text(json.dumps(record))
    main([str(root), "--metric", "test/acc", "--no-plots"])
    said = capsys.readouterr().err
    assert (
        f"skipped {root / '0'}/results.json: metric {metric} is {value!r}, not a finite number: the run is left out"
        in said
    )
    with (root / "compare.csv").open() as f:
        rows = {(r["model.attention.n_heads"], r["model.attention.scoring"]): r for r in csv.DictReader(f)}
    assert rows[("1", "dot")]["test/acc_n"] == "2"  # the arm's mean is of its two other runs


def test_check_replays_no_abbreviated_option_of_a_received_command_line(tmp_path, monkeypatch, capsys):
    """A received compare.md without compare.json: its Command line's abbreviations (--int for --into, --wan for
    --wandb) are not options of the replay, which fails in one line and writes nothing."""
    monkeypatch.chdir(tmp_path)
    victim = tmp_path / "RESULTS.md"
    victim.write_text("<!-- headlab-compare: mine -->\nmine\n<!-- /headlab-compare: mine -->\n")
    table = tmp_path / "table" / "compare.md"
    table.parent.mkdir()
    table.write_text(f"Command: `headlab-compare runs.tar.xz --int {victim} --blo mine --wan evil/proj`\n| a |\n")
    (tmp_path / "runs" / "0").mkdir(parents=True)
    (tmp_path / "runs" / "0" / "results.json").write_text(json.dumps({"status": "failed"}))
    archive.write(tmp_path / "runs.tar.xz", [tmp_path / "runs"])
    assert check([table], update=True) == 1
    said = capsys.readouterr().out
    assert said.startswith("failed: ") and "--int is not an analysis option" in said
    assert victim.read_text().endswith("mine\n<!-- /headlab-compare: mine -->\n")


def test_a_damaged_or_oversized_archive_is_refused_in_one_line(sweep, tmp_path, monkeypatch, capsys):  # noqa: F811
    root, _ = sweep
    damaged = tmp_path / "damaged.tar.xz"
    damaged.write_bytes(b"not an archive")
    with pytest.raises(SystemExit, match="no completed runs to compare"):
        main([str(damaged), "--no-plots", "--out", str(tmp_path / "out")])
    assert f"skipped {damaged}: not a readable archive" in capsys.readouterr().err
    archive.write(tmp_path / "runs.tar.xz", [root])
    monkeypatch.setattr(archive, "MAX_RECORD_BYTES", 100)  # a record past the limit: refused before it is read
    with pytest.raises(SystemExit, match="no completed runs to compare"):
        main([str(tmp_path / "runs.tar.xz"), "--no-plots", "--out", str(tmp_path / "out")])
    assert "results.json is" in (said := capsys.readouterr().err) and "over the 100 a record may be" in said


def test_an_output_folder_that_cannot_be_made_is_one_line(sweep, tmp_path):  # noqa: F811
    root, _ = sweep
    (tmp_path / "a_file").write_text("")
    with pytest.raises(SystemExit) as refused:
        main([str(root), "--out", str(tmp_path / "a_file" / "tables")])
    assert refused.value.code == f"headlab-compare: cannot write {tmp_path / 'a_file' / 'tables'}: Not a directory"


def test_keys_that_describe_the_baseline_key_do_not_keep_rows_from_their_baseline(tmp_path):
    """Arms named by one key (design) whose settings vary with it (n_heads: 4 for plain, 2 for differential): each
    arm is compared with design=plain, as the stated contrast says, across the keys that follow from design."""
    for i, (design, heads, seed) in enumerate(
        (d, h, s) for d, h in (("plain", 4), ("diff", 2), ("gate", 4)) for s in range(3)
    ):
        write_run(
            tmp_path / "sweep" / str(i),
            heads,
            "dot",
            seed,
            0.5 + 0.1 * (design != "plain") + 0.01 * seed,
            design=design,
        )
    chosen = analysis.analysis(analysis.options({"baseline": "design=plain", "metric": "test/acc"}, "x"))
    done = report(load_dirs([tmp_path / "sweep"]), chosen, tmp_path / "out", {"dirs": []}, plots=False)
    deltas = {row["design"]: row["test/acc"].get("delta") for row in done.rows}
    assert deltas == pytest.approx({"plain": 0.0, "diff": 0.1, "gate": 0.1})
