"""headlab-eval: evaluate any checkpoint of a finished run on any split, with the run's own data and model.

headlab-eval RUN_DIR [SPLIT] [--checkpoint best|last|FILE] runs a Lightning test of the checkpoint (default: the
best, selected on validation) on the split (train, val or test; default test), prints its metrics and writes them
to RUN_DIR/eval/<split>-<checkpoint>.json (a checkpoint from outside the run's checkpoints/ folder: <split>-other-
<checkpoint>.json, never in place of the run's own).
"""

import argparse
import math
import sys
import time
from pathlib import Path

from headlab.conventions import SPLITS
from headlab.files import write_json_atomic


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="headlab-eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run directory written by headlab-train")
    parser.add_argument("split", nargs="?", default="test", choices=SPLITS, help="the split to evaluate (test)")
    parser.add_argument("--checkpoint", default="best", help="best (default), last, or a checkpoint file")
    parser.add_argument("--accelerator", default="auto", help="Lightning accelerator: auto, cpu, gpu")
    args = parser.parse_args(argv)

    from headlab.cli import saved_run

    datamodule, model, checkpoint = saved_run.load(args.run_dir, args.checkpoint, "headlab-eval")
    if not datamodule.splits.get(args.split):
        there = ", ".join(s for s in SPLITS if datamodule.splits.get(s))
        raise SystemExit(f"headlab-eval: {args.run_dir} has no {args.split} split (it has {there})")

    import lightning.pytorch as pl

    from headlab.training.module import HeadLabModule

    module = HeadLabModule(model, datamodule.n_classes)
    trainer = pl.Trainer(accelerator=args.accelerator, devices=1, logger=False, enable_progress_bar=False)
    started = time.perf_counter()
    (measured,) = trainer.test(module, dataloaders=datamodule.ordered_dataloader(args.split), verbose=False)
    metrics = {f"{args.split}/{k.removeprefix('test/')}": float(v) for k, v in measured.items()}
    record = {
        "run_dir": str(args.run_dir),
        "split": args.split,
        "examples": len(datamodule.splits[args.split]),
        "checkpoint": str(checkpoint),
        "metrics": metrics,
        "seconds": round(time.perf_counter() - started, 3),
    }
    own = checkpoint.resolve().parent == (args.run_dir / "checkpoints").resolve()
    out = args.run_dir / "eval" / f"{args.split}-{'' if own else 'other-'}{checkpoint.stem}.json"
    write_json_atomic(out, record)  # a number that is not finite as null: the file stays JSON
    for key, value in metrics.items():
        print(f"{key}\t{value:.4f}")
    print(f"wrote {out}", file=sys.stderr)
    if bad := [k for k, v in metrics.items() if not math.isfinite(v)]:
        sys.exit(
            f"headlab-eval: {', '.join(bad)} not finite: the checkpoint's model is not (a diverged run); null in {out}"
        )


if __name__ == "__main__":
    main()
