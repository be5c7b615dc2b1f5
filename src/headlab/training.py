"""One training run: config -> data + model -> Lightning Trainer -> fit, test -> results."""

import logging
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from headlab import loggers as loggers_
from headlab import sweep
from headlab.callbacks import RandomState, SaveOnInterrupt, ThroughputMeter
from headlab.config_check import check_readout
from headlab.encoder import Encoder, count_parameters, flops_per_token
from headlab.module import HeadLabModule

# Hydra already logs to the console and to the run's train.log; Lightning's own console handler doubles each line
logging.getLogger("lightning").handlers.clear()


def _resume_checkpoint(cfg: DictConfig) -> str | None:
    """checkpoints/last.ckpt of the run being resumed (train.py checked that it exists)."""
    return str(Path(cfg.resume) / "checkpoints" / "last.ckpt") if cfg.get("resume") else None


def _best_score(checkpoint) -> float:
    """The best val/acc; read from the checkpoint file when the ranks ran in other processes (ddp_fork, spawn)."""
    if checkpoint.best_model_score is not None:
        return float(checkpoint.best_model_score)
    state = torch.load(checkpoint.best_model_path, map_location="cpu", weights_only=True)
    saved = next(v for k, v in state["callbacks"].items() if k.startswith("ModelCheckpoint"))
    return float(saved["best_model_score"])


def _instantiate_all(group: DictConfig | None) -> list:
    """Every entry of a group such as callbacks or logger; an entry set to null (callbacks.x=null) is left out."""
    return [instantiate(c) for c in (group or {}).values() if c is not None]


def _existing(path: Path) -> str | None:
    return str(path) if path.exists() else None


def _floats(metrics: dict, prefix: str) -> dict:
    return {k: float(v) for k, v in metrics.items() if k.startswith(prefix)}


def build(cfg: DictConfig) -> tuple[pl.LightningDataModule, Encoder]:
    """The datamodule and the model of a config; the model's sizes come from the data."""
    datamodule = instantiate(cfg.data, _convert_="all")
    datamodule.setup()  # before the model: its vocabulary and classes come from the data
    readout = check_readout(cfg.model.readout, datamodule.level)
    sizes = {"vocab_size": datamodule.vocab_size, "n_classes": datamodule.n_classes, "max_len": datamodule.max_len}
    return datamodule, instantiate(cfg.model, **sizes, readout=readout, _convert_="all")


def train(cfg: DictConfig, flat_config: dict, threads: int) -> dict:
    """Fit on train, select the best checkpoint on val/acc, test it; return the results.json fields it owns.

    threads: torch CPU threads for this job (the machine's cores shared among the jobs of a parallel sweep).
    """
    ranks_here = cfg.trainer.devices if cfg.trainer.accelerator == "cpu" and isinstance(cfg.trainer.devices, int) else 1
    threads = max(1, threads // max(1, ranks_here))  # CPU ranks share this job's cores
    torch.set_num_threads(threads)
    pl.seed_everything(cfg.seed, workers=True)
    datamodule, model = build(cfg)
    module = HeadLabModule(model, datamodule.n_classes, **OmegaConf.to_container(cfg.optim))
    callbacks = _instantiate_all(cfg.get("callbacks")) + [ThroughputMeter(), RandomState(), SaveOnInterrupt()]
    loggers = _instantiate_all(cfg.get("logger"))
    devices = {}
    if cfg.trainer.get("accelerator") == "gpu" and sweep.parallel_jobs() > 1:  # one GPU per job of a local sweep
        devices = {"devices": [sweep.gpu_for_job(torch.cuda.device_count())]}
    trainer: pl.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, **devices)

    failed = True
    try:
        loggers_.start(loggers, flat_config)
        fit_started = time.perf_counter()
        trainer.fit(module, datamodule=datamodule, ckpt_path=_resume_checkpoint(cfg))
        fit_seconds = time.perf_counter() - fit_started
        loggers_.resync_csv(loggers)
        metrics = _floats(trainer.callback_metrics, "val/")
        rate = _floats(trainer.callback_metrics, "perf/").get("perf/train_tokens_per_s")  # test() resets them
        checkpoint = trainer.checkpoint_callback
        best = checkpoint.best_model_path if checkpoint else ""
        if best:
            metrics["val/acc_best"] = _best_score(checkpoint)
        if datamodule.splits.get("test"):
            trainer.test(module, datamodule=datamodule, ckpt_path=best or None, verbose=False)
            metrics.update(_floats(trainer.callback_metrics, "test/"))
        failed = False
    finally:
        wandb = loggers_.finish(loggers, failed)
    params = count_parameters(model)
    return {
        "metrics": metrics,
        "data": datamodule.describe(),
        "params": {"total": params["total"], "attention": params["attention"]},
        "flops_per_token": flops_per_token(model, datamodule.max_len),
        "throughput": {"train_tokens_per_s": rate, "fit_s": round(fit_seconds, 3)},
        "resources": {"threads": threads, "devices": trainer.num_devices, "accelerator": cfg.trainer.accelerator},
        "checkpoints": {
            "best": best or None,
            "last": _existing(Path(checkpoint.dirpath) / "last.ckpt") if checkpoint else None,
        },
        "wandb": wandb,
        "epochs": trainer.current_epoch,
        "global_step": trainer.global_step,
    }
