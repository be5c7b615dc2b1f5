"""The classic text benchmarks as released: their line formats and encodings, the named data configs, and k-fold
cross-validation from the folds to headlab-compare's corrected intervals and tests."""

import json
import logging
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from scipy import stats

from conftest import PACKED, ROOT, SMALL_ANALYSIS, cli_env, cli_here, train_here
from headlab.cli.compare import main as compare_main
from headlab.data import folds, text_files
from headlab.errors import DataError
from headlab.stats.comparison import compare
from headlab.stats.contrasts import Design
from headlab.stats.runs import load_dirs

SHARED = ROOT.resolve().parent / "shared" / "data"
QUICK = ["model.d_model=16", "trainer.max_epochs=1", "logger=csv", "callbacks.progress_bar=null",
         "data.tokenizer.vocab_size=80", "data.batch_size=16", *SMALL_ANALYSIS]  # fmt: skip
WORDS = ["good", "bad", "film", "plot", "dull", "great", "story", "actor", "café", "naïve"]


def labelled_lines(n: int, classes: int = 2) -> list[tuple[int, str]]:
    return [(i % classes, f"{WORDS[i % 10]} {WORDS[(i * 3) % 10]} {WORDS[(i * 7) % 10]} … {i}") for i in range(n)]


# cross-validation folds
@pytest.mark.parametrize("k, seed", [(10, 0), (3, 7), (5, 1)])
def test_every_example_is_in_exactly_one_fold_and_the_folds_are_stratified(k, seed):
    labels = np.repeat(["neg", "pos", "neutral"], [503, 311, 37])
    fold = folds.stratified_folds(labels, k, seed)
    assert fold.shape == labels.shape and set(fold.tolist()) == set(range(k))  # one fold each, every fold used
    sizes = np.bincount(fold, minlength=k)
    assert sizes.sum() == len(labels) and sizes.max() - sizes.min() <= 1
    for label, total in Counter(labels.tolist()).items():
        per_fold = np.bincount(fold[labels == label], minlength=k)
        assert per_fold.sum() == total and per_fold.max() - per_fold.min() <= 1  # each class's share, up to one


def test_folds_are_fixed_by_their_seed_and_change_with_it():
    labels = [i % 2 for i in range(200)]
    assert np.array_equal(folds.stratified_folds(labels, 10, 0), folds.stratified_folds(labels, 10, 0))
    assert not np.array_equal(folds.stratified_folds(labels, 10, 0), folds.stratified_folds(labels, 10, 1))
    with pytest.raises(DataError, match=r"data.cv.folds=300 is invalid: expected 2..200"):
        folds.stratified_folds(labels, 300, 0)


# formats and encodings
def test_the_line_formats_read_labels_and_text_and_refuse_what_they_cannot(tmp_path):
    lines = tmp_path / "data.all"
    lines.write_text("1 a fine , funny film \n\n0\tdull\tand long\n3 x\n")
    assert text_files.read_lines("train", lines, "lines", "utf-8") == (
        ["1", "0", "3"],
        ["a fine , funny film", "dull\tand long", "x"],
    )
    fast = tmp_path / "data.txt"
    fast.write_text("__label__pos a fine film\n__label__neg dull\n")
    assert text_files.read_lines("train", fast, "fasttext", "utf-8") == (["pos", "neg"], ["a fine film", "dull"])
    fast.write_text("__label__pos __label__neg both\n")
    with pytest.raises(DataError, match=r"line 1 of .* has more than one label"):
        text_files.read_lines("train", fast, "fasttext", "utf-8")
    assert text_files.file_format("train", lines, None, "utf-8") == "lines"  # told from the first lines
    odd = tmp_path / "data.dat"
    odd.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(DataError, match=r"cannot tell the format of .*data.dat.*: set data.files.format to one of"):
        text_files.file_format("train", odd, None, "utf-8")


