"""Validate a composed config before anything heavy is imported: one ConfigError naming key, value and rule.

Only omegaconf (and the model's and tasks' own rules, which need no torch) is imported here, so that a wrong
value is reported in well under a second. The types of keys are checked here; the rules of the model
(headlab.model.rules) and of a generated task (its `check`) are theirs, called with the config's key names.
"""

import difflib
import importlib
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from headlab.config.callbacks import check_callbacks, pack_refusal
from headlab.config.memory import check_device
from headlab.conventions import ADDED_KEYS, SPLITS
from headlab.errors import ConfigError, fail
from headlab.model import rules
from headlab.printing import seconds_of
from headlab.record import OBJECTIVES


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
METRIC = (lambda v: v in OBJECTIVES, f"a metric of every run's record: {', '.join(OBJECTIVES)}")
SEED = (lambda v: _is_int(v) and 0 <= v < 2**32, "an int in [0, 2**32)")
BOOLEAN = (lambda v: isinstance(v, bool), "true or false")
PATH = (lambda v: v is None or isinstance(v, str), "a path, or null (quote one that reads as a number: '5')")
NAME = (lambda v: v is None or isinstance(v, str), "a name, or null (quote one that reads as a number: '5')")


def names(v) -> bool:
    """A list of names (strings)."""
    return isinstance(v, list | tuple | ListConfig) and all(isinstance(x, str) for x in v)


def devices(v) -> bool:
    """Lightning's trainer.devices: a count, -1 (every device), auto, or device indices ([0, 1] or '0,1')."""
    if isinstance(v, str):
        return v == "auto" or all(i.strip().isdigit() for i in v.split(","))
    if isinstance(v, list | tuple | ListConfig):
        return len(v) > 0 and all(_is_int(i) and i >= 0 for i in v)
    return positive_int(v) or v == -1


