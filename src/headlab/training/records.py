"""The fields of results.json that a run owns once it has trained, stated once for single runs and pack members
(the job around it adds status, config, seed, commit and versions: headlab.cli.train)."""

from headlab.model import describe

TRAIN_METRICS = ("train/acc", "train/loss_epoch")  # the last epoch's, in results.json beside val/ and test/


def model_fields(model, datamodule) -> dict:
    """What a run records about its data and model: split sizes and classes, resolved head sizes, parameters,
    FLOPs per token."""
    return {"data": datamodule.describe(), **describe(model, datamodule.max_len)}


def run_fields(
    *,
    metrics: dict,
    model_facts: dict,
    throughput: dict,
    resources: dict,
    checkpoints: dict,
    progress: dict,
    wandb: dict | None,
    pack: dict | None = None,
) -> dict:
    """metrics: val/, test/ and TRAIN_METRICS numbers; model_facts: model_fields; throughput: train_tokens_per_s,
    fit_s (and a member's pack_train_tokens_per_s); resources: threads, devices, accelerator; checkpoints: best,
    last (paths or None); progress: epochs, global_step, curve; wandb: {id, url}; pack: {id, size, index}."""
    fields = {
        "metrics": dict(metrics),
        **model_facts,
        "throughput": throughput,
        "resources": resources,
        "checkpoints": checkpoints,
        "epochs": progress["epochs"],
        "global_step": progress["global_step"],
        "curve": list(progress["curve"]),
        "wandb": wandb,
    }
    return {**fields, "pack": pack} if pack is not None else fields
