"""results.json: what a run produced, with everything needed to compare and reproduce it."""

import functools
import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from headlab.conventions import PATH_SUFFIXES, REPORTING_GROUPS, RESUME_KEYS, as_now
from headlab.files import write_atomic

PACKAGES = ("headlab", "torch", "lightning", "hydra-core", "torchmetrics", "numpy")


def flatten(tree: dict, prefix: str = "") -> dict:
    """{'model': {'attention': {'n_heads': 4}}} -> {'model.attention.n_heads': 4}; drops _target_ entries."""
    flat = {}
    for key, value in tree.items():
        if str(key).startswith("_"):
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def flat_config(cfg: DictConfig, choices: dict) -> dict:
    """The resolved config as dotted keys, plus the chosen option of each config group (data=pair_recall)."""
    groups = {g: c for g, c in choices.items() if not g.startswith("hydra") and c is not None}
    return {**groups, **flatten(OmegaConf.to_container(cfg, resolve=True))}


def read_record(run_dir: Path) -> dict | None:
    """A run directory's results.json as a dict; None when it is absent, unreadable, cut short, or not an object."""
    try:
        record = json.loads((Path(run_dir) / "results.json").read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None


def total_seconds(record: dict) -> float | None:
    """A run's time over all its attempts (duration_s is its last one's); None before its first ends."""
    if record.get("duration_s") is None:
        return None
    return record["duration_s"] + sum(a.get("duration_s") or 0 for a in record.get("attempts") or [])


def recorded_config(run_dir: Path) -> dict | None:
    """The flat config a run was started with: its results.json's, or, where that cannot be read, its
    .hydra/config.yaml's (without the choices of config groups, which only results.json knows); None without
    either."""
    record = read_record(run_dir)
    if record is not None and isinstance(record.get("config"), dict):
        return as_now(record["config"])
    try:
        saved = OmegaConf.load(Path(run_dir) / ".hydra" / "config.yaml")
    except Exception:  # absent or unreadable YAML
        return None
    try:
        return as_now(flatten(OmegaConf.to_container(saved, resolve=True)))  # as results.json records it
    except Exception:  # an interpolation that needs a Hydra job (${hydra:...}) outside one
        return as_now(flatten(OmegaConf.to_container(saved)))


def defining_keys(before: dict, now: dict) -> list[str]:
    """The keys on which two flat configs of one run must agree: not how the run is started (RESUME_KEYS), not
    where it writes (PATH_SUFFIXES: a run directory may move) or reports (REPORTING_GROUPS), and the choices of
    config groups only where both record them."""
    keys = sorted((set(before) | set(now)) - set(RESUME_KEYS))
    return [
        k
        for k in keys
        if not k.endswith(PATH_SUFFIXES)
        and k.split(".")[0] not in REPORTING_GROUPS
        and ("." in k or (k in before and k in now))
    ]


def same_run(before: dict | None, now: dict) -> bool:
    """Whether two flat configs are the same run (they agree on defining_keys)."""
    if before is None:
        return False
    before, now = as_now(before), as_now(now)
    return all(before.get(k) == now.get(k) for k in defining_keys(before, now))


def versions() -> dict:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


@functools.cache  # the code a process runs is the code it loaded
def git_sha() -> str | None:
    """The commit of the headlab source tree, when it is a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def model_state(path, map_location="cpu") -> dict:
    """The Encoder's weights in a Lightning checkpoint (its "model." entries, without the prefix), loaded safely
    (weights_only: no code from the file runs)."""
    import torch

    state = torch.load(path, map_location=map_location, weights_only=True)["state_dict"]
    return {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}


def save_checkpoint_atomic(checkpoint: dict, path: Path) -> None:
    """torch.save, atomically: a checkpoint is whole or absent (and a resume never trips on half of one)."""
    import torch  # not at the top: headlab-train imports this module before it has checked the config

    write_atomic(path, lambda f: torch.save(checkpoint, f))
