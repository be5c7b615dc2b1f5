"""Checkpoints: written whole or not at all, and the model's weights read from one without running its code."""

from pathlib import Path

from headlab.files import write_atomic


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