# key -> (check, what is allowed); keys absent from the config (another task, say) are skipped
RULES: dict[str, tuple[Callable, str]] = {
    "seed": SEED,
    "data.cv.seed": SEED,
    "model.d_model": POSITIVE,
    "model.n_layers": POSITIVE,
    "model.d_ff": OPTIONAL_POSITIVE,
    "model.dropout": PROBABILITY,
    "model.norm": one_of(*rules.NORMS),
    "model.positional": one_of(*rules.POSITIONALS),
    "model.rope_base": (lambda v: _is_number(v) and v > 1, "a number > 1 (rotary angles base^(-2i/d_k))"),
    "model.readout": one_of(None, *rules.READOUTS),
    "model.compile": BOOLEAN,
    "pack.compute": one_of("auto", "each", "batched"),
    "model.attention.n_heads": POSITIVE,
    "model.attention.d_k": OPTIONAL_POSITIVE,
    "model.attention.d_v": OPTIONAL_POSITIVE,
    "model.attention.n_kv_heads": OPTIONAL_POSITIVE,
    "model.attention.scale": BOOLEAN,
    "model.attention.dropout": PROBABILITY,
    "model.attention.talking_heads": one_of(*rules.TALKING_HEADS),
    "model.attention.differential": BOOLEAN,
    "model.attention.qk_norm": BOOLEAN,
    "model.attention.latent_kv": (optional_positive_int, "an int >= 1 (the latent's rank) or null"),
    "model.attention.value_residual": BOOLEAN,
    "data.batch_size": POSITIVE,
    "data.n_train": POSITIVE,
    "data.n_val": POSITIVE,
    "data.n_test": POSITIVE,
    "data.num_workers": (lambda v: _is_int(v) and v >= 0, "an int >= 0"),
    "data.max_length": POSITIVE,
    "data.val_fraction": (lambda v: _is_number(v) and 0 < v < 1, "a number in (0, 1)"),
    "data.bucketing": BOOLEAN,
    "data.tokenizer.kind": one_of("wordpiece", "bpe"),
    "data.tokenizer.vocab_size": (lambda v: _is_int(v) and v > 3, "an int > 3 (room for [PAD], [UNK], [SEP])"),
    "optim.lr": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "optim.weight_decay": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "optim.warmup": PROBABILITY,
    "optim.sam_rho": (lambda v: _is_number(v) and v >= 0, "a number >= 0 (0: plain AdamW steps)"),
    "optim.rdrop": (lambda v: _is_number(v) and v >= 0, "a number >= 0 (0: one pass a batch, no consistency term)"),
    "trainer.max_epochs": (lambda v: v == "auto" or positive_int(v), "an int >= 1, or auto (auto_epochs)"),
    "sweep.objective": METRIC,
    "sweep.dry_run": (lambda v: v in (True, False, "json"), "true, false or json (--dry-run, --dry-run --json)"),
    "sweep.sequential.looks": (lambda v: v is None or (_is_int(v) and v >= 2), "an int >= 2 (rounds) or null"),
    "sweep.sequential.baseline": (
        lambda v: v is None or (isinstance(v, str) and "=" in v and all(v.partition("=")[::2])),
        "KEY=VALUE, the arm every other is read against",
    ),
    "sweep.sequential.metric": METRIC,
    "sweep.sequential.effect": (lambda v: v is None or (_is_number(v) and v > 0), "a number > 0 or null"),
    "sweep.sequential.alpha": (lambda v: _is_number(v) and 0 < v < 1, "a number between 0 and 1"),
    "sweep.plan.prior": (
        lambda v: v is None or Path(str(v)).exists(),
        "an earlier sweep's directory or archive that exists",
    ),
    "sweep.plan.baseline": (
        lambda v: v is None or (isinstance(v, str) and all(v.partition("=")[::2]) and "=" in v),
        "KEY=VALUE, e.g. --baseline design=plain",
    ),
    "sweep.plan.metric": METRIC,
    "sweep.plan.effect": (
        lambda v: v is None or (_is_number(v) and v > 0),
        "a number > 0 (the difference that matters)",
    ),
    "sweep.plan.budget": (lambda v: v is None or seconds_of(v) is not None, "a duration: 30m, 2h, 1h30m, 90s"),
    "sweep.extend.select_on": METRIC,
    "sweep.extend.factor": (lambda v: _is_number(v) and v > 1, "a number > 1 (past the top: x factor; the bottom: /)"),
    "sweep.extend.limit": POSITIVE,
    "auto_epochs.steps": POSITIVE,
    "auto_epochs.min": POSITIVE,
    "auto_epochs.max": POSITIVE,
    "auto_epochs.scale": POSITIVE,
    "trainer.log_every_n_steps": POSITIVE,
    "trainer.deterministic": (lambda v: v is None or isinstance(v, bool) or v == "warn", "true, false, warn or null"),
    "trainer.enable_model_summary": BOOLEAN,
    "trainer.devices": (devices, "an int >= 1, -1 (every device), auto, or device indices ([0, 1] or '0,1')"),
    "data.n_classes": (lambda v: v is None or (_is_int(v) and v >= 2), "an int >= 2, or null (from the labels)"),
    "data.tokenizer.lowercase": BOOLEAN,
    **dict.fromkeys(("data.files.train", "data.files.val", "data.files.test", "data.tokenizer.path"), PATH),
    "data.cache_dir": PATH,
    **dict.fromkeys(("data.hub", "data.hub_splits.train", "data.hub_splits.val", "data.hub_splits.test"), NAME),
    **dict.fromkeys(("data.files.encoding", "data.tokenizer.hub", "data.text_pair_column"), NAME),
    "data.column_names": (
        lambda v: v is None or names(v) or (isinstance(v, DictConfig) and all(names(n) for n in v.values())),
        "a list of names, for every file or per split ({test: [...]}), or null (the files' header row)",
    ),
    "sweep.resume": BOOLEAN,
    "logger.tensorboard.default_hp_metric": BOOLEAN,
    "callbacks.progress_bar.every_s": (lambda v: _is_number(v) and v > 0, "a number of seconds > 0"),
    "callbacks.progress_bar.every_n_steps": POSITIVE,
    "trainer.gradient_clip_val": (lambda v: v is None or (_is_number(v) and v >= 0), "a number >= 0 or null"),
    "tf32": BOOLEAN,
    "optim.betas": (
        lambda v: isinstance(v, list | tuple | ListConfig) and len(v) == 2 and all(probability(b) for b in v),
        "two numbers in [0, 1), e.g. [0.9, 0.98]",
    ),
    "callbacks.attention.every_n_val_epochs": POSITIVE,
    "callbacks.attention.figures_every_n_val_epochs": (lambda v: _is_int(v) and v >= 0, "an int >= 0 (0: no figures)"),
    "callbacks.attention.n_probe": POSITIVE,
    "callbacks.attention.importance": BOOLEAN,
    "callbacks.attention.pruning_step": (lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "callbacks.attention.analysis_batches": POSITIVE,
    "callbacks.attention.causal_batches": (lambda v: _is_int(v) and v >= 0, "an int >= 0 (0: no causal analysis)"),
    "callbacks.attention.sentences": (
        lambda v: isinstance(v, list | tuple | ListConfig) and all(isinstance(x, str) for x in v),
        "a list of strings",
    ),
    "callbacks.attention.importance_split": one_of(*SPLITS),
    "callbacks.attention.pruning_split": one_of(*SPLITS),
    "callbacks.attention.pruning_baselines": (
        lambda v: isinstance(v, list | tuple | ListConfig) and all(x in ("reverse", "random") for x in v),
        "a list of reverse, random",
    ),
}

_ABSENT = object()


def _value(cfg: DictConfig, key: str):
    return OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False)