def test_an_encoding_is_detected_with_a_note_or_declared_and_never_replaced(tmp_path, caplog):
    cp1252 = tmp_path / "reviews.all"
    cp1252.write_bytes("1 a café with \u2026 \u2018charm\u2019\n0 dull\n".encode("cp1252"))
    with caplog.at_level(logging.INFO, logger="headlab"):
        assert text_files.file_encoding("train", cp1252, None) == "cp1252"
    assert f"data: {cp1252} is not UTF-8 (byte 0xe9 at offset 7): read as cp1252" in caplog.text
    labels, texts = text_files.read_lines("train", cp1252, "lines", "cp1252")
    assert texts[0] == "a café with \u2026 \u2018charm\u2019" and "\ufffd" not in "".join(texts)
    assert text_files.file_encoding("train", cp1252, "latin-1") == "latin-1"  # declared: used as given
    with pytest.raises(DataError, match=r"data.files.train: .*reviews.all is not utf-8: byte 0xe9 at offset 7"):
        text_files.file_encoding("train", cp1252, "utf-8")
    with pytest.raises(DataError, match=r"data.files.encoding='klingon' is invalid"):
        text_files.file_encoding("train", cp1252, "klingon")


def test_line_formats_and_encodings_train_through_the_real_cli(run_cli, tmp_path):
    released = tmp_path / "train.all"  # as MR ships: "label text", cp1252
    released.write_bytes("".join(f"{y} {t}\n" for y, t in labelled_lines(120)).encode("cp1252"))
    fast = tmp_path / "test.txt"  # fastText's format, UTF-8
    fast.write_text("".join(f"__label__{y} {t}\n" for y, t in labelled_lines(40)))
    done = run_cli("data=files", f"data.files.train={released}", f"data.files.test={fast}", *QUICK, "hydra.run.dir=run")
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line.split(" - ", 1)[1] for line in done.stdout.splitlines() if " - data: " in line]
    assert (
        f"data: {released} is not UTF-8 (byte 0x85 at offset 17): read as cp1252; set data.files.encoding to choose"
        in said
    )
    assert f"data: reading {released} as one example a line, label, whitespace, text (data.files.format=lines)" in said
    assert f"data: reading {fast} as one example a line, __label__x text (data.files.format=fasttext)" in said
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert record["status"] == "completed" and record["data"]["splits"]["test"] == 40
    assert record["data"]["labels"] == [0, 1]  # "__label__1" is the integer class 1
    wrong = run_cli("data=files", f"data.files.train={released}", "data.files.encoding=utf-8", *QUICK)
    assert wrong.returncode == 2 and wrong.stderr.strip().endswith("is not utf-8: byte 0x85 at offset 17")


