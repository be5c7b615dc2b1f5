"""A run on Lightning's own loop, the tests' reference for what headlab-train's packs compute: the run's config
composed as the CLI composes it, its data and model built by headlab (build), trained by HeadLabModule (a single
run's objective and AdamW) in a plain Lightning Trainer with the config's checkpoints, early stopping and CSV
logger, then its best checkpoint tested. Neither a pack nor headlab's writer is involved."""

from pathlib import Path

import lightning.pytorch as pl
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict

from headlab.record import TRAIN_METRICS, VAL_ACC_BEST
from headlab.training.build import build
from headlab.training.module import HeadLabModule

ONLY_HEADLAB = ("attention", "progress_bar")  # headlab's head logging and progress lines: not Lightning's


def lightning_run(overrides: list[str], run_dir: Path) -> dict:
    """Train the run of these overrides into run_dir (its checkpoints/ and metrics.csv); returns the fields of its
    results.json it computes: metrics (val/*, the epoch's train/acc and train/loss_epoch, val/acc_best, test/*),
    epochs and global_step."""
    GlobalHydra.instance().clear()
    with initialize_config_module("headlab.conf", version_base="1.3"):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(run_dir)  # what ${hydra:runtime.output_dir} names
    HydraConfig.instance().set_config(cfg)
    try:
        pl.seed_everything(cfg.seed, workers=True)  # then built: the random state a run's dropout starts from
        datamodule, model = build(cfg)
        module = HeadLabModule(model, datamodule.n_classes, **OmegaConf.to_container(cfg.optim))
        callbacks = [instantiate(c) for k, c in cfg.callbacks.items() if c is not None and k not in ONLY_HEADLAB]
        loggers = [instantiate(c) for c in cfg.logger.values() if c is not None]
        trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers, enable_progress_bar=False)
        trainer.fit(module, datamodule=datamodule)
        measured = {k: float(v) for k, v in trainer.callback_metrics.items()}
        metrics = {k: v for k, v in measured.items() if k.startswith("val/") or k in TRAIN_METRICS}
        epochs, step, best = trainer.current_epoch, trainer.global_step, trainer.checkpoint_callback
        metrics[VAL_ACC_BEST] = float(best.best_model_score)
        trainer.test(module, datamodule=datamodule, ckpt_path=best.best_model_path, verbose=False, weights_only=True)
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")})
    finally:
        HydraConfig.instance().cfg = None
        GlobalHydra.instance().clear()
    return {"metrics": metrics, "epochs": epochs, "global_step": step}
