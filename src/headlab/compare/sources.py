"""Where compared runs come from: sweep directories, results.json files and run archives
(headlab.stats.runs.load_dirs), or a W&B project's runs through its public API."""

from pathlib import Path

from headlab.record import VAL_ACC_BEST
from headlab.stats.runs import Runs, head_means, load_dirs


def load(dirs: list[Path], wandb: str | None = None, group: str | None = None) -> Runs:
    """The runs of the directories (or archives), or of W&B project ENTITY/PROJECT (optionally one group)."""
    return load_wandb(wandb, group) if wandb else load_dirs(dirs)


def load_wandb(path: str, group: str | None) -> Runs:
    """Finished runs of a W&B project (ENTITY/PROJECT), optionally one group, through the public API."""
    import wandb

    runs = Runs()
    filters = {"group": group} if group else {}
    for run in wandb.Api(timeout=30).runs(path, filters=filters):
        summary = {k: _summary_value(v) for k, v in dict(run.summary).items()}
        summary = {k: v for k, v in summary.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        metrics = {VAL_ACC_BEST: summary.get("val/acc"), **summary, **head_means(summary)}
        record = {"config": dict(run.config), "metrics": metrics, "head_analysis": {}}
        record["where"] = run.url
        if run.state == "finished":
            runs.completed.append(record)
        else:
            runs.failed.append((run.url, run.state))
    return runs


def _summary_value(value):
    """A W&B summary value as a number: metrics defined with summary="max" (or min, last) come back as
    {"max": ...}; media and tables stay what they are (and are left out)."""
    if isinstance(value, dict):
        return next((value[k] for k in ("max", "min", "last", "mean") if k in value), value)
    return value
