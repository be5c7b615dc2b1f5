"""results.json: what a run produced, with everything needed to compare and reproduce it."""

import errno
import functools
import json
import os
import platform
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from headlab.errors import DiskFull

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


def write_atomic(path: Path, write) -> None:
    """write(file) into a temporary file beside `path`, then rename: readers never see half a file, and a kill or
    a full disk leaves the previous file (and no temporary one) behind. A full disk is one DiskFull line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise _disk_full(error, path) from error
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise _disk_full(error, path) from error
        raise


def _disk_full(error: OSError, path: Path) -> Exception:
    return DiskFull(f"no space left on the device to write {path}") if error.errno == errno.ENOSPC else error


def write_json_atomic(path: Path, obj: dict) -> None:
    data = (json.dumps(obj, indent=2, default=str) + "\n").encode()
    write_atomic(path, lambda f: f.write(data))


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
