"""What a run is built from: its config's data and model (build), its objects instantiated from config nodes, its
process's torch set up, and the checks that a checkpoint it resumes from fits it."""

import logging
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from headlab.config import memory
from headlab.errors import ConfigError, UsageError, as_written, fail, first_line
from headlab.files import check_received
from headlab.model import Encoder, rules
from headlab.training import allocator, cores


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


def existing(path: Path) -> str | None:
    return str(path) if path.exists() else None


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
    """model.compile=true where a model itself runs (the dry run's and the launcher's estimate): compiled in
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
