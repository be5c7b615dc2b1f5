"""Whole commands, start to end: start-up, the default run, SST-2 preparation and the SST-2 recipe.

SST-2 figures need the SST-2 files (train.tsv, dev.tsv, test_labeled_senteval.tsv) in --data-dir/sst2.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from headlab.cli.bench.timing import command_seconds
from headlab.record import TEST_ACC, VAL_ACC_BEST, read_record

TRAIN = [sys.executable, "-m", "headlab.cli.train"]


def startup(tmp: Path, repeats: int) -> dict:
    exe = TRAIN

    def first_step(k: int) -> list[str]:  # each repeat a run directory of its own
        return exe + [
            "+trainer.max_steps=1",
            "+trainer.limit_val_batches=0",
            "callbacks.attention=null",
            "logger=none",
            "data.n_test=64",
            f"hydra.run.dir={tmp}/first_step/{k}",
        ]

    return {
        "--help": command_seconds(exe + ["--help"], repeats),
        "config error": command_seconds(exe + ["model.attention.n_heads=0", f"hydra.run.dir={tmp}/err"], repeats, 2),
        "one-step run (no validation), start to exit": command_seconds(first_step, repeats),
    }


def default_run(tmp: Path) -> dict:
    """The default run (make train): duration, throughput, attention-logging and analysis overhead."""
    run = tmp / "default"
    subprocess.run(
        [*TRAIN, "callbacks.progress_bar=null", f"hydra.run.dir={run}"],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=900,
        env={**os.environ, "WANDB_MODE": "offline"},
    )
    results = read_record(run)
    heads = json.loads((run / "heads.json").read_text())
    fit = results["throughput"]["fit_s"] - heads["analysis_seconds"]
    return {
        "duration_s": results["duration_s"],
        "test_acc": results["metrics"].get(TEST_ACC),
        "train_tokens_per_s": results["throughput"]["train_tokens_per_s"],
        "logging_s": heads["logging_seconds"],
        "logging_share": heads["logging_seconds"] / fit,
        "analysis_s": heads["analysis_seconds"],
    }


DRY_RUN_SWEEPS = {  # what --dry-run prices, against the sweep run after it (docs/plan.md: within 30%)
    "2 x 2, one job at a time": ["model.attention.n_heads=1,4", "optim.lr=1e-3,3e-3"],
    "8 seeds, one pack": ["hydra/launcher=packed", "seed=range(8)"],
    "CR, 5 folds": ["data=cr", "data.cv.folds=5", "seed=0"],
}


def dry_run_against_sweeps(tmp: Path, data_dir: Path) -> list[dict]:
    """Each sweep of DRY_RUN_SWEEPS priced by `--dry-run --json`, then run: its estimate, its wall time start to
    exit and their ratio (CR where --data-dir holds it)."""
    env = {**os.environ, "WANDB_MODE": "disabled", "HEADLAB_DATA": str(data_dir.resolve())}
    found = []
    for k, (name, overrides) in enumerate(DRY_RUN_SWEEPS.items()):
        if "data=cr" in overrides and not (data_dir / "cr").is_dir():
            continue
        sweep = [
            *TRAIN,
            "-m",
            *overrides,
            "logger=csv",
            "callbacks.progress_bar=null",
            f"hydra.sweep.dir={tmp}/dry/{k}",
        ]
        said = subprocess.run([*sweep, "--dry-run", "--json"], capture_output=True, text=True, env=env,
                              stdin=subprocess.DEVNULL, timeout=900, check=True)  # fmt: skip
        estimate = json.loads(said.stdout)["seconds"]
        started = time.monotonic()
        subprocess.run(sweep, capture_output=True, env=env, stdin=subprocess.DEVNULL, timeout=3600, check=True)
        wall = time.monotonic() - started
        found.append({"sweep": name, "estimate_s": estimate, "wall_s": wall, "ratio": estimate / wall})
    return found


def sst2_preparation(tmp: Path, data_dir: Path, rows: int | None = None) -> dict | None:
    """Preparing SST-2 train, first and from the cache, and one epoch of its batches; rows: its first rows only
    (--quick: the same code on a slice)."""
    train = data_dir / "sst2" / "train.tsv"
    if not train.exists():
        return None
    from headlab.data.text import TextDataModule

    if rows:
        with train.open(encoding="utf-8") as lines:
            head = [line for _, line in zip(range(rows + 1), lines, strict=False)]  # the header and `rows` rows
        train = tmp / "sst2-head.tsv"
        train.write_text("".join(head), encoding="utf-8")
    times = []
    for _ in range(2):
        dm = TextDataModule(
            "sentence",
            "label",
            n_classes=2,
            files={"train": str(train)},
            cache_dir=str(tmp / "sst2-cache"),
        )
        start = time.perf_counter()
        dm.setup()
        times.append(time.perf_counter() - start)
    loader_s = {}
    for workers in (0, 2):  # one epoch of training batches, nothing else: what feeding the model costs
        dm.num_workers = workers
        start = time.perf_counter()
        batches = sum(1 for _ in dm.train_dataloader())
        loader_s[workers] = time.perf_counter() - start
    sentences = len(dm.splits["train"]) + len(dm.splits["val"])
    return {"first_s": times[0], "cached_s": times[1], "sentences": sentences, "batches": batches, "loader_s": loader_s}


def sst2_recipe_overrides(data_dir: Path, cache: Path) -> list[str] | None:
    """experiment=sst2_recipe on the local SST-2 files (None without them)."""
    sst2 = (data_dir / "sst2").resolve()
    if not (sst2 / "train.tsv").exists():
        return None
    return [
        "experiment=sst2_recipe", "data=files",
        f"data.files.train={sst2 / 'train.tsv'}", f"data.files.val={sst2 / 'dev.tsv'}",
        f"data.files.test={sst2 / 'test_labeled_senteval.tsv'}", "data.column_names={test:[sentence,label]}",
        "data.text_column=sentence", f"data.cache_dir={cache}",
    ]  # fmt: skip


def sst2_recipe(tmp: Path, data_dir: Path) -> dict | None:
    """experiment=sst2_recipe on the local SST-2 files, start to end, with its data cache cold."""
    overrides = sst2_recipe_overrides(data_dir, tmp / "sst2-recipe-cache")
    if overrides is None:
        return None
    run_dir = tmp / "sst2-recipe"
    command = [*TRAIN, *overrides, f"hydra.run.dir={run_dir}"]
    start = time.perf_counter()
    subprocess.run(command, capture_output=True, stdin=subprocess.DEVNULL, env=os.environ | {"WANDB_MODE": "offline"})
    record = read_record(run_dir)
    metrics = record.get("metrics", {})
    return {
        "wall_s": time.perf_counter() - start,
        "dev": metrics.get(VAL_ACC_BEST),
        "test": metrics.get(TEST_ACC),
        "epoch_s": record.get("throughput", {}).get("fit_s", float("nan")) / (record.get("epochs") or 1),
    }
