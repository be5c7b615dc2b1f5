"""A sweep's TensorBoard view, made when the sweep ends: <sweep>/tensorboard/ holds each completed run's event files
(hard links, copies where the file system has none) under a name made of what varies in the sweep (heads=4,seed=1),
and one HParams experiment summary that lists the varying keys first, then the resolved head sizes and parameter
counts, with the sweep's objective as the first metric: `tensorboard --logdir <sweep>/tensorboard` opens the
table, parallel coordinates and scatter views on the comparison."""

import contextlib
import os
import shutil
from pathlib import Path

from headlab.record import TEST_ACC, TEST_LOSS, VAL_ACC_BEST
from headlab.stats.comparison import FOLD, varying_keys
from headlab.stats.runs import load_dirs

FACTS = ("resolved.n_heads", "resolved.d_k", "resolved.d_v", "params.total", "params.attention", "flops_per_token")
METRICS = (VAL_ACC_BEST, "val/acc", TEST_ACC, TEST_LOSS)
FOLDER = "tensorboard"
REPLICATES = ("seed", FOLD)  # named in a run's label and the HParams table where they differ


def short(key: str) -> str:
    """model.attention.n_heads -> n_heads; a key's last part, which names it within a sweep."""
    return key.rsplit(".", 1)[-1]


def replicates(runs: list[dict]) -> list[str]:
    """The keys that make runs of one setting replicates (seed, data.cv.fold) and differ between these runs."""
    return [k for k in REPLICATES if len({r["config"].get(k) for r in runs}) > 1]


def labels(runs: list[dict], keys: list[str]) -> list[str]:
    """Each run's name: its values of the varying keys, then its seed and fold where those differ; unique."""
    named = [*keys, *replicates(runs)]
    out, seen = [], set()
    for run in runs:
        label = ",".join(f"{short(k)}={run['config'].get(k)}" for k in named) or "run"
        label = label.replace("/", "_")
        if label in seen:
            label = f"{label},job={Path(run['where']).name}"
        seen.add(label)
        out.append(label)
    return out


def facts(record: dict) -> dict:
    """What a run's loggers got beside its config (training.loggers.run_facts), as its results.json has it."""
    heads, params = record.get("heads") or {}, record.get("params") or {}
    return {
        **{f"resolved.{k}": v for k, v in heads.items()},
        **{f"params.{k}": v for k, v in params.items()},
        "flops_per_token": record.get("flops_per_token"),
    }


def write(sweep_dir: Path, objective: str) -> Path | None:
    """<sweep>/tensorboard for the sweep's completed runs that logged to TensorBoard; None when none did."""
    runs = [r for r in load_dirs([sweep_dir]).completed if (Path(r["where"]) / FOLDER).is_dir()]
    if not runs:
        return None
    from tensorboardX import SummaryWriter  # which imports torch (seconds): only for a sweep that logged to it
    from tensorboardX.summary import hparams

    view = sweep_dir / FOLDER
    shutil.rmtree(view, ignore_errors=True)
    keys = varying_keys(runs)
    for run, label in zip(runs, labels(runs, keys), strict=True):
        source = Path(run["where"]) / FOLDER
        for event in source.rglob("events.out.tfevents*"):
            target = view / label / event.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(event, target)
            except OSError:
                shutil.copy2(event, target)
    first = {**runs[0]["config"], **facts(runs[0])}
    shown = [*keys, *replicates(runs), *(k for k in FACTS if k not in keys and k in first)]
    values = {k: first.get(k) for k in shown}
    values = {k: v if isinstance(v, bool | int | float | str) else str(v) for k, v in values.items() if v is not None}
    metrics = dict.fromkeys([objective, *(m for m in METRICS if m != objective)], 0.0)
    experiment, _, _ = hparams(values, metrics)
    with contextlib.closing(SummaryWriter(str(view))) as writer:
        writer._get_file_writer().add_summary(experiment)
    return view
