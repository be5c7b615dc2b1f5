"""How a pack's members compute together (pack.compute): one after another, each on views of the stacked parameters
with its single run's kernels and dropout stream (`each`), or as one batched computation (`batched`, torch.func.vmap).

Neither is the faster everywhere on a CPU: batched matmuls against many small ones, the explicit attention against
the fused kernel, turn on the shapes and on the machine. `auto` takes the batched computation on a GPU; on a CPU it
times both ways on the pack's first training batch and keeps the faster, for the whole pack (its validation, test
and head analysis too), unless the members draw dropout masks (each then draws its single run's, one after another)
or are compiled.
The ways round differently: a choice is kept in $HEADLAB_CACHE/pack_compute for the machine, the threads, the pack's
shapes and what its members compute (their model's config: designs of the same parameters compute differently), so
that the same command computes the same numbers each time it runs here, whatever ran before (delete it to time again).
The dry run and the packed launcher's estimate time a pack's step through the same callback (headlab.launch.cost),
so that a pack usually finds its choice kept, made before it started, by the timing its price came from.
"""

import contextlib
import hashlib
import json
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path

import lightning.pytorch as pl
import torch
from omegaconf import DictConfig, OmegaConf

from headlab.conventions import cache_root
from headlab.errors import DiskFull
from headlab.files import write_json_atomic
from headlab.model.kernels import cpu_identity
from headlab.timing import interleaved

log = logging.getLogger("headlab")
REPEATS = 5  # timed forward and backward passes of each way, after one untimed (the median of 5 holds on a busy CPU)


def asked(cfg: DictConfig) -> str:
    """pack.compute as the run's config gives it (a config written before the key: auto)."""
    return OmegaConf.select(cfg, "pack.compute", default="auto")


def to_measure(cfg: DictConfig, size: int) -> bool:
    """Whether a pack of these members times both ways: pack.compute=auto, on a CPU, with members to batch, without
    dropout (with it, one after another keeps each member its single run's masks) and not compiled (model.compile:
    each way its own graphs, compiled on the first batch, where one after another is the CPU's way)."""
    cpu = str(cfg.trainer.get("accelerator")) == "cpu"
    dropout = cfg.model.get("dropout") or cfg.model.attention.get("dropout")
    return asked(cfg) == "auto" and cpu and size > 1 and not dropout and not cfg.model.get("compile")


def timed(ways: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Median seconds of each way's call over REPEATS calls, the ways interleaved, after one untimed call of each."""
    return interleaved(ways, REPEATS, warmup=1)


def seconds_a_step(module, batch: dict) -> dict[str, float]:
    """Seconds of the members' forward and backward passes on a training batch (the pack's objective, as its training
    step computes it) each way (timed); the gradients they leave are dropped (the optimizer never sees them), and
    nothing random is drawn (no dropout: to_measure)."""

    def step(way: str):
        def call():
            module.stack.compute = way
            with torch.enable_grad():
                module._training_step(batch).objective.sum().backward()

        return call

    seconds = timed({way: step(way) for way in ("each", "batched")})
    module.stack.flat.grad = None
    return seconds


def computation(cfg: DictConfig) -> dict:
    """What a pack's members compute beyond their parameters' shapes: their model's config (its scoring, normaliser,
    position, gates: designs of one parameter count differ in it) and the trainer's precision."""
    return {"model": OmegaConf.to_container(cfg.model, resolve=True), "precision": str(cfg.trainer.get("precision"))}


def kept_path(module, batch: dict, computes: dict) -> Path:
    """Where the choice for this CPU (its model, flags and cores), torch, thread count, pack (its parameters' shapes
    and precision, its members, what they compute: computation) and batch shape is kept."""
    stack = module.stack
    said = [cpu_identity(), os.cpu_count(), torch.__version__, torch.get_num_threads()]
    said += [stack.names, stack.shapes, str(stack.flat.dtype), stack.size, list(batch["tokens"].shape), computes]
    digest = hashlib.sha256(json.dumps(said, default=str).encode()).hexdigest()[:24]
    return cache_root() / "pack_compute" / f"{digest}.json"


def kept(path: Path) -> dict[str, float] | None:
    """The seconds a step of each way timed here before, or None (none kept, or not readable as such)."""
    try:
        seconds = json.loads(path.read_text())["step_s"]
        found = {way: float(seconds[way]) for way in ("each", "batched")}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found if all(0 < s < math.inf for s in found.values()) else None


class ComputeChoice(pl.Callback):
    """pack.compute=auto where the pack times both ways (to_measure): at its first training batch the faster is kept,
    as timed here before for the same shapes and computation (kept_path) or timed now; with several ranks none is
    timed (each rank would choose for itself), and the CPU's way, each, is kept. cfg: the pack's (its members')."""

    def __init__(self, pack_id: str | None, cfg: DictConfig):
        self.pack_id, self.computes = pack_id, computation(cfg)
        self.seconds: dict[str, float] | None = None
        self.cached = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.seconds is not None or trainer.world_size > 1:
            return
        path = kept_path(pl_module, batch, self.computes)
        self.seconds = kept(path)
        self.cached = self.seconds is not None
        if not self.cached:
            self.seconds = seconds_a_step(pl_module, batch)
            with contextlib.suppress(OSError, DiskFull):  # unkept, the next pack times them again
                write_json_atomic(path, {"step_s": self.seconds})
        pl_module.stack.compute = min(self.seconds, key=self.seconds.get)
        when = f"as timed here before ({path})" if self.cached else "timed on its first batch"
        log.info(
            "pack %s: its %d members compute %s (%s: %.3f s a step one after another, %.3f s batched)",
            self.pack_id, pl_module.stack.size, pl_module.stack.compute, when, self.seconds["each"],
            self.seconds["batched"],
        )  # fmt: skip


def record(module, choice: ComputeChoice | None) -> dict:
    """What each member's results.json says of how its pack computed (its `pack` field): the way, and where both
    were timed, their seconds a step and whether they were timed before (kept)."""
    way = "each" if module.stack.one_after_another(module.device) else "batched"
    if not (choice and choice.seconds):
        return {"compute": way}
    return {
        "compute": way,
        "compute_step_s": {k: round(v, 6) for k, v in choice.seconds.items()},  # to the microsecond
        "compute_kept": choice.cached,
    }
