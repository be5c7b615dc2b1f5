"""One training run: config -> data + model -> Lightning Trainer -> fit, test -> the fields of results.json."""

import logging
import os
import time
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.plugins import TorchCheckpointIO
from omegaconf import DictConfig, OmegaConf

from headlab.config import memory
from headlab.config.check import fail
from headlab.errors import ConfigError, UsageError, as_written, first_line
from headlab.files import check_received
from headlab.model import Encoder, rules
from headlab.record import TRAIN_METRICS, VAL_ACC_BEST
from headlab.training import allocator, checkpoints, cores, epochs, records
from headlab.training import loggers as loggers_
from headlab.training import progress as progress_
from headlab.training.callbacks import ExactResume, LearningCurve, RankThreads, SaveOnInterrupt, ThroughputMeter
from headlab.training.module import HeadLabModule
from headlab.training.progress_record import ProgressRecord

log = logging.getLogger("headlab")


def _resume_checkpoint(cfg: DictConfig) -> str | None:
    """checkpoints/last.ckpt of the run being resumed; None for a new run, or one killed before it wrote one (it
    starts again from its first step: the same steps, since a run repeats exactly). Anything else there by that name
    (a pipe, a link, a folder) is for check_fits to refuse."""
    last = Path(cfg.resume) / "checkpoints" / "last.ckpt" if cfg.get("resume") else None
    return str(last) if last and os.path.lexists(last) else None


def check_fits(path: str, module: pl.LightningModule) -> int:
    """The checkpoint of a resumed run must be loadable without running code from it, and fit this model;
    returns its global step."""
    try:
        checkpoint = torch.load(check_received(Path(path), limit=None), map_location="cpu", weights_only=True)
        saved = checkpoint["state_dict"]
    except Exception as error:  # pickled objects (code could run on loading them), or not a checkpoint at all
        unsafe = [line for line in str(error).splitlines() if "Unsupported global" in line]
        reason = unsafe[0].strip() if unsafe else first_line(error)
        fail("resume", path, f"a checkpoint loadable with weights_only=True, only tensors and plain types ({reason})")
    for name, tensor in module.state_dict().items():
        if name not in saved or saved[name].shape != tensor.shape:
            there = tuple(saved[name].shape) if name in saved else "no such tensor"
            fail("resume", path, f"a checkpoint of this model: {name} is {tuple(tensor.shape)} here, {there} there")
    trained = (checkpoint.get("hyper_parameters") or {}).get("design")  # none in checkpoints from before
    for key, (was, now) in _differences(trained if isinstance(trained, dict) else {}, module.hparams.design).items():
        said = f"model.{key}={as_written(was)}, and the run's config says {as_written(now)}"
        fail("resume", path, f"a checkpoint of this design: it trained with {said}")
    return int(checkpoint.get("global_step", 0))


def _differences(trained: dict, now: dict, prefix: str = "") -> dict[str, tuple]:
    """{key: (trained, now)} of the keys both designs state with different values (attention.gate, ...)."""
    found = {}
    for key in trained.keys() & now.keys():
        if isinstance(trained[key], dict) and isinstance(now[key], dict):
            found |= _differences(trained[key], now[key], f"{prefix}{key}.")
        elif trained[key] != now[key]:
            found[f"{prefix}{key}"] = (trained[key], now[key])
    return found


def _best_score(checkpoint) -> float:
    """The best val/acc; read from the checkpoint file when the ranks ran in other processes (ddp_fork, spawn)."""
    if checkpoint.best_model_score is not None:
        return float(checkpoint.best_model_score)
    state = torch.load(checkpoint.best_model_path, map_location="cpu", weights_only=True)
    states = state["callbacks"].items()  # the last-checkpoint callback's state is there too
    saved = next(v for k, v in states if k.startswith("ModelCheckpoint") and v["monitor"] == checkpoint.monitor)
    return float(saved["best_model_score"])


