"""Text datasets: hub configs through local look-alikes, real SST-2 through data=files, caching, bad input."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.utils import instantiate

from conftest import ROOT
from headlab.data.datamodule import BucketBatchSampler
from headlab.data.text import TextDataModule
from headlab.data.text_pipeline import read_column
from headlab.errors import DataError

SST2 = ROOT / ".." / "shared" / "data" / "sst2"
needs_sst2 = pytest.mark.skipif(not (SST2 / "train.tsv").exists(), reason="../shared/data is absent")


def write_parquet(path: Path, columns: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


def fake_hub_dataset(root: Path, splits: dict[str, int], text: str, labels: dict[str, int]) -> Path:
    """A local folder laid out like the hub's parquet export: <split>-00000-of-00001.parquet."""
    rng = np.random.default_rng(0)
    words = ["good", "bad", "film", "plot", "actor", "dull", "great", "story"]
    for split, n in splits.items():
        columns = {text: [" ".join(rng.choice(words, 6)) for _ in range(n)]}
        columns |= {name: rng.integers(0, k, n).tolist() for name, k in labels.items()}
        if split == "test" and "sst2" in root.name:
            columns["label"] = [-1] * n  # GLUE hides SST-2's test labels
        write_parquet(root / "data" / f"{split}-00000-of-00001.parquet", columns)
    return root


def datamodule(data: str, tmp_path: Path, **overrides) -> TextDataModule:
    with initialize_config_module("headlab.conf", version_base="1.3"):
        cfg = compose("train", overrides=[f"data={data}", *(f"data.{k}={v}" for k, v in overrides.items())])
    return instantiate(cfg.data, cache_dir=str(tmp_path / "cache"), _convert_="all")


@pytest.mark.parametrize(
    ("data", "splits", "text", "labels", "expected"),
    [
        ("sst2", {"train": 400, "validation": 60, "test": 90}, "sentence", {"label": 2}, {"test": 60, "classes": 2}),
        ("ag_news", {"train": 400, "test": 80}, "text", {"label": 4}, {"test": 80, "classes": 4}),
        ("trec", {"train": 400, "test": 50}, "text", {"coarse_label": 6, "fine_label": 50}, {"test": 50, "classes": 6}),
        ("imdb", {"train": 400, "test": 70, "unsupervised": 30}, "text", {"label": 2}, {"test": 70, "classes": 2}),
    ],
)
def test_hub_configs_map_columns_and_splits(tmp_path, data, splits, text, labels, expected):
    root = fake_hub_dataset(tmp_path / data, splits, text, labels)
    dm = datamodule(data, tmp_path, hub=str(root))
    dm.setup()
    assert len(dm.splits["test"]) == expected["test"]  # for sst2: GLUE's validation split, since test is unlabelled
    assert dm.n_classes == expected["classes"]
    train, val = len(dm.splits["train"]), len(dm.splits["val"])
    assert train + val == 400 and 15 <= val <= 25  # 5% of train, carved per class
    tokens = dm.token_strings(torch.tensor(dm.splits["train"][0][0]))
    assert len(tokens) == 6 and set(tokens) <= {"good", "bad", "film", "plot", "actor", "dull", "great", "story"}


def test_trec_fine_labels_are_selectable(tmp_path):
    root = fake_hub_dataset(
        tmp_path / "trec", {"train": 600, "test": 40}, "text", {"coarse_label": 6, "fine_label": 50}
    )
    dm = datamodule("trec", tmp_path, hub=str(root), label_column="fine_label")
    dm.setup()
    assert dm.n_classes == 50