# cross-validation through the CLI
def test_cross_validation_refuses_a_test_split_and_a_missing_or_wrong_fold_in_one_line(run_cli, tmp_path):
    data = tmp_path / "train.all"
    data.write_text("".join(f"{y} {t}\n" for y, t in labelled_lines(60)))
    base = ["data=files", f"data.files.train={data}", *QUICK]
    for overrides, message in (
        (["data.cv.folds=5", f"data.files.test={data}"], "data.cv.folds=5 is invalid: expected null: the data"),
        (["data.cv.folds=5"], "data.cv.fold=null is invalid: expected the fold this run tests, 0..4"),
        (["data.cv.folds=5", "data.cv.fold=5"], "data.cv.fold=5 is invalid: expected a fold of 0..4"),
        (["data.cv.fold=1"], "data.cv.fold=1 is invalid: expected null without data.cv.folds"),
        (["data.cv.folds=1", "data.cv.fold=0"], "data.cv.folds=1 is invalid: expected an integer of 2 or more"),
    ):  # fmt: skip
        done = run_cli(*base, *overrides)
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.e2e
def test_a_cross_validated_sweep_runs_one_packed_job_per_fold_and_compare_pools_folds_and_seeds(
    run_cli, tmp_path, capsys
):
    data = tmp_path / "train.all"
    data.write_text("".join(f"{y} {t}\n" for y, t in labelled_lines(90, classes=3)))
    done = run_cli("-m", *PACKED, "data=files", f"data.files.train={data}", "data.cv.folds=3",
                   "seed=0,1", *QUICK, "hydra.sweep.dir=sweep")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    runs = load_dirs([tmp_path / "sweep"]).completed
    assert sorted((r["config"]["data.cv.fold"], r["config"]["seed"]) for r in runs) == [
        (f, s) for f in range(3) for s in (0, 1)
    ]
    assert sum(r["data"]["splits"]["test"] for r in runs if r["config"]["seed"] == 0) == 90  # each row tested once
    assert all(r["data"]["splits"]["test"] == 30 and r["pack"]["size"] == 2 for r in runs)  # a fold's seeds: a pack
    assert len({r["data"]["cache"] for r in runs}) == 3  # a fold's seeds share its data: validation carved by cv.seed
    keys, rows = compare(runs, Design(["test/acc"]))
    assert keys == [] and len(rows) == 1 and rows[0]["runs"] == 6  # folds x seeds: one arm
    by_fold = {
        f: np.mean([r["metrics"]["test/acc"] for r in runs if r["config"]["data.cv.fold"] == f]) for f in range(3)
    }
    assert rows[0]["test/acc"]["mean"] == pytest.approx(np.mean(list(by_fold.values())))
    compare_main([str(tmp_path / "sweep"), "--out", str(tmp_path / "table")])
    table = (tmp_path / "table" / "compare.md").read_text()
    assert "test/acc (mean over folds [95% corrected t CI])" in table and "Nadeau & Bengio" in table


def cv_record(fold: int, seed: int, arm: int, acc: float) -> dict:
    config = {"data.cv.folds": 10, "data.cv.fold": fold, "seed": seed, "model.attention.n_heads": arm}
    return {"status": "completed", "config": config, "metrics": {"test/acc": acc}}


def test_cross_validated_intervals_and_tests_are_nadeau_and_bengios_corrected_ones():
    rng = np.random.default_rng(3)
    fold_effect = rng.normal(0, 0.02, 10)
    acc = {
        (f, s, h): 0.8 + fold_effect[f] + 0.01 * (h == 4) + rng.normal(0, 0.01)
        for f in range(10)
        for s in range(3)
        for h in (1, 4)
    }
    records = [cv_record(f, s, h, a) for (f, s, h), a in acc.items()]
    keys, rows = compare(records, Design(["test/acc"], baseline=("model.attention.n_heads", "1")))
    assert keys == ["model.attention.n_heads"]
    means = {h: np.array([np.mean([acc[f, s, h] for s in range(3)]) for f in range(10)]) for h in (1, 4)}
    corrected = np.sqrt((1 / 10 + 1 / 9) / (1 / 10))  # the corrected standard error over the textbook one
    one, four = rows
    half = stats.t.ppf(0.975, 9) * stats.sem(means[1]) * corrected
    assert (one["test/acc"]["low"], one["test/acc"]["high"]) == pytest.approx(
        (means[1].mean() - half, means[1].mean() + half)
    )
    t = stats.ttest_rel(means[4], means[1]).statistic / corrected
    assert four["test/acc"]["p_value"] == pytest.approx(2 * stats.t.sf(abs(t), 9))
    assert four["test/acc"]["delta"] == pytest.approx(means[4].mean() - means[1].mean())
    assert four["test/acc"]["verdict"] == "significant" or not np.isnan(four["test/acc"]["power"])


