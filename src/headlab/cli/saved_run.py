"""A finished run's directory loaded back: its data and model (from its saved config) with a checkpoint's weights
(headlab-heads, headlab-eval). Every problem is one SystemExit line that starts with the program's name."""

from pathlib import Path

from omegaconf import OmegaConf


def checkpoint_path(run_dir: Path, which: str, prog: str) -> Path:
    """which: best (the checkpoint selected on validation, the one the test evaluated), last, or a file."""
    if which == "best":
        found = sorted((run_dir / "checkpoints").glob("best-*.ckpt"))
    elif which == "last":
        found = [run_dir / "checkpoints" / "last.ckpt"]
    else:
        found = [Path(which)]
    found = [f for f in found if f.is_file()]
    if not found:
        where = run_dir / "checkpoints" if which in ("best", "last") else which
        raise SystemExit(f"{prog}: no {which} checkpoint: {where} holds none (best, last, or a .ckpt file)")
    return found[-1]


def load(run_dir: Path, which: str, prog: str):
    """(datamodule, model in eval mode with the checkpoint's weights, checkpoint path) of a run."""
    config_file = run_dir / ".hydra" / "config.yaml"
    if not config_file.exists():
        raise SystemExit(f"{prog}: {run_dir} is not a headlab run directory (no .hydra/config.yaml)")
    checkpoint = checkpoint_path(run_dir, which, prog)

    from headlab.training.results import model_state
    from headlab.training.run import build

    datamodule, model = build(OmegaConf.load(config_file))
    try:
        model.load_state_dict(model_state(checkpoint))
    except RuntimeError as error:
        first = next(line.strip() for line in str(error).splitlines()[1:] if line.strip())
        raise SystemExit(f"{prog}: {checkpoint} does not fit the run's model config ({first})") from None
    return datamodule, model.eval(), checkpoint