def test_carved_validation_is_stratified_and_deterministic(tmp_path):
    path = tmp_path / "train.csv"
    labels = ["pos"] * 300 + ["neg"] * 100
    path.write_text("text,label\n" + "".join(f"w{i} x,{y}\n" for i, y in enumerate(labels)))

    def carve(seed):
        dm = TextDataModule(
            "text", "label", files={"train": str(path)}, cache_dir=str(tmp_path / f"c{seed}"), seed=seed
        )
        dm.setup()
        return dm

    a, b, c = carve(0), carve(0), carve(1)
    val_labels = [y for _, y in a.splits["val"]]
    assert a.labels == ["neg", "pos"] and val_labels.count(0) == 5 and val_labels.count(1) == 15
    assert [t.tolist() for t, _ in a.splits["val"]] == [t.tolist() for t, _ in b.splits["val"]]
    assert [t.tolist() for t, _ in a.splits["val"]] != [t.tolist() for t, _ in c.splits["val"]]


@needs_sst2
def test_real_sst2_prepares_caches_and_changed_settings_miss_the_cache(tmp_path):
    def prepare(**kwargs):
        dm = TextDataModule(
            "sentence",
            "label",
            n_classes=2,
            cache_dir=str(tmp_path),
            files={"train": str(SST2 / "train.tsv"), "val": str(SST2 / "dev.tsv")},
            **kwargs,
        )
        started = time.perf_counter()
        dm.setup()
        return dm, time.perf_counter() - started

    first, _ = prepare()
    second, seconds = prepare()
    assert (first.loaded_from_cache, second.loaded_from_cache) == (False, True)
    assert len(second.splits["train"]) == 67349 and len(second.splits["val"]) == 872
    assert [t.tolist() for t, _ in first.splits["val"][:50]] == [t.tolist() for t, _ in second.splits["val"][:50]]
    assert max(len(t) for t, _ in second.splits["train"]) <= 128
    changed, _ = prepare(max_length=16)
    assert not changed.loaded_from_cache and max(len(t) for t, _ in changed.splits["train"]) <= 16
    assert len(list(tmp_path.iterdir())) == 2


@needs_sst2
@pytest.mark.e2e
def test_short_training_on_real_sst2_learns(run_cli, tmp_path):
    result = run_cli(
        "data=files",
        f"data.files.train={SST2 / 'train.tsv'}",
        f"data.files.test={SST2 / 'dev.tsv'}",
        "data.text_column=sentence",
        f"data.cache_dir={tmp_path / 'cache'}",
        "logger=csv",
        "trainer.max_epochs=1",
        "+trainer.limit_train_batches=250",
        "callbacks.progress_bar=null",
        "callbacks.attention.sentences=[a dog ate the food because it was hungry]",
        "callbacks.attention.importance=false",  # the pruning curves' 600 batches are tested elsewhere
        "hydra.run.dir=run",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["metrics"]["test/acc"] > 0.65  # SST-2 dev; chance is 0.51
    assert results["data"]["labels"] == [0, 1] and results["data"]["splits"]["test"] == 872
    assert json.loads((tmp_path / "run" / "heads.json").read_text())["probe_size"] == 16 + 1


def test_a_column_is_read_as_a_list_in_the_order_of_a_selection():
    """Preparation reads columns at once (datasets 4+ gives a lazy Column that list() reads row by row), through a
    selection's index mapping as carving and folds leave it."""
    import datasets

    ds = datasets.Dataset.from_dict({"text": ["a", "b", "c", "d"], "label": [0, 1, 0, 1]}).select([3, 0, 2])
    assert read_column(ds, "text") == ["d", "a", "c"] and read_column(ds, "label") == [1, 0, 0]
    assert type(read_column(ds, "text")) is list


def bad(tmp_path, **kwargs) -> str:
    kwargs.setdefault("files", {"train": str(tmp_path / "train.csv")})
    dm = TextDataModule(
        kwargs.pop("text_column", "text"),
        kwargs.pop("label_column", "label"),
        cache_dir=str(tmp_path / "cache"),
        **kwargs,
    )
    with pytest.raises(DataError) as error:
        dm.setup()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())  # nothing cached
    return str(error.value)


def test_missing_column_lists_the_available_ones(tmp_path):
    (tmp_path / "train.csv").write_text("sentence,label\nhello,1\n")
    message = bad(tmp_path)
    assert (
        message.startswith("column 'text' (data.text_column) is not in")
        and "available columns: sentence, label" in message
    )