def instantiate_node(node: DictConfig, key: str, **kwargs):
    """hydra.utils.instantiate of the config at key, with arguments the target cannot take (+model.foo=1) as one
    ConfigError: "model: TypeError: ... unexpected keyword argument 'foo'"."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as error:
        if isinstance(error.__cause__, UsageError):
            raise error.__cause__ from None
        cause = error.__cause__ or error
        flat = "; ".join(line.strip() for line in str(cause).splitlines() if line.strip())
        raise ConfigError(f"{key}: {type(cause).__name__}: {flat}") from error


def instantiate_all(group: DictConfig | None, name: str) -> list:
    """Every entry of a group such as callbacks or logger; an entry set to null (callbacks.x=null) is left out."""
    return [instantiate_node(c, f"{name}.{key}") for key, c in (group or {}).items() if c is not None]


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, atomic: a kill or a full disk in the middle of a write leaves the previous
    checkpoint whole, never a truncated last.ckpt that a resume would trip on."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        checkpoints.save_checkpoint_atomic(checkpoint, Path(path))


def existing(path: Path) -> str | None:
    return str(path) if path.exists() else None


def _floats(metrics: dict, prefix: str) -> dict:
    return {k: float(v) for k, v in metrics.items() if k.startswith(prefix)}


def build(cfg: DictConfig, saved: Path | None = None) -> tuple[pl.LightningDataModule, Encoder]:
    """The datamodule and the model of a config; the model's sizes come from the data. saved: the data/ folder
    of a run being reloaded: text data uses the tokenizer and labels it kept (TextDataModule.keep_in)."""
    kept = saved is not None and (saved / "tokenizer.json").is_file()
    datamodule = instantiate_node(cfg.data, "data", _convert_="all", **({"saved": str(saved)} if kept else {}))
    datamodule.setup()  # before the model: its vocabulary and classes come from the data
    readout = rules.readout_for(cfg.model.readout, datamodule.level, "model.readout")
    memory.check_fits(cfg, datamodule)  # before the model is built: a model that cannot fit is one line
    sizes = {"vocab_size": datamodule.vocab_size, "n_classes": datamodule.n_classes, "max_len": datamodule.max_len}
    architecture = OmegaConf.masked_copy(cfg.model, [k for k in cfg.model if k != "compile"])
    model = instantiate_node(architecture, "model", **sizes, readout=readout, _convert_="all")
    return datamodule, model


def compile_in_place(cfg: DictConfig, model: Encoder) -> None:
    """model.compile=true where a model itself runs (Lightning's single path, the launcher's estimate): compiled in
    place, so parameter names and checkpoints stay the eager model's. A pack compiles its members' forward itself
    (headlab.training.vectorized.Stacked); build() gives the eager model."""
    if cfg.model.get("compile"):
        model.compile()


def configure_torch(cfg: DictConfig, threads: int) -> None:
    """What the process's torch should do for this run: its CPU threads, TF32 on GPUs, and no warnings that only
    repeat what headlab chose (few DataLoader workers: measured faster here, docs/speed.md; metrics.csv in the run
    directory) or are wrong (the model summary's size under mixed precision), and malloc keeping freed memory for
    the next step (headlab.training.allocator)."""
    allocator.keep_freed_memory()
    logging.getLogger("lightning").handlers.clear()  # Hydra logs to the console and train.log already: Lightning's
    # own console handler would double each line
    torch.set_num_threads(threads)
    cores.threaded |= threads > 1
    if torch.cuda.is_available():
        torch.set_float32_matmul_precision("high" if cfg.get("tf32", True) else "highest")
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    # mixed precision keeps the weights in float32: the model summary's "using 32 bits instead" is right
    warnings.filterwarnings("ignore", message=r"Precision .*-mixed is not supported by the model summary")
    # the CSV logger writes metrics.csv into the run directory, which holds results.json already: nothing is lost
    warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists and is not empty")


def _fit_progress(trainer: pl.Trainer, checkpoint, curve: LearningCurve, elsewhere: bool) -> dict:
    """epochs, global_step and the learning curve of the fit. Ranks in other processes (fork, spawn) train on
    their own trainers and send back only metrics: then these come from the last checkpoint they wrote."""
    last = Path(checkpoint.dirpath) / "last.ckpt" if checkpoint else None
    if not elsewhere or last is None or not last.exists():
        return {"epochs": trainer.current_epoch, "global_step": trainer.global_step, "curve": list(curve.points)}
    state = torch.load(last, map_location="cpu", weights_only=True)
    points = state["callbacks"].get(curve.state_key, {}).get("points", [])
    return {"epochs": state["epoch"] + 1, "global_step": state["global_step"], "curve": points}


def train(cfg: DictConfig, flat_config: dict, threads: int, run_dir: Path) -> dict:
    """Fit on train, select the best checkpoint on val/acc, test it; return the results.json fields it owns.

    threads: torch CPU threads for this job (the machine's cores shared among the jobs of a parallel sweep);
    run_dir: where it writes (its data/ folder is kept there first; a resume reads it back).
    """
    threads = cores.rank_share(cfg.trainer, threads)  # CPU ranks share this job's cores
    elsewhere = cores.rank_start(cfg.trainer) is not None
    configure_torch(cfg, 1 if elsewhere else threads)  # a job that starts its ranks only prepares and waits
    pl.seed_everything(cfg.seed, workers=True)
    datamodule, model = build(cfg, run_dir / "data" if cfg.get("resume") else None)
    compile_in_place(cfg, model)
    if cfg.get("resume"):
        records.check_same_data(run_dir, datamodule)
    elif cores.process_rank() == 0:
        datamodule.keep_in(run_dir)
    module = HeadLabModule(model, datamodule.n_classes, **OmegaConf.to_container(cfg.optim))
    resume_from = _resume_checkpoint(cfg)
    resumed_step = check_fits(resume_from, module) if resume_from else None  # before any logger or checkpoint
    # callback touches the run directory
    callbacks = instantiate_all(cfg.get("callbacks"), "callbacks")
    curve = LearningCurve()
    callbacks += [ThroughputMeter(), curve, ExactResume(), SaveOnInterrupt(), ProgressRecord([(run_dir, curve)])]
    if elsewhere:
        callbacks.append(RankThreads(threads))
    loggers = instantiate_all(cfg.get("logger"), "logger")
    devices = {}
    if cfg.trainer.get("accelerator") == "gpu" and cores.parallel_jobs() > 1:  # one GPU per job of a local sweep
        devices = {"devices": [cores.gpu_for_job(torch.cuda.device_count())]}
    plugins = [AtomicCheckpointIO(), *cores.rank_environment(cfg.trainer).get("plugins", [])]
    trainer: pl.Trainer = instantiate_node(
        cfg.trainer, "trainer", callbacks=callbacks, logger=loggers or False, plugins=plugins,
        **devices, **progress_.none_without_a_bar(callbacks, cfg.trainer), **epochs.placeholder(cfg),
    )  # fmt: skip
    epochs.resolve(trainer, cfg, datamodule)

    facts = records.model_fields(model, datamodule)
    log.info(records.model_line(facts))
    config = {**flat_config, **loggers_.run_facts(facts, flat_config)}
    metrics, failed, progress, predictions = {}, True, {}, None
    try:
        loggers_.start(loggers, config, resumed_step)
        fit_started = time.perf_counter()
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from, weights_only=True)
        fit_seconds = time.perf_counter() - fit_started
        checkpoint = trainer.checkpoint_callback
        progress = _fit_progress(trainer, checkpoint, curve, elsewhere)  # before test(), which restores the best
        # checkpoint's callback states (its curve ends at the best epoch)
        loggers_.resync_csv(loggers)
        metrics = _floats(trainer.callback_metrics, "val/")
        metrics.update({k: v for k, v in _floats(trainer.callback_metrics, "train/").items() if k in TRAIN_METRICS})
        if resume_from and "val/acc" not in metrics:  # resumed after its training ended (in the head analysis,
            trainer.validate(module, datamodule=datamodule, verbose=False)  # the test): the last epoch's numbers
            metrics = _floats(trainer.callback_metrics, "val/")
        rate = _floats(trainer.callback_metrics, "perf/").get("perf/train_tokens_per_s")  # test() resets them
        best = checkpoint.best_model_path if checkpoint else ""
        if best:
            metrics[VAL_ACC_BEST] = _best_score(checkpoint)
        if datamodule.splits.get("test"):
            trainer.test(module, datamodule=datamodule, ckpt_path=best or None, verbose=False, weights_only=True)
            metrics.update(_floats(trainer.callback_metrics, "test/"))
            if trainer.world_size == 1:  # with DDP each rank tests a share of the examples
                predictions = module.kept.fields()[0]
        failed = False
    finally:
        wandb = loggers_.finish(loggers, failed, metrics, config, progress.get("global_step", trainer.global_step))
    return records.run_fields(
        metrics=metrics,
        model_facts=facts,
        throughput={"train_tokens_per_s": rate, "fit_s": round(fit_seconds, 3)},
        resources={"threads": threads, "devices": trainer.num_devices, "accelerator": cfg.trainer.accelerator},
        checkpoints={
            "best": best or None,
            "last": existing(Path(checkpoint.dirpath) / "last.ckpt") if checkpoint else None,
        },
        progress=progress,
        wandb=wandb,
        predictions=predictions,
    )