def test_the_corrected_tests_power_is_its_rejection_rate_under_nadeau_and_bengios_model():
    """Ten folds whose differences are exchangeable normals of correlation 1/10, simulated: the share of corrected
    tests that reject at 0.05 is the power cv_paired_power gives (30,000 simulations: standard error 0.003)."""
    from headlab.stats import inference, power

    k, rho, delta, rng = 10, 0.1, 1.0, np.random.default_rng(0)
    shared = rng.normal(size=(30_000, 1)) * np.sqrt(rho)
    d = delta + shared + rng.normal(size=(30_000, k)) * np.sqrt(1 - rho)  # each fold's difference: variance 1
    t = d.mean(1) / np.sqrt((1 / k + 1 / (k - 1)) * d.var(1, ddof=1))
    p = 2 * stats.t.sf(np.abs(t), k - 1)
    assert inference.cv_paired_p(dict(enumerate(d[0])), dict.fromkeys(range(k), 0.0), k) == pytest.approx(p[0])
    expected = power.cv_paired_power(delta, np.sqrt(1 - rho), k, k)  # the deviations' sd: sqrt(1 - rho)
    assert 0.3 < expected < 0.8 and np.mean(p < 0.05) == pytest.approx(expected, abs=0.012)


# the named configs of the released benchmarks
RELEASED = {  # name: {split: rows}, classes, as ../shared/data/README.md lists them
    "mr": ({"train": 10_662}, 2),
    "subj": ({"train": 10_000}, 2),
    "cr": ({"train": 3_775}, 2),
    "mpqa": ({"train": 10_606}, 2),
    "sst5": ({"train": 8_544, "val": 1_101, "test": 2_210}, 5),
}


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is not here")
@pytest.mark.parametrize("name", RELEASED)
def test_each_named_config_reads_its_release_whole(name, monkeypatch):
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    monkeypatch.setenv("HEADLAB_DATA", str(SHARED))
    with initialize_config_module("headlab.conf", version_base="1.3"):
        cfg = compose("train", overrides=[f"data={name}", "data.cv.fold=0"])
    files = OmegaConf.to_container(cfg.data.files, resolve=True)
    paths = text_files.local_paths(files)
    columns = {"text_column": cfg.data.text_column, "label_column": cfg.data.label_column}
    data = text_files.read_files(paths, files, None, columns)
    rows, classes = RELEASED[name]
    assert {role: len(ds) for role, ds in data.items()} == rows
    assert sorted({int(y) for y in data["train"]["label"]}) == list(range(classes)) == list(range(cfg.data.n_classes))
    assert "\ufffd" not in "".join(data["train"]["text"])
    without_text = sum(not text.strip() for text in data["train"]["text"])  # as released: CR 4 rows, MPQA 3
    assert without_text == {"cr": 4, "mpqa": 3}.get(name, 0) and cfg.data.empty_text == (
        "keep" if without_text else "refuse"
    )
    assert (cfg.data.cv.folds == 10) == (name != "sst5")


