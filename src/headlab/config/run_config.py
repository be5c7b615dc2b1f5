"""A run's config as flat dotted keys (as results.json records it): composed now, or as a run recorded it; a resume
held to the config of the run it resumes."""

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from headlab.conventions import as_now
from headlab.errors import fail
from headlab.files import read_received
from headlab.record import defining_keys, flatten, read_record


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


RUN_DIRECTORY = "a run directory of headlab-train (with .hydra/config.yaml or checkpoints/last.ckpt)"  # resume=


def check_resume(cfg: DictConfig, run_dir, flat_config: dict) -> None:
    """A resumed run must be the same run: same directory, and the same config as its first attempt (recorded in
    its results.json, or in its .hydra/config.yaml where results.json cannot be read). One killed before it wrote
    checkpoints/last.ckpt starts again from its first step."""
    marks = (Path(".hydra") / "config.yaml", Path("checkpoints") / "last.ckpt")
    if not isinstance(cfg.resume, str) or not any((Path(cfg.resume) / mark).exists() for mark in marks):
        fail("resume", cfg.resume, RUN_DIRECTORY)
    if (read_record(Path(cfg.resume)) or {}).get("status") == "completed":
        fail(
            "resume",
            cfg.resume,
            f"an incomplete run: it completed, its records are final (headlab-eval {cfg.resume} evaluates a "
            "checkpoint of it again; a new run needs a new directory)",
        )
    before = recorded_config(Path(cfg.resume))
    if before is None:
        return  # a run killed before it wrote either: nothing to compare with
    flat_config = as_now(flat_config)  # a run composed from a config saved before keys were added
    for key in defining_keys(before, flat_config):
        if before.get(key) != flat_config.get(key):
            fail(key, flat_config.get(key), f"{before.get(key)!r} as in the run being resumed ({cfg.resume})")
