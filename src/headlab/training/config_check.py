"""Validate a composed config before anything heavy is imported: one ConfigError naming key, value and rule.

Only omegaconf is imported here, so that a wrong value is reported in well under a second.
"""

from collections.abc import Callable

from omegaconf import DictConfig, ListConfig, OmegaConf

from headlab.conventions import CHOICES
from headlab.errors import ConfigError
from headlab.training.results import RESUME_KEYS


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def positive_int(v) -> bool:
    return _is_int(v) and v >= 1


def optional_positive_int(v) -> bool:
    return v is None or positive_int(v)


def probability(v) -> bool:
    return _is_number(v) and 0 <= v < 1


def one_of(*allowed) -> tuple[Callable, str]:
    return (lambda v: v in allowed), "one of " + ", ".join("null" if a is None else str(a) for a in allowed)


POSITIVE = (positive_int, "an int >= 1")
OPTIONAL_POSITIVE = (optional_positive_int, "an int >= 1 or null")
PROBABILITY = (probability, "a number in [0, 1)")

# key -> (check, what is allowed); keys absent from the config (another task, say) are skipped
RULES: dict[str, tuple[Callable, str]] = {
    "seed": (_is_int, "an int"),
    "model.d_model": POSITIVE,
    "model.n_layers": POSITIVE,
    "model.d_ff": OPTIONAL_POSITIVE,
    "model.dropout": PROBABILITY,
    "model.norm": one_of(*CHOICES["model.norm"]),
    "model.positional": one_of(*CHOICES["model.positional"]),
    "model.readout": one_of(*CHOICES["model.readout"]),
    "model.compile": (lambda v: isinstance(v, bool), "true or false"),
    "model.attention.n_heads": POSITIVE,
    "model.attention.d_k": OPTIONAL_POSITIVE,
    "model.attention.d_v": OPTIONAL_POSITIVE,
    "model.attention.n_kv_heads": OPTIONAL_POSITIVE,
    "model.attention.scoring": one_of(*CHOICES["model.attention.scoring"]),
    "model.attention.scale": (lambda v: isinstance(v, bool), "true or false"),
    "model.attention.dropout": PROBABILITY,
    "data.batch_size": POSITIVE,
    "data.n_train": POSITIVE,
    "data.n_val": POSITIVE,
    "data.n_test": POSITIVE,
    "data.num_workers": (lambda v: _is_int(v) and v >= 0, "an int >= 0"),
    "data.task.max_length": POSITIVE,
    "data.max_length": POSITIVE,
    "data.val_fraction": (lambda v: _is_number(v) and 0 < v < 1, "a number in (0, 1)"),
    "data.bucketing": (lambda v: isinstance(v, bool), "true or false"),
    "data.tokenizer.kind": one_of(*CHOICES["data.tokenizer.kind"]),
    "data.tokenizer.vocab_size": (lambda v: _is_int(v) and v > 3, "an int > 3 (room for [PAD], [UNK], [SEP])"),
    "data.task.max_depth": POSITIVE,
    "data.task.max_args": (lambda v: _is_int(v) and v >= 2, "an int >= 2"),
    "data.task.n_keys": POSITIVE,
    "data.task.n_values": POSITIVE,
    "data.task.n_pairs": POSITIVE,
    "data.task.n_queries": POSITIVE,
    "data.task.lookups": one_of(1, 2),
    "optim.lr": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "optim.weight_decay": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "optim.warmup": PROBABILITY,
    "optim.sam_rho": (lambda v: _is_number(v) and v >= 0, "a number >= 0 (0: plain AdamW steps)"),
    "optim.rdrop": (lambda v: _is_number(v) and v >= 0, "a number >= 0 (0: one pass a batch, no consistency term)"),
    "trainer.max_epochs": POSITIVE,
    "trainer.log_every_n_steps": POSITIVE,
    "trainer.gradient_clip_val": (lambda v: v is None or (_is_number(v) and v >= 0), "a number >= 0 or null"),
    "tf32": (lambda v: isinstance(v, bool), "true or false"),
    "optim.betas": (
        lambda v: isinstance(v, list | tuple | ListConfig) and len(v) == 2 and all(probability(b) for b in v),
        "two numbers in [0, 1), e.g. [0.9, 0.98]",
    ),
    "callbacks.attention.every_n_val_epochs": POSITIVE,
    "callbacks.attention.n_probe": POSITIVE,
    "callbacks.attention.importance": (lambda v: isinstance(v, bool), "true or false"),
    "callbacks.attention.pruning_step": (lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "callbacks.attention.analysis_batches": POSITIVE,
    "callbacks.attention.sentences": (
        lambda v: isinstance(v, list | tuple | ListConfig) and all(isinstance(x, str) for x in v),
        "a list of strings",
    ),
    "callbacks.attention.importance_split": one_of("train", "val", "test"),
    "callbacks.attention.pruning_split": one_of("train", "val", "test"),
    "callbacks.attention.pruning_baselines": (
        lambda v: isinstance(v, list | tuple | ListConfig) and all(x in ("reverse", "random") for x in v),
        "a list of reverse, random",
    ),
}

_ABSENT = object()


def _value(cfg: DictConfig, key: str):
    return OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False)


