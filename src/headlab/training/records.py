"""The fields of results.json that a run owns once it has trained, stated once for single runs and pack members
(the job around it adds status, config, seed, commit and versions: headlab.launch.job)."""

import json
import logging
from pathlib import Path

from headlab.errors import DataError
from headlab.files import read_received
from headlab.model import describe

log = logging.getLogger("headlab")


def model_fields(model, datamodule) -> dict:
    """What a run records about its data and model: split sizes and classes, resolved head sizes, parameters,
    FLOPs per token."""
    return {"data": datamodule.describe(), **describe(model, datamodule.max_len)}


def model_line(facts: dict) -> str:
    """The model in one line, from model_fields: parameters, heads and their sizes, training FLOPs a token."""
    heads, params = facts["heads"], facts["params"]
    kv = f", {heads['n_kv_heads']} key/value heads" if heads["n_kv_heads"] != heads["n_heads"] else ""
    return (
        f"model: {params['total']:,} parameters ({params['attention']:,} in attention), {heads['n_heads']} heads of "
        f"d_k {heads['d_k']}, d_v {heads['d_v']}{kv}, feed-forward {facts['d_ff']}; "
        f"{facts['flops_per_token']:,} training FLOPs a token"
    )


def run_fields(
    *,
    metrics: dict,
    model_facts: dict,
    throughput: dict,
    resources: dict,
    checkpoints: dict,
    progress: dict,
    wandb: dict | None,
    predictions: dict | None = None,
    pack: dict | None = None,
) -> dict:
    """metrics: val/, test/ and TRAIN_METRICS numbers; model_facts: model_fields; throughput: train_tokens_per_s,
    fit_s (and a member's pack_train_tokens_per_s); resources: threads, devices, accelerator; checkpoints: best,
    last (paths or None); progress: epochs, global_step, curve; wandb: {id, url}; predictions: the test
    predictions (headlab.stats.predictions) or None; pack: {id, size, index}."""
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
        "predictions": predictions,
    }
    return {**fields, "pack": pack} if pack is not None else fields


def check_same_data(run_dir: Path, datamodule) -> None:
    """A reload of a run (resume, headlab-eval, headlab-heads) must prepare the data the run trained on: the digests
    it kept in data/digests.json against those of the data prepared now, in one line naming what differs."""
    try:
        kept = json.loads(read_received(Path(run_dir) / "data" / "digests.json"))
    except (OSError, ValueError):
        log.warning("%s kept no data digests (a run made before headlab kept them): its data is not checked", run_dir)
        return
    now = datamodule.describe()["digests"]
    short = lambda digest: f"{str(digest)[:12]}..."  # noqa: E731
    for role, digest in (kept.get("files") or {}).items():
        if (now.get("files") or {}).get(role) != digest:
            where = datamodule.files.get(role) if hasattr(datamodule, "files") else role
            raise DataError(
                f"data.files.{role}: {where} is not the file {run_dir} trained on (sha256 {short(digest)} then, "
                f"{short((now.get('files') or {}).get(role))} now)"
            )
    if kept.get("tokenizer") not in (None, now.get("tokenizer")):
        raise DataError(f"the tokenizer in {run_dir}/data is not the one the run trained with (its digest differs)")
    for role, digest in (kept.get("splits") or {}).items():
        if now["splits"].get(role) != digest:
            raise DataError(
                f"the {role} split prepared now differs from the one {run_dir} trained on (sha256 {short(digest)} "
                f"then, {short(now['splits'].get(role))} now): the data or its preparation changed"
            )
