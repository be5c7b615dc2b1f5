"""A finished run's directory loaded back: its data and model (from its saved config) with a checkpoint's weights
(headlab-heads, headlab-eval). Every problem is one SystemExit line that starts with the program's name.

What is trusted (docs/runs.md): the run's config may only name classes headlab's own configs name; its data is
prepared with the tokenizer and labels the run kept (data/), in the reader's own cache, and must match the digests
the run kept; "best" is the checkpoint the run's results.json names.
"""

from pathlib import Path

from omegaconf import OmegaConf, open_dict

from headlab.errors import UsageError, first_line
from headlab.files import read_received
from headlab.record import read_record


def _record(run_dir: Path) -> dict:
    return read_record(run_dir) or {}


def checkpoint_path(run_dir: Path, which: str, prog: str) -> Path:
    """which: best (the checkpoint results.json names: selected on validation, the one the test evaluated), last,
    or a file."""
    if which == "best":
        recorded = (_record(run_dir).get("checkpoints") or {}).get("best")
        if not recorded:
            raise SystemExit(
                f"{prog}: {run_dir}/results.json names no best checkpoint (the run did not complete): use "
                "--checkpoint last, or a .ckpt file"
            )
        path = run_dir / "checkpoints" / Path(recorded).name  # where the run is now, wherever it was then
    elif which == "last":
        path = run_dir / "checkpoints" / "last.ckpt"
    else:
        path = Path(which)
    if not path.is_file():
        raise SystemExit(f"{prog}: no {which} checkpoint: {path} is not a file (best, last, or a .ckpt file)")
    return path


def load(run_dir: Path, which: str, prog: str):
    """(datamodule, model in eval mode with the checkpoint's weights, checkpoint path) of a run."""
    config_file = run_dir / ".hydra" / "config.yaml"
    try:
        config_text = read_received(config_file)
    except FileNotFoundError:
        raise SystemExit(f"{prog}: {run_dir} is not a headlab run directory (no .hydra/config.yaml)") from None
    except OSError as error:  # a pipe, a device, a link, a folder, too large: refused before it is read
        raise SystemExit(f"{prog}: {error}") from None
    checkpoint = checkpoint_path(run_dir, which, prog)

    from headlab.launch import rundir, runtime

    try:
        rundir.lock(run_dir)  # a run still training (another process holds it) is read once it ends
    except UsageError as error:
        raise SystemExit(f"{prog}: {error}") from None
    except OSError:  # a run this user may read but not write: no process of theirs trains it
        pass
    from headlab.config import trust

    with runtime.heavy_imports():
        from headlab.training import records
        from headlab.training.build import build
        from headlab.training.checkpoints import model_state

    runtime.configure()  # the resolvers a saved config may use (${headlab.data_dir:} of the benchmarks' configs)
    cfg = OmegaConf.create(config_text)
    try:
        trust.check_targets(OmegaConf.masked_copy(cfg, ["data", "model"]), str(config_file))
        with open_dict(cfg):
            if "cache_dir" in cfg.data:
                cfg.data.cache_dir = None  # the reader's own cache: a run's config names no place to write
        datamodule, model = build(cfg, run_dir / "data")
        records.check_same_data(run_dir, datamodule)
    except UsageError as error:
        raise SystemExit(f"{prog}: {error}") from None
    try:
        state = model_state(checkpoint)
    except Exception as error:  # truncated, not a checkpoint, or pickled code (weights_only refuses it)
        raise SystemExit(f"{prog}: {checkpoint} is not a readable checkpoint ({first_line(error)})") from None
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        first = next(line.strip() for line in str(error).splitlines()[1:] if line.strip())
        raise SystemExit(f"{prog}: {checkpoint} does not fit the run's model config ({first})") from None
    return datamodule, model.eval(), checkpoint