ENTRIES = {"callbacks": "a callback's", "logger": "a logger's"}  # each entry a component's config, or null (off)
# The config's other sections (keys whose value is keys of their own) -> whether null is allowed: those RULES checks
# a key of (optim, sweep.plan, ...), those a run reads besides, those of an experiment's pre-stated analysis.
SECTIONS = {
    **{
        key.rsplit(".", i)[0]: False
        for key in RULES
        for i in range(1, key.count(".") + 1)
        if key.partition(".")[0] not in ENTRIES  # callbacks.attention: an entry
    },
    **dict.fromkeys(("data.task", "data.cv", "data.files", "data.hub_splits"), False),
    **dict.fromkeys(("compare", "confirm", *ENTRIES), True),
}


def section_rule(key: str) -> str:
    """What a section (SECTIONS) or an entry of ENTRIES takes, said where it is given one value instead."""
    group, dot, _ = key.partition(".")
    if group in ENTRIES and dot:  # callbacks.attention, logger.wandb
        return f"{ENTRIES[group]} config (its _target_ and arguments), or null"
    return f"keys of its own{' or null' if SECTIONS.get(key) else ''}: set one of them as {key}.<key>=..."


def check_sections(cfg: DictConfig) -> None:
    """A section given one value in place of its keys (optim=5, sweep.plan=3) is refused by its name here, before
    anything reads a key of it: a single run in one line; a sweep before its first job where every job has it
    (headlab.launch.job.check_sweep), else each job that has it is recorded as failed. A list in place of a
    section's keys fails as Hydra merges it (headlab.cli.hydra_errors)."""
    for key, nullable in SECTIONS.items():
        value = _value(cfg, key)
        if value is not _ABSENT and not isinstance(value, DictConfig) and not (nullable and value is None):
            fail(key, value, section_rule(key))
    for group in [g for g in ENTRIES if isinstance(_value(cfg, g), DictConfig)]:
        for name, node in cfg[group].items():
            if node is not None and not isinstance(node, DictConfig):
                fail(f"{group}.{name}", node, section_rule(f"{group}.{name}"))


