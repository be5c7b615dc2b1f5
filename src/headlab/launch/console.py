"""What a person sees while headlab-train runs: headlab's own lines (the model, the data being prepared, progress,
each run's outcome, a sweep's table) and real warnings and errors; Lightning's notes and Python's warnings go to
the run's log file (train.log) only. Quiet by default: HEADLAB_VERBOSE=1 shows everything on the console too."""

import logging
import os

from headlab.record import TEST_ACC, TEST_LOSS, VAL_ACC_BEST, total_seconds

QUIET = ("lightning", "py.warnings", "torch", "wandb", "matplotlib")  # loggers whose notes are for the log file
# (matplotlib's: a math font missing here, which it replaces, one line a font family at a run's first figures)


class Console(logging.Filter):
    """Lets through what a person needs on the console."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or not record.name.startswith(QUIET)


def quiet() -> None:
    """Route warnings and Lightning's lines to the log file only (Hydra's file handler keeps them all), once the
    job's logging is configured. Idempotent."""
    logging.captureWarnings(True)
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):  # Lightning's own console handlers
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    if os.environ.get("HEADLAB_VERBOSE") == "1":
        return
    for handler in logging.getLogger().handlers:
        if not isinstance(handler, logging.FileHandler) and not any(isinstance(f, Console) for f in handler.filters):
            handler.addFilter(Console())


def to_stderr(fmt: str) -> None:
    """A process of its own (a pack's worker, a pack's SLURM job), which Hydra did not set up: INFO lines to stderr
    in fmt, as quiet as a job's console."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    quiet()


def outcome(run_dir, record: dict) -> str:
    """One line for a finished run: where, its status and time, and its numbers (best validation, test)."""
    metrics = record.get("metrics") or {}
    seconds, attempts = total_seconds(record), len(record.get("attempts") or []) + 1
    shown = [f"{k} {metrics[k]:.4f}" for k in (VAL_ACC_BEST, TEST_ACC, TEST_LOSS) if k in metrics]
    status = record.get("status", "?")
    said = f"{run_dir}: {status}" + (f" in {seconds:.0f} s" if seconds is not None else "")
    said += f" over {attempts} attempts" if attempts > 1 and seconds is not None else ""
    return said + (": " + ", ".join(shown) if shown and status == "completed" else "")
