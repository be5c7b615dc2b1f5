"""Published tables recompute from their archives: headlab-compare --check replays each compare.md's command on the
runs' archive and finds a changed number; --update rewrites a table and its RESULTS.md block; archives keep every
run of roots that share a name."""

import tarfile
from pathlib import Path

import pytest
from test_compare import write_run

from conftest import ROOT
from headlab.cli.compare import main
from headlab.compare import blocks
from headlab.stats import archive
from headlab.stats.runs import load_dirs


@pytest.fixture
def published(tmp_path, monkeypatch):
    """A sweep read into a table and a RESULTS.md block, archived, then a second table from the same sweep
    (as by_lr/ beside it) that names the sweep directory and not the archive; the sweep itself is gone."""
    monkeypatch.chdir(tmp_path)
    for i, (heads, seed) in enumerate((h, s) for h in (1, 4) for s in range(3)):
        write_run(Path("sweep") / str(i), heads, "dot", seed, 0.6 + 0.1 * heads / 4 + 0.01 * seed, experiment="demo")
    Path("RESULTS.md").write_text("# Results\n<!-- headlab-compare: demo -->\n<!-- /headlab-compare: demo -->\nend\n")
    options = ["--baseline", "model.attention.n_heads=4", "--metric", "test/acc"]
    main(["sweep", *options, "--out", "results/demo", "--into", "RESULTS.md", "--archive", "results/demo/runs.tar.xz"])
    main(["sweep", "--metric", "test/acc", "--out", "results/demo/by_lr"])
    Path("sweep").rename("gone")
    return Path("results/demo/compare.md")


def test_check_recomputes_each_table_from_its_archive_and_finds_a_changed_number(published, capsys):
    with pytest.raises(SystemExit) as done:
        main(["--check", "results"])
    said = capsys.readouterr().out
    assert done.value.code == 0, said
    assert "same: results/demo/compare.md (4 table lines from results/demo/runs.tar.xz)" in said
    assert "same: results/demo/by_lr/compare.md (4 table lines from results/demo/runs.tar.xz)" in said

    committed = published.read_text()
    mean = committed.split("\n| 1 | 3 | ")[1].split(" ")[0]  # n_heads 1's mean test accuracy
    published.write_text(committed.replace(f"| 1 | 3 | {mean}", "| 1 | 3 | 0.9999"))
    with pytest.raises(SystemExit) as done:
        main(["--check", "results"])
    said = capsys.readouterr().out
    assert done.value.code == 1
    assert "differs: results/demo/compare.md" in said and "- | 1 | 3 | 0.9999" in said and f"+ | 1 | 3 | {mean}" in said


def test_check_says_which_tables_cannot_be_recomputed_and_that_results_md_lost_its_table(published, capsys):
    Path("results/demo/runs.tar.xz").rename("elsewhere.tar.xz")
    with pytest.raises(SystemExit) as done:
        main(["--check", "results"])
    said = capsys.readouterr().out
    assert done.value.code == 0  # not archived is said, not failed: such tables stand on their summaries
    assert said.count("not archived: ") == 2 and "(its runs were not kept)" in said

    Path("elsewhere.tar.xz").rename("results/demo/runs.tar.xz")
    Path("RESULTS.md").write_text(Path("RESULTS.md").read_text().replace("(baseline)", "(edited by hand)"))
    with pytest.raises(SystemExit) as done:
        main(["--check", "results/demo/compare.md"])
    assert done.value.code == 1
    assert "differs: results/demo/compare.md (RESULTS.md no longer holds this table)" in capsys.readouterr().out


def test_update_rewrites_a_table_and_its_block_from_the_archive(published, capsys):
    edited = published.read_text().replace("(baseline)", "(old rendering)")
    published.write_text(edited)
    Path("RESULTS.md").write_text(Path("RESULTS.md").read_text().replace("(baseline)", "(old rendering)"))
    with pytest.raises(SystemExit) as done:
        main(["--check", "--update", "results"])
    said = capsys.readouterr().out
    assert done.value.code == 0, said
    assert "updated: results/demo/compare.md (from results/demo/runs.tar.xz and its block demo of RESULTS.md)" in said
    table = published.read_text()
    assert "(baseline)" in table and "Command: `headlab-compare results/demo/runs.tar.xz --" in table
    assert "--baseline model.attention.n_heads=4" in table
    assert blocks.brief(table, Path("RESULTS.md"), published.parent) in Path("RESULTS.md").read_text() and Path(
        "RESULTS.md"
    ).read_text().endswith("end\n")
    with pytest.raises(SystemExit) as done:
        main(["--check", "results"])
    assert done.value.code == 0 and "differs" not in capsys.readouterr().out