def check_model_keys(cfg: DictConfig) -> None:
    """Every key under model and model.attention is one the model takes (conf/model/encoder.yaml states them all):
    a key added with + (model.attention.gaet, a typo of gate) would fail only when the model is built, after the
    data is prepared. Skipped for a model of another class (model._target_), whose keys are its own."""
    shipped = OmegaConf.load(files("headlab.conf").joinpath("model", "encoder.yaml"))
    if _value(cfg, "model._target_") != shipped._target_:
        return
    for prefix, node, known in (
        ("model", cfg.model, shipped),
        ("model.attention", cfg.model.attention, shipped.attention),
    ):
        names = [k for k in known if not k.startswith("_")]
        for key in node:
            if key not in known:
                near = difflib.get_close_matches(key, names, n=1)
                meant = f"did you mean {prefix}.{near[0]}? " if near else ""
                raise ConfigError(
                    f"{prefix}.{key} is not a key of the model: {meant}expected one of {', '.join(names)}"
                )


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError for the first invalid value, then for impossible combinations."""
    check_sections(cfg)
    check_model_keys(cfg)
    for key, (ok, allowed) in RULES.items():
        value = _value(cfg, key)
        if value is not _ABSENT and not ok(value):
            fail(key, value, allowed)

    att = cfg.model.attention
    on_model = {"d_model": "model.d_model", "position": "model.positional"}
    model_key = lambda key: on_model.get(key, f"model.attention.{key}")  # noqa: E731
    added = {k.removeprefix("model.attention."): v for k, v in ADDED_KEYS.items() if k.startswith("model.attention.")}
    design = {key: att.get(key, default) for key, default in added.items()}  # a config saved before the keys
    d_k, _, _ = rules.head_sizes(
        cfg.model.d_model, att.n_heads, att.d_k, att.d_v, att.n_kv_heads, model_key, design["differential"]
    )
    rules.check_stage("scoring", att.scoring, "model.attention.scoring")
    rules.designs(
        design["differential"],
        design["talking_heads"],
        design["normalizer"],
        design["gate"],
        design["latent_kv"],
        model_key,
    )
    mta = design["mta"]
    mta = OmegaConf.to_container(mta) if isinstance(mta, DictConfig) else mta
    rules.multi_token(mta, att.n_heads, design["differential"], design["talking_heads"], model_key)
    moh = design["moh"]
    rules.mixture_of_heads(OmegaConf.to_container(moh) if isinstance(moh, DictConfig) else moh, att.n_heads, model_key)
    positional = cfg.model.get("positional")
    rules.position_in_heads(positional if positional in rules.IN_HEADS else "none", att.scoring, d_k, model_key)
    if design["value_residual"] and cfg.model.n_layers == 1:
        fail(
            "model.attention.value_residual",
            True,
            "false while model.n_layers=1 (the first layer's values mix into later layers')",
        )
    if _value(cfg, "optim.rdrop") not in (_ABSENT, 0) and not (cfg.model.dropout or att.get("dropout")):
        rule = "0 while model.dropout and model.attention.dropout are 0 (R-Drop compares two dropout masks)"
        rule += "; set optim.rdrop=0 (text data's defaults set 3)"
        fail("optim.rdrop", cfg.optim.rdrop, rule)
    check_task(cfg)
    check_device(cfg)
    check_callbacks(cfg)
    least, most = _value(cfg, "auto_epochs.min"), _value(cfg, "auto_epochs.max")
    if _ABSENT not in (least, most) and least > most:
        fail("auto_epochs.min", least, f"at most auto_epochs.max ({most})")
    if _is_text(cfg) and cfg.data.get("hub") is None:  # files that are not there: before anything is imported
        from headlab.data.text_files import local_paths

        local_paths(OmegaConf.to_container(cfg.data.files, resolve=True))
    if _is_text(cfg):
        if cfg.data.get("empty_text", "refuse") not in ("refuse", "keep"):
            fail("data.empty_text", cfg.data.empty_text, "refuse or keep")
        check_cross_validation(cfg.data)
    sentences = _value(cfg, "callbacks.attention.sentences")
    if sentences not in (_ABSENT, None) and len(sentences) and not _is_text(cfg):
        target = cfg.data.get("task", {}).get("_target_", cfg.data.get("_target_"))
        fail("callbacks.attention.sentences", list(sentences), f"[] for a task generated from token ids ({target})")
    strategy = str(cfg.trainer.get("strategy", "auto"))
    if strategy.startswith("ddp") and cfg.trainer.get("devices") == 1 and cfg.trainer.get("num_nodes", 1) == 1:
        fail("trainer.devices", 1, f"at least 2 with trainer.strategy={strategy} (or trainer=cpu for one process)")


def check_cross_validation(data: DictConfig) -> None:
    """data.cv: k folds (2 or more) of data without a test split, and the fold a run tests among them."""
    cv = data.get("cv") or {}
    k, fold = cv.get("folds"), cv.get("fold")
    if k is None:
        if fold is not None:
            fail("data.cv.fold", fold, "null without data.cv.folds (set data.cv.folds=k for k-fold cross-validation)")
        return
    if not isinstance(k, int) or isinstance(k, bool) or k < 2:
        fail("data.cv.folds", k, "an integer of 2 or more (or null: no cross-validation)")
    test = (
        (data.get("files") or {}).get("test") if data.get("hub") is None else (data.get("hub_splits") or {}).get("test")
    )
    if test:
        which = "data.files.test" if data.get("hub") is None else "data.hub_splits.test"
        fail(
            "data.cv.folds",
            k,
            f"null: the data has a test split ({which}={test}); cross-validation is for data without one",
        )
    if fold is None:
        fail("data.cv.fold", fold, f"the fold this run tests, 0..{k - 1} (headlab-train -m runs one job per fold)")
    if not isinstance(fold, int) or isinstance(fold, bool) or not 0 <= fold < k:
        fail("data.cv.fold", fold, f"a fold of 0..{k - 1}")


def check_task(cfg: DictConfig) -> None:
    """The rules of a generated task, stated by the task class itself (its static `check`, headlab.data.task)."""
    task = _value(cfg, "data.task")
    if task in (_ABSENT, None) or "_target_" not in task:
        return
    module, _, name = str(task._target_).rpartition(".")
    try:
        check = getattr(getattr(importlib.import_module(module), name), "check", None)
    except (ImportError, AttributeError, ValueError) as error:  # ValueError: no module named (_target_=5)
        fail("data.task._target_", str(task._target_), f"an importable task class ({error})")
    if check is not None:
        settings = {k: v for k, v in OmegaConf.to_container(task, resolve=True).items() if k != "_target_"}
        try:
            check(**settings, name=lambda key: f"data.task.{key}")
        except TypeError as error:  # a setting the task does not take
            raise ConfigError(f"data.task: {error}") from None


def _is_text(cfg: DictConfig) -> bool:
    """Whether the data is text read from files or the hub (probe sentences can be tokenized), not generated."""
    return str(cfg.data.get("_target_", "")).startswith("headlab.data.text.")


PACKED_LAUNCHERS = ("packed", "packed_slurm")


def check_launch(cfg: DictConfig, in_sweep: bool, launcher: str | None, user_resume: bool = False) -> None:
    """Strategies that re-launch the command line in every rank cannot run inside a local multirun; a pack trains
    on one device, and continues its members only where headlab does (sweep.resume, a requeue), not resume=."""
    strategy = str(cfg.trainer.get("strategy", "auto"))
    if in_sweep and launcher in PACKED_LAUNCHERS:
        if (refused := pack_refusal(cfg)) is not None:
            key, value, allowed, why = refused
            fail(key, value, f"{allowed} with hydra/launcher={launcher} ({why})")
        if user_resume:
            fail(
                "resume", cfg.resume, f"null with hydra/launcher={launcher} (resume one run with the default launcher)"
            )
    if in_sweep and strategy == "ddp" and launcher != "slurm":
        fail(
            "trainer.strategy",
            strategy,
            "ddp_spawn (or ddp_fork on CPU) inside a local sweep: Lightning's ddp "
            "re-runs the whole -m command in every rank; or keep ddp with hydra/launcher=slurm",
        )