def test_missing_file_names_the_path(tmp_path):
    assert bad(tmp_path) == f"data.files.train: cannot read {tmp_path / 'train.csv'}: no such file"


def test_a_missing_released_benchmark_names_headlab_data(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLAB_DATA", str(tmp_path / "released"))
    missing = tmp_path / "released" / "mr" / "rt-polarity.all"
    assert bad(tmp_path, files={"train": str(missing)}) == (
        f"data.files.train: cannot read {missing}: no such file (the released benchmarks are read from "
        f"$HEADLAB_DATA, now {tmp_path / 'released'})"
    )


def test_unreadable_file_names_the_path(tmp_path):
    (tmp_path / "train.parquet").write_text("this is not parquet")
    message = bad(tmp_path, files={"train": str(tmp_path / "train.parquet")})
    assert message.startswith(f"data.files.train: cannot read {tmp_path / 'train.parquet'}")


def test_empty_split(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\nhello,1\n")
    (tmp_path / "test.csv").write_text("text,label\n")
    message = bad(tmp_path, files={"train": str(tmp_path / "train.csv"), "test": str(tmp_path / "test.csv")})
    assert message == f"the test split of {tmp_path / 'test.csv'} is empty"


def test_label_outside_the_declared_classes(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\nhello,0\nworld,1\nagain,3\n")
    assert (
        bad(tmp_path, n_classes=2)
        == "label 3 in row 2 of the train split is outside the 2 declared classes (data.n_classes)"
    )


def test_text_column_that_is_not_text(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\n1,0\n2,1\n")
    assert bad(tmp_path) == f"column 'text' (data.text_column) of {tmp_path / 'train.csv'} holds int64, not text"


def test_string_labels_are_mapped_and_saved_with_the_run(tmp_path):
    (tmp_path / "train.jsonl").write_text(
        "".join(json.dumps({"q": f"w{i}", "y": y}) + "\n" for i, y in enumerate(["spam", "ham"] * 40))
    )
    dm = TextDataModule("q", "y", files={"train": str(tmp_path / "train.jsonl")}, cache_dir=str(tmp_path / "c"))
    dm.setup()
    assert dm.describe()["labels"] == ["ham", "spam"] and {y for _, y in dm.splits["train"]} == {0, 1}


def test_text_pairs_are_joined_with_sep(tmp_path):
    (tmp_path / "train.csv").write_text("a,b,label\n" + "".join(f"left{i},right{i},{i % 2}\n" for i in range(40)))
    dm = TextDataModule(
        "a", "label", text_pair_column="b", files={"train": str(tmp_path / "train.csv")}, cache_dir=str(tmp_path / "c")
    )
    dm.setup()
    assert dm.token_strings(torch.tensor(dm.splits["train"][0][0])) == ["left0", "[SEP]", "right0"]


def test_no_network_fails_fast_in_one_line(tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HEADLAB_CACHE": str(tmp_path / "cache")}
    env.pop("HF_DATASETS_OFFLINE", None)
    started = time.time()
    result = subprocess.run(
        [sys.executable, "-m", "headlab.cli.train", "data=sst2", "logger=csv", "hydra.run.dir=run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    assert time.time() - started < 30
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "headlab-train: data error: cannot load 'stanfordnlp/sst2': the Hugging Face hub cannot be reached and it "
        "is not cached. Offline, use data=files with data.files.train=... (and data.files.val, data.files.test), "
        "or pre-fill the datasets cache and set HF_DATASETS_OFFLINE=1"
    ]


def test_bucketing_batches_similar_lengths_and_covers_every_example_once():
    lengths = np.random.default_rng(0).integers(1, 100, 1000).tolist()
    sampler = BucketBatchSampler(lengths, batch_size=10, seed=0)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(1000)) and len(batches) == len(sampler)
    spread = np.mean([np.ptp([lengths[i] for i in b]) for b in batches])
    assert spread < 10  # random batches of 10 would spread over about 80
    assert batches == list(sampler)
    sampler.sampler.set_epoch(1)  # Lightning sets the epoch of a batch sampler's sampler
    assert batches != list(sampler)


def test_a_damaged_cache_entry_is_detected_and_rebuilt(tmp_path, caplog):
    rows = "text,label\n" + "".join(f"word{i} word{i + 1},{i % 2}\n" for i in range(60))
    (tmp_path / "train.csv").write_text(rows)
    dm = datamodule("files", tmp_path, **{"files.train": tmp_path / "train.csv", "n_classes": 2})
    dm.setup()
    arrays = dm.cache_path / "arrays.npz"
    arrays.write_bytes(arrays.read_bytes()[:100])  # truncated, as a killed copy or a full disk leaves it
    again = datamodule("files", tmp_path, **{"files.train": tmp_path / "train.csv", "n_classes": 2})
    with caplog.at_level("WARNING", logger="headlab"):
        again.setup()
    assert not again.loaded_from_cache and "arrays.npz" in caplog.text and "rebuilding" in caplog.text
    assert [y for _, y in again.splits["train"]] == [y for _, y in dm.splits["train"]]  # (tokenizer ids may differ)
    third = datamodule("files", tmp_path, **{"files.train": tmp_path / "train.csv", "n_classes": 2})
    third.setup()
    assert third.loaded_from_cache


def test_a_cache_entry_another_process_completed_meanwhile_is_kept_not_replaced(tmp_path):
    """Two packs preparing the same data at once: the second writer must not delete the entry the first reads."""
    from headlab.data import text_pipeline as pipeline

    rows = "text,label\n" + "".join(f"word{i} word{i + 1},{i % 2}\n" for i in range(60))
    (tmp_path / "train.csv").write_text(rows)
    dm = datamodule("files", tmp_path, **{"files.train": tmp_path / "train.csv", "n_classes": 2})
    dm.setup()  # the first writer's complete entry
    written = {name: (dm.cache_path / name).read_bytes() for name in pipeline.CACHE_FILES}
    with np.load(dm.cache_path / "arrays.npz") as arrays:
        other = {"train": {k.removeprefix("train_"): arrays[k][:2] for k in arrays.files if k.startswith("train_")}}
    pipeline.write_cache(dm.cache_path, other, dm.tokenizer, ["x", "y"])  # a second writer that prepared it too
    assert {name: (dm.cache_path / name).read_bytes() for name in pipeline.CACHE_FILES} == written
    assert pipeline.cache_state(dm.cache_path) == "complete"
    assert not list(tmp_path.rglob(".tmp-*"))  # the loser's temporary directory is removed


def test_a_process_needing_an_entry_another_is_preparing_waits_and_reads_it(tmp_path):
    """Two packs of one sweep with the same seed: the second waits for the first's entry, not preparing it too."""
    import shutil
    import threading

    from headlab.data import text_pipeline as pipeline

    rows = "text,label\n" + "".join(f"word{i} word{i + 1},{i % 2}\n" for i in range(60))
    (tmp_path / "train.csv").write_text(rows)
    make = lambda: datamodule("files", tmp_path, **{"files.train": tmp_path / "train.csv", "n_classes": 2})  # noqa: E731
    first = make()
    first.setup()
    entry, kept = first.cache_path, tmp_path / "kept"
    entry.rename(kept)  # the entry is missing again; the first process is about to write it
    second = make()
    with pipeline.preparing(entry):  # the first process, preparing
        waiting = threading.Thread(target=second.setup)
        waiting.start()
        waiting.join(timeout=2)
        assert waiting.is_alive()  # the second waits rather than preparing too
        kept.rename(entry)  # the first writes its entry
    waiting.join(timeout=30)
    assert not waiting.is_alive() and second.loaded_from_cache
    assert [t.tolist() for t, _ in second.splits["train"]] == [t.tolist() for t, _ in first.splits["train"]]
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # the lock file is gone
    shutil.rmtree(entry)
    third = make()
    third.setup()  # no one preparing: no wait, and the lock is removed after
    assert not third.loaded_from_cache and [p.name for p in entry.parent.iterdir()] == [entry.name]