def fail(key: str, value, allowed: str) -> None:
    raise ConfigError(f"{key}={value!r} is invalid: expected {allowed}")


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError for the first invalid value, then for impossible combinations."""
    for key, (ok, allowed) in RULES.items():
        value = _value(cfg, key)
        if value is not _ABSENT and not ok(value):
            fail(key, value, allowed)

    att = cfg.model.attention
    if att.d_k is None and cfg.model.d_model % att.n_heads:
        rule = f"a divisor of model.d_model={cfg.model.d_model} while model.attention.d_k is null (or set d_k)"
        fail("model.attention.n_heads", att.n_heads, rule)
    if att.n_kv_heads is not None and att.n_heads % att.n_kv_heads:
        fail("model.attention.n_kv_heads", att.n_kv_heads, f"a divisor of model.attention.n_heads={att.n_heads}")
    if _value(cfg, "optim.rdrop") not in (_ABSENT, 0) and not (cfg.model.dropout or att.get("dropout")):
        rule = "0 while model.dropout and model.attention.dropout are 0 (R-Drop compares two dropout masks)"
        rule += "; set optim.rdrop=0 (text data's defaults set 3)"
        fail("optim.rdrop", cfg.optim.rdrop, rule)
    task = cfg.data.get("task", {})
    if task.get("lookups") == 2 and task.get("fused") is False:
        fail("data.task.fused", False, "true when data.task.lookups=2 (a query position holds both keys)")
    if _value(cfg, "data.task.n_pairs") is not _ABSENT and task.n_pairs > task.n_keys:
        fail("data.task.n_pairs", task.n_pairs, f"at most data.task.n_keys={task.n_keys}")
    sentences = _value(cfg, "callbacks.attention.sentences")
    if sentences not in (_ABSENT, None) and len(sentences) and not _is_text(cfg):
        target = cfg.data.get("task", {}).get("_target_", cfg.data.get("_target_"))
        fail("callbacks.attention.sentences", list(sentences), f"[] for a task generated from token ids ({target})")
    strategy = str(cfg.trainer.get("strategy", "auto"))
    if strategy.startswith("ddp") and cfg.trainer.get("devices") == 1 and cfg.trainer.get("num_nodes", 1) == 1:
        fail("trainer.devices", 1, f"at least 2 with trainer.strategy={strategy} (or trainer=cpu for one process)")


def _is_text(cfg: DictConfig) -> bool:
    """Whether the data is text read from files or the hub (probe sentences can be tokenized), not generated."""
    return str(cfg.data.get("_target_", "")).startswith("headlab.data.text.")


PACKED_CALLBACKS = {"model_checkpoint", "last_checkpoint", "progress_bar", "attention"}  # what a pack does itself
PACKED_REFUSALS = {  # why a pack refuses a callback, where there is more to say than that it would not run it
    "early_stopping": "a pack trains its members for the same epochs; the test evaluates each one's best checkpoint",
}


def check_launch(cfg: DictConfig, in_sweep: bool, launcher: str | None) -> None:
    """Strategies that re-launch the command line in every rank cannot run inside a local multirun; a pack trains
    on one device and starts its members from scratch."""
    strategy = str(cfg.trainer.get("strategy", "auto"))
    if in_sweep and launcher == "packed":
        if strategy.startswith("ddp") or cfg.trainer.get("devices") not in (1, "1", [0], None):
            fail("trainer.devices", cfg.trainer.get("devices"), "1 with hydra/launcher=packed (one device per pack)")
        if cfg.get("resume"):
            fail("resume", cfg.resume, "null with hydra/launcher=packed (resume one run with the default launcher)")
        callbacks = {k: v for k, v in (cfg.get("callbacks") or {}).items() if v is not None}
        for name in sorted(callbacks.keys() - PACKED_CALLBACKS):  # a pack would build it and never call it
            target = str(callbacks[name].get("_target_", "")).rsplit(".", 1)[-1]
            why = PACKED_REFUSALS.get(
                name, "a pack runs headlab's own callbacks only: train it with the default launcher"
            )
            fail(f"callbacks.{name}", target, f"null with hydra/launcher=packed ({why})")
    if in_sweep and strategy == "ddp" and launcher != "slurm":
        fail(
            "trainer.strategy",
            strategy,
            "ddp_spawn (or ddp_fork on CPU) inside a local sweep: Lightning's ddp "
            "re-runs the whole -m command in every rank; or keep ddp with hydra/launcher=slurm",
        )


def check_readout(readout: str | None, level: str) -> str:
    """The readout a task of this level gets: its own when null, and an error on a mismatch."""
    if readout is None:
        return "token" if level == "token" else "cls"
    if (readout == "token") != (level == "token"):
        allowed = "token (or null)" if level == "token" else "cls, mean (or null)"
        fail("model.readout", readout, f"{allowed} for this {level}-level task")
    return readout


def check_resume(cfg: DictConfig, run_dir, flat_config: dict) -> None:
    """A resumed run must be the same run: same directory, and the same config as its first attempt."""
    import json
    from pathlib import Path

    previous = Path(cfg.resume) / "results.json"
    if not (Path(cfg.resume) / "checkpoints" / "last.ckpt").exists():
        fail("resume", cfg.resume, "a run directory with checkpoints/last.ckpt")
    try:
        before = json.loads(previous.read_text())["config"]
    except (OSError, ValueError, KeyError):
        return  # a run killed before it wrote results.json: nothing to compare with
    for key in sorted(set(before) | set(flat_config)):
        if key not in RESUME_KEYS and before.get(key) != flat_config.get(key):
            fail(key, flat_config.get(key), f"{before.get(key)!r} as in the run being resumed ({cfg.resume})")