@pytest.mark.e2e
@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is not here")
@pytest.mark.parametrize("name", RELEASED)
def test_a_run_of_each_named_config_trains_and_every_console_script_reads_it(tmp_path, name):
    env = cli_env() | {"HEADLAB_DATA": str(SHARED)}
    fold = ["data.cv.fold=2"] if name != "sst5" else []
    done = train_here(f"data={name}", *fold, *QUICK, "+trainer.limit_train_batches=5", "+trainer.limit_val_batches=2",
                      "hydra.run.dir=run", cwd=tmp_path, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert sum(record["data"]["splits"].values()) == sum(RELEASED[name][0].values())
    if name == "cr":
        assert record["data"]["splits"]["test"] in (377, 378)
    # each reads the run's config with its resolvers; in processes of their own, as a user runs them, for one
    # config (what a fresh process registers is the same for every named config), in this process for the others
    for tool in ("heads", "eval", "status", "compare"):
        if name == "cr":
            read = subprocess.run([sys.executable, "-m", f"headlab.cli.{tool}", "run"], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)  # fmt: skip
        else:
            read = cli_here(tool, "run", cwd=tmp_path, env=env)
        assert read.returncode == 0, f"headlab-{tool}: {read.stderr[-2000:]}"


def test_a_sweep_of_a_cross_validated_config_gets_one_job_per_fold_unless_it_names_its_folds():
    from hydra import compose, initialize_config_module

    from headlab.launch.grid import fold_sweep

    with initialize_config_module("headlab.conf", version_base="1.3"):
        named = compose("train", overrides=["data=mr"])  # folds from the data config
        plain = compose("train", overrides=["data=sst2"])
    assert fold_sweep(named, ["seed=0,1"]) == ["seed=0,1", "data.cv.fold=range(10)"]
    assert fold_sweep(named, ["seed=0,1", "data.cv.fold=0,1"]) == ["seed=0,1", "data.cv.fold=0,1"]
    assert fold_sweep(plain, ["seed=0,1"]) == ["seed=0,1"]


# a training budget that follows the data (trainer.max_epochs=auto, the text defaults)
def test_auto_epochs_are_the_steps_budget_over_the_data_s_steps_an_epoch_within_their_bounds():
    from headlab.training.epochs import auto_epochs, steps_per_epoch

    assert [auto_epochs(n, 5000, 5, 10) for n in (1000, 143, 51, 1875, 700)] == [5, 10, 10, 5, 8]  # SST-2, MR, CR
    assert [auto_epochs(n, 10000, 10, 20) for n in (1000, 143, 51)] == [10, 20, 20]  # scale 2: twice as long
    assert steps_per_epoch(143, 2, None) == 72 and steps_per_epoch(143, 1, 5) == 5
    assert steps_per_epoch(143, 1, 0.5) == 71


@pytest.mark.e2e
def test_auto_epochs_train_a_single_run_and_a_pack_for_the_budget_of_their_data(run_cli, tmp_path):
    data = tmp_path / "train.all"
    data.write_text("".join(f"{y} {t}\n" for y, t in labelled_lines(120)))
    budget = ["trainer.max_epochs=auto", "auto_epochs.steps=14", "auto_epochs.min=1", "auto_epochs.max=4"]
    base = ["data=files", f"data.files.train={data}", "data.cv.folds=4", "data.cv.fold=0", *QUICK, *budget]
    single = run_cli(*base, "hydra.run.dir=run")
    assert single.returncode == 0, single.stderr[-2000:]
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    batches = -(-record["data"]["splits"]["train"] // 16)  # 86 sentences: 6 batches of 16, 3 epochs for 14 steps
    assert (record["epochs"], record["global_step"]) == (3, 3 * batches)
    assert record["config"]["trainer.max_epochs"] == "auto"
    assert "trainer.max_epochs=auto: 3 epochs of 6 steps (auto_epochs: 14 steps, within 1-4 epochs)" in single.stdout
    twice = run_cli(*base, "+auto_epochs.scale=2", "+trainer.limit_train_batches=2", "hydra.run.dir=twice")
    assert twice.returncode == 0, twice.stderr[-2000:]  # 28 steps within 2-8 epochs: 8 epochs of 2 steps, not 4
    assert "trainer.max_epochs=auto: 8 epochs of 2 steps (auto_epochs: 28 steps, within 2-8 epochs)" in twice.stdout
    assert json.loads((tmp_path / "twice" / "results.json").read_text())["epochs"] == 8
    packed = run_cli("-m", *PACKED, *base, "seed=0,1", "+trainer.limit_train_batches=2",
                     "hydra.sweep.dir=sweep")  # fmt: skip
    assert packed.returncode == 0, packed.stderr[-2000:]
    members = load_dirs([tmp_path / "sweep"]).completed
    assert [(r["pack"]["size"], r["epochs"], r["global_step"]) for r in members] == [(2, 4, 8)] * 2  # 7, at most 4
    for wrong, message in (("auto_epochs.min=5", "expected at most auto_epochs.max (4)"),
                           ("auto_epochs.steps=0", "expected an int >= 1"),
                           ("+auto_epochs.scale=0", "expected an int >= 1")):  # fmt: skip
        refused = run_cli(*base, wrong)
        assert refused.returncode == 2 and refused.stderr.strip().endswith(f"{wrong.lstrip('+')} is invalid: {message}")
