"""Will it fit? A GPU run on a machine without one is refused before anything is imported; the memory a run needs to
train (headlab.model.rules.training_bytes, from its config and its data's sizes) against what the device it trains on
has free: a run that cannot fit is refused before its model is built, and a pack holds as many members as fit."""

import copy
import os
import shutil
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from headlab.errors import ConfigError, fail
from headlab.model import rules


def check_device(cfg: DictConfig) -> None:
    """A GPU run on a machine without an NVIDIA GPU (no driver: no /dev/nvidiactl, no nvidia-smi), without torch."""
    accelerator = str(cfg.trainer.get("accelerator"))
    no_driver = not Path("/dev/nvidiactl").exists() and shutil.which("nvidia-smi") is None
    if accelerator in ("gpu", "cuda") and sys.platform == "linux" and no_driver:
        fail(
            "trainer.accelerator",
            accelerator,
            "cpu on this machine, which has no NVIDIA GPU (no driver found): trainer=cpu",
        )


SHARE = 0.7  # of the free memory a run (or a pack's members together) may plan to take


def model_bytes(cfg: DictConfig, datamodule) -> int:
    """training_bytes of the config's model on this data (its vocabulary, classes and longest example)."""
    model, att = cfg.model, cfg.model.attention
    maps = 2 if att.get("differential") else 1
    d_k, d_v, n_kv_heads = rules.head_sizes(
        model.d_model, att.n_heads, att.d_k, att.d_v, att.n_kv_heads, differential=maps == 2
    )
    gate_width = rules.load_stage("gate", att.get("gate") or "none").width(att.n_heads, d_v)  # the gate says
    gate_width += (att.n_heads + 2) * bool(att.get("moh"))  # mixture of heads' routers, as wide as a headwise gate
    readout = rules.readout_for(model.readout, datamodule.level)
    return rules.training_bytes(
        vocab_size=datamodule.vocab_size,
        n_classes=datamodule.n_classes,
        positions=datamodule.max_len + (readout == "cls"),
        batch_size=datamodule.batch_size,
        d_model=model.d_model,
        n_layers=model.n_layers,
        d_ff=model.d_ff or 4 * model.d_model,
        n_heads=att.n_heads,
        d_k=d_k,
        d_v=d_v,
        n_kv_heads=n_kv_heads,
        maps=maps,
        latent_kv=att.get("latent_kv"),
        gate_width=gate_width,
        two_passes=bool(cfg.optim.get("rdrop")),
        ascent=bool(cfg.optim.get("sam_rho")),
        rotary=model.get("positional") == "rope",
        alibi=model.get("positional") == "alibi",
        value_residual=bool(att.get("value_residual")),
        mta=bool(att.get("mta")),
    )


def free_bytes(accelerator: str) -> int:
    """Free memory of the device a run trains on: the GPU's, or the host's available memory."""
    import torch

    if accelerator in ("gpu", "cuda") and torch.cuda.is_available():
        return torch.cuda.mem_get_info()[0]
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
        meminfo = dict(line.split(":", 1) for line in lines if ":" in line)
        return int(meminfo["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fits(cfg: DictConfig, datamodule) -> None:
    """Refuse, in one line, a model that would not fit in SHARE of the free memory of its device, naming the sizes
    that cost it most (largest_costs)."""
    need, free = model_bytes(cfg, datamodule), free_bytes(str(cfg.trainer.get("accelerator")))
    if need > SHARE * free:
        lower = [f"{key} ({value})" for key, value in largest_costs(cfg, datamodule, need)]
        raise ConfigError(
            f"this model needs about {need / 2**30:.1f} GiB to train (an estimate), and {free / 2**30:.1f} GiB are "
            f"free: lower what costs most, {', '.join(lower[:-1])} or {lower[-1]}"
        )


SIZES = (  # what a run's memory grows with (the estimate of model_bytes)
    *(f"model.attention.{k}" for k in ("d_k", "d_v", "n_heads", "n_kv_heads", "latent_kv")),
    *(f"model.{k}" for k in ("d_model", "d_ff", "n_layers")),
    "data.batch_size",
)


def largest_costs(cfg: DictConfig, datamodule, need: int, most: int = 3) -> list[tuple[str, int]]:
    """The `most` sizes of SIZES whose halving saves the most memory, with their values, largest saving first."""
    saved = {}
    for key in SIZES:
        value = datamodule.batch_size if key == "data.batch_size" else OmegaConf.select(cfg, key)
        if not isinstance(value, int) or value < 2:
            continue
        smaller, data = copy.deepcopy(cfg), datamodule
        if key == "data.batch_size":
            data = copy.copy(datamodule)
            data.batch_size = value // 2
        else:
            OmegaConf.update(smaller, key, value // 2)
        try:
            saved[key] = (need - model_bytes(smaller, data), value)
        except ValueError:  # a rule of the model broken by the halving (heads that no longer divide d_model)
            continue
    ranked = sorted(saved.items(), key=lambda item: -item[1][0])
    return [(key, value) for key, (_, value) in ranked[:most]]


class ConfigSizes:
    """What model_bytes reads from a datamodule, from the config alone (for a job not yet built, such as a pack
    about to be submitted to SLURM): a generated task's own sizes; a text dataset's tokenizer vocabulary, maximum
    length and classes (two where they are not declared)."""

    def __init__(self, data: DictConfig):
        self.batch_size = data.batch_size
        if "task" in data:
            from hydra.utils import instantiate

            task = instantiate(data.task)
            self.level, self.vocab_size, self.n_classes, self.max_len = (
                task.level,
                task.vocab_size,
                task.n_classes,
                task.max_len,
            )
        else:
            self.level, self.vocab_size = "sequence", data.tokenizer.vocab_size
            self.n_classes, self.max_len = data.get("n_classes") or 2, data.max_length
