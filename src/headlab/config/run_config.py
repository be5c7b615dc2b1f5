"""A run's config as flat dotted keys (as results.json records it): composed now, or as a run recorded it."""

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from headlab.conventions import as_now
from headlab.files import read_received
from headlab.record import flatten, read_record


def flat_config(cfg: DictConfig, choices: dict) -> dict:
    """The resolved config as dotted keys, plus the chosen option of each config group (data=pair_recall)."""
    groups = {g: c for g, c in choices.items() if not g.startswith("hydra") and c is not None}
    return {**groups, **flatten(OmegaConf.to_container(cfg, resolve=True))}


def recorded_config(run_dir: Path) -> dict | None:
    """The flat config a run was started with: its results.json's, or, where that cannot be read, its
    .hydra/config.yaml's (without the choices of config groups, which only results.json knows); None without
    either."""
    record = read_record(run_dir)
    if record is not None and isinstance(record.get("config"), dict):
        return as_now(record["config"])
    try:
        saved = OmegaConf.create(read_received(Path(run_dir) / ".hydra" / "config.yaml"))
    except Exception:  # absent or unreadable YAML
        return None
    try:
        return as_now(flatten(OmegaConf.to_container(saved, resolve=True)))  # as results.json records it
    except Exception:  # an interpolation that needs a Hydra job (${hydra:...}) outside one
        return as_now(flatten(OmegaConf.to_container(saved)))
