"""A run's schedule, from its config and its data: its optimizer steps, epochs, validations and the figures it
draws, as Lightning and headlab's head logger make them (what a dry run prices: headlab.launch.dry_run)."""

import math

from omegaconf import DictConfig, OmegaConf

MEDIA_LOGGERS = ("wandb", "tensorboard")  # the loggers a run draws its figures for (attention_logging)


def run_steps(cfg: DictConfig, datamodule) -> int:
    """The optimizer steps one run of cfg trains: its epochs (auto: from the data's size) x the steps an epoch, at
    most trainer.max_steps where that is set (as Lightning stops at whichever comes first). Early stopping may end a
    run sooner: this is its worst case."""
    from headlab.training import epochs

    per_epoch = steps_an_epoch(cfg, datamodule)
    if cfg.trainer.get("max_epochs") == epochs.AUTO:
        steps = per_epoch * epochs.auto_epochs(per_epoch, *epochs.budget(cfg))
    else:
        steps = per_epoch * int(cfg.trainer.max_epochs)
    max_steps = cfg.trainer.get("max_steps")
    return min(steps, max_steps) if isinstance(max_steps, int) and max_steps >= 0 else steps


def steps_an_epoch(cfg: DictConfig, datamodule) -> int:
    from headlab.training import epochs

    batches = math.ceil(len(datamodule.splits["train"]) / datamodule.batch_size)
    return epochs.steps_per_epoch(batches, ranks(cfg), cfg.trainer.get("limit_train_batches"))


def ranks(cfg: DictConfig) -> int:
    """The processes a run trains in (DDP's world size): its devices (a count, a list of them, or all GPUs for -1
    and auto) on each of its nodes; one on a single device."""
    trainer = cfg.trainer
    devices = trainer.get("devices", 1)
    if isinstance(devices, str):
        devices = int(devices) if devices.strip().lstrip("-").isdigit() else -1  # "auto"
    elif not isinstance(devices, int):  # a list of device indices
        devices = len(devices)
    if devices == -1:
        import torch

        gpu = str(trainer.get("accelerator")) in ("gpu", "cuda", "auto") and torch.cuda.is_available()
        devices = torch.cuda.device_count() if gpu else 1
    return max(1, devices) * max(1, int(trainer.get("num_nodes") or 1))


def epochs_of(cfg: DictConfig, datamodule) -> int:
    """The epochs (each ending in a validation) of a run's steps."""
    return math.ceil(run_steps(cfg, datamodule) / steps_an_epoch(cfg, datamodule))


def validations(cfg: DictConfig, datamodule) -> int:
    """A run's validations as Lightning schedules them: in every check_val_every_n_epoch-th epoch (1), at every
    val_check_batch-th training batch of it (trainer.val_check_interval: a fraction of the epoch's batches, 1.0 by
    default, or every k batches; without check_val_every_n_epoch, every k batches across epochs), up to where the
    run's steps end. An interval in time is counted as one validation an epoch."""
    trainer = cfg.trainer
    per_epoch, steps = steps_an_epoch(cfg, datamodule), run_steps(cfg, datamodule)
    interval, every = trainer.get("val_check_interval", 1.0), trainer.get("check_val_every_n_epoch", 1)
    if isinstance(interval, bool) or not isinstance(interval, int | float):
        batch = per_epoch
    else:
        batch = interval if isinstance(interval, int) else max(1, int(per_epoch * interval))
    if every is None:
        return steps // batch
    full, rest = divmod(steps, per_epoch)
    return sum(b // batch for e, b in enumerate([per_epoch] * full + [rest]) if (e + 1) % every == 0)


def batches(datamodule, split: str, limit, world: int = 1) -> int:
    """The batches of a split a validation or test reads on each of `world` ranks (a share of the split's), cut by
    trainer.limit_*_batches as Lightning cuts them."""
    from headlab.training import epochs

    if not datamodule.splits.get(split):
        return 0
    return epochs.steps_per_epoch(math.ceil(len(datamodule.splits[split]) / datamodule.batch_size), world, limit)


def draws_figures(cfg: DictConfig) -> bool:
    """Whether a run draws figures: for a W&B or TensorBoard logger, unless callbacks.attention.
    figures_every_n_val_epochs is 0 (AttentionLogger.media_loggers)."""
    loggers = cfg.get("logger") or {}
    never = OmegaConf.select(cfg, "callbacks.attention.figures_every_n_val_epochs") == 0
    return not never and any(loggers.get(name) for name in MEDIA_LOGGERS)


def figure_draws(checks: int, every: int) -> int:
    """How often a run of `checks` validations draws its attention maps: at every `every`-th validation and after
    the last (AttentionLogger.due)."""
    return checks // every + (1 if checks % every else 0)
