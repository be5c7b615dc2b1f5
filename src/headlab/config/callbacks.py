"""A run's callbacks as headlab runs them: those a pack does itself (its checkpoints, progress, head logging, early
stopping), the checkpoint settings it keeps as shipped, Lightning's callbacks that would set what the config states,
and what a pack of several members cannot run."""

from importlib.resources import files

from omegaconf import DictConfig, OmegaConf

from headlab.errors import as_written, fail

PACKED_CALLBACKS = {"model_checkpoint", "last_checkpoint", "progress_bar", "attention"}  # what a pack does itself
PACKED_TARGETS = {  # callbacks a pack runs for each member (headlab.training.pack.stopping), under any name
    "lightning.pytorch.callbacks.EarlyStopping",
    "lightning.pytorch.callbacks.early_stopping.EarlyStopping",
}
CHECKPOINTS = ("model_checkpoint", "last_checkpoint")  # written by headlab itself: headlab.training.pack.writer
CHECKPOINT_TARGETS = {
    "lightning.pytorch.callbacks.ModelCheckpoint",
    "lightning.pytorch.callbacks.model_checkpoint.ModelCheckpoint",
}
OLDER_KEYS = {"save_last"}  # set by the model_checkpoint of runs recorded by an older headlab, which still resume
SETTING_THE_CONFIG = {  # Lightning's callbacks that would set what a run's config states (its record would not say)
    "StochasticWeightAveraging": "a learning-rate schedule of its own, where headlab's sets the rate (optim.warmup, "
    "cosine): EMAWeightAveraging averages the weights alone",
    "LearningRateFinder": "a learning rate of its choosing: sweep optim.lr",
    "BatchSizeFinder": "a batch size of its choosing: set data.batch_size",
}


def check_callbacks(cfg: DictConfig) -> None:
    """A run's checkpoints as shipped (conf/callbacks/default.yaml): headlab writes them itself, the best by val/acc
    and last.ckpt after every validation, which resume=, headlab-heads, headlab-eval and the records read; a setting
    of theirs changed or added, either switched off, or a ModelCheckpoint of one's own would go unheeded: refused.
    So are Lightning's callbacks that would set what the config states (SETTING_THE_CONFIG)."""
    shipped = OmegaConf.load(files("headlab.conf").joinpath("callbacks", "default.yaml"))
    callbacks = cfg.get("callbacks") or {}
    why = "headlab writes a run's checkpoints itself: its best by val/acc, and last.ckpt after every validation"
    for name, node in callbacks.items():  # each a mapping or null (headlab.config.check.check_sections)
        target = str(node.get("_target_", "")) if node is not None else ""
        if name not in CHECKPOINTS and target in CHECKPOINT_TARGETS:
            fail(f"callbacks.{name}._target_", target, f"another callback ({why})")
        sets = SETTING_THE_CONFIG.get(target.rsplit(".", 1)[-1])
        if target.startswith("lightning.pytorch.callbacks.") and sets:
            fail(f"callbacks.{name}._target_", target, f"another callback (it would train with {sets})")
    for name in CHECKPOINTS:
        given = callbacks.get(name)
        if given is None:
            fail(f"callbacks.{name}", None, f"the shipped checkpoint ({why})")
        given, expected = OmegaConf.to_container(given, resolve=False), OmegaConf.to_container(shipped[name])
        for key in sorted((given.keys() | expected.keys()) - OLDER_KEYS):
            if key in given and given[key] != expected.get(key):
                allowed = as_written(expected[key]) if key in expected else "the key left out"
                fail(f"callbacks.{name}.{key}", given[key], f"{allowed} ({why})")


def pack_refusal(cfg: DictConfig) -> tuple[str, object, str, str] | None:
    """Why a pack of several members cannot train this run, as (key, value, the value a pack takes, why); None
    where it can: one device, and headlab's own callbacks and Lightning's early stopping only (callbacks_refusal).
    A pack of one (headlab-train's run) trains on several devices, and runs callbacks of its own, too."""
    strategy = str(cfg.trainer.get("strategy", "auto"))
    if strategy.startswith("ddp") or cfg.trainer.get("devices") not in (1, "1", [0], None):
        return "trainer.devices", cfg.trainer.get("devices"), "1", "one device per pack"
    return callbacks_refusal(cfg)


def callbacks_refusal(cfg: DictConfig) -> tuple[str, object, str, str] | None:
    """A callback of the run's own, which a pack of several members would build and never call (a pack of one runs
    it: headlab.training.pack.train.own_callbacks), as pack_refusal says it; None where every callback is headlab's
    own or Lightning's early stopping."""
    callbacks = {k: v for k, v in (cfg.get("callbacks") or {}).items() if v is not None}
    for name in sorted(callbacks.keys() - PACKED_CALLBACKS):
        target = str(callbacks[name].get("_target_", ""))
        if target not in PACKED_TARGETS:
            why = "a pack of several runs headlab's own callbacks and early stopping only: the default launcher runs it"
            return f"callbacks.{name}", target.rsplit(".", 1)[-1], "null", why
    return None
