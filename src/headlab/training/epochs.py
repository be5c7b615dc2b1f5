"""trainer.max_epochs=auto: a training budget that follows the data's size.

The epochs that give `auto_epochs.steps` optimizer steps, kept within [auto_epochs.min, auto_epochs.max]: the text
defaults (5,000 steps, 5 to 10 epochs) train SST-2 (1,000 steps an epoch) for 5 epochs, as before, and the small
benchmarks (50-150 steps an epoch) for 10. `auto_epochs.scale` multiplies the steps and both bounds: scale=2 trains
twice as long as auto would, on every dataset (10 epochs on SST-2, 20 on the small ones). Why: docs/data.md, "Text
defaults".
"""

import logging
import math

from omegaconf import DictConfig

log = logging.getLogger("headlab")

AUTO = "auto"


def steps_per_epoch(batches: int, world_size: int, limit: int | float | None) -> int:
    """Optimizer steps an epoch: the loader's batches shared among the ranks (each draws ceil(batches / world)),
    cut by trainer.limit_train_batches (an int: at most that many; a float: that fraction) as Lightning cuts them."""
    steps = math.ceil(batches / world_size)
    if isinstance(limit, int):
        return max(1, min(steps, limit))
    if isinstance(limit, float):
        return max(1, int(steps * limit))
    return steps


def auto_epochs(steps_an_epoch: int, steps: int, least: int, most: int) -> int:
    """ceil(steps / steps_an_epoch), within [least, most]."""
    return min(most, max(least, math.ceil(steps / steps_an_epoch)))


def budget(cfg: DictConfig) -> tuple[int, int, int]:
    """auto_epochs' (steps, min, max), each times its scale."""
    scale = cfg.auto_epochs.get("scale", 1)
    return cfg.auto_epochs.steps * scale, cfg.auto_epochs.min * scale, cfg.auto_epochs.max * scale


def resolve(trainer, cfg: DictConfig, datamodule) -> None:
    """For trainer.max_epochs=auto, set the Trainer's epochs from the training split's batches (a pack's members
    share their data, so any member's datamodule); any number given is kept as it is."""
    if cfg.trainer.get("max_epochs") != AUTO:
        return
    steps, least, most = budget(cfg)
    batches = math.ceil(len(datamodule.splits["train"]) / datamodule.batch_size)
    per_epoch = steps_per_epoch(batches, trainer.world_size, cfg.trainer.get("limit_train_batches"))
    epochs = auto_epochs(per_epoch, steps, least, most)
    trainer.fit_loop.max_epochs = epochs
    log.info(
        "trainer.max_epochs=auto: %d epochs of %d steps (auto_epochs: %d steps, within %d-%d epochs)",
        epochs, per_epoch, steps, least, most,
    )  # fmt: skip


def placeholder(cfg: DictConfig) -> dict:
    """The Trainer's arguments that stand in for auto until resolve() knows the data: its most epochs."""
    return {"max_epochs": budget(cfg)[2]} if cfg.trainer.get("max_epochs") == AUTO else {}