def test_a_table_pasted_outside_a_block_fails_the_check_and_a_named_block_holds_it(published, capsys):
    quoted = published.read_text()
    Path("RESULTS.md").write_text(Path("RESULTS.md").read_text() + "\n## By hand\n" + quoted)
    with pytest.raises(SystemExit) as done:
        main(["--check", "results"])
    assert done.value.code == 1
    assert "differs: RESULTS.md:" in capsys.readouterr().out

    # the same table as a block of its own: --block names it, --check keeps it true
    Path("RESULTS.md").write_text(Path("RESULTS.md").read_text().replace("\n## By hand\n" + quoted, "\n"))
    Path("RESULTS.md").write_text(
        Path("RESULTS.md").read_text()
        + "<!-- headlab-compare: demo/by_hand -->\n<!-- /headlab-compare: demo/by_hand -->\n"
    )
    options = [
        "--metric",
        "test/acc",
        "--out",
        "results/demo/by_hand",
        "--into",
        "RESULTS.md",
        "--block",
        "demo/by_hand",
    ]
    main(["results/demo/runs.tar.xz", *options])
    by_hand = Path("results/demo/by_hand")
    assert (
        blocks.brief((by_hand / "compare.md").read_text(), Path("RESULTS.md"), by_hand)
        in Path("RESULTS.md").read_text()
    )
    with pytest.raises(SystemExit) as done:
        main(["--check", "results"])
    said = capsys.readouterr().out
    assert done.value.code == 0, said
    assert "same: results/demo/by_hand/compare.md" in said
    with pytest.raises(SystemExit) as refused:
        main(["results/demo/runs.tar.xz", "--block", "demo/by_hand"])
    assert refused.value.code == 2 and "--block takes a block name of --into FILE" in capsys.readouterr().err


def test_update_writes_no_file_outside_the_working_directory(published, monkeypatch, capsys):
    published.write_text(published.read_text().replace("(baseline)", "(old rendering)"))
    monkeypatch.chdir("results")  # RESULTS.md, the table's --into, now lies above the working directory
    with pytest.raises(SystemExit) as done:
        main(["--check", "--update", "demo/compare.md"])
    assert done.value.code == 1
    assert "--into RESULTS.md lies outside the working directory: not written" in capsys.readouterr().out
    assert "(old rendering)" in Path("demo/compare.md").read_text()


def test_check_takes_no_analysis_options(capsys):
    with pytest.raises(SystemExit) as refused:
        main(["--check", "--metric", "test/acc"])
    assert refused.value.code == 2
    assert "--check [--update] takes folders or compare.md files only" in capsys.readouterr().err


def test_an_archive_of_two_roots_of_one_name_keeps_both(tmp_path):
    for heads, root in enumerate(("a/sweep", "b/sweep"), start=1):  # two arms (one run of each seed is one run)
        for seed in range(2):
            write_run(tmp_path / root / str(seed), heads, "dot", seed, 0.5 + seed / 10)
    assert archive.write(tmp_path / "new.tar.xz", [tmp_path / "a/sweep", tmp_path / "b/sweep"]) == 4
    with tarfile.open(tmp_path / "new.tar.xz") as tar:
        assert {n for n in tar.getnames() if n.endswith("results.json")} == {
            f"{root}/{seed}/results.json" for root in ("sweep", "sweep-2") for seed in range(2)
        }
    # an archive written before roots got distinct names holds sweep/0/results.json twice: both runs are read
    with tarfile.open(tmp_path / "old.tar", "w") as tar:
        for root in ("a/sweep", "b/sweep"):
            for seed in range(2):
                tar.add(tmp_path / root / str(seed) / "results.json", arcname=f"sweep/{seed}/results.json")
    for path in (tmp_path / "new.tar.xz", tmp_path / "old.tar"):
        assert len(load_dirs([path]).completed) == 4


@pytest.mark.e2e  # headlab-compare --check over every published archive: 30 s
def test_every_published_table_recomputes_from_its_archive(capsys):
    """What experiments/RESULTS.md prints is what its archives give with this headlab's analysis."""
    with pytest.raises(SystemExit) as done:
        main(["--check", str(ROOT / "experiments" / "results")])
    said = capsys.readouterr().out
    assert done.value.code == 0, said
    assert said.count("same: ") >= 24
    assert "same: experiments/RESULTS.md's findings table" in said or f"same: {ROOT}/experiments/RESULTS.md's" in said
    # only the tables made before --archive existed (RESULTS.md says which) stand on their summaries alone
    unarchived = {Path(line.split(": ")[1].split(" (")[0]) for line in said.splitlines() if "not archived" in line}
    made_before = {"heads_fixed_width", "heads_vs_depth", "heads_vs_depth/by_lr", "key_size", "key_size/by_lr"}
    assert unarchived == {ROOT / "experiments" / "results" / name / "compare.md" for name in made_before}


def test_results_md_reads_in_brief():
    """The published results read in minutes: at most 1,200 lines, fewer than 20 over 400 characters (the blocks
    show their tables in brief; the method is stated once at the top)."""
    lines = (ROOT / "experiments" / "RESULTS.md").read_text().splitlines()
    assert len(lines) <= 1200
    assert sum(len(line) > 400 for line in lines) < 20
