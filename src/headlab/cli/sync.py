"""headlab-sync: upload the offline W&B runs of sweeps (or runs) to W&B, several at a time; rerun it to upload what
is left (runs uploaded before are skipped).

Offline runs are what headlab-train leaves without credentials or network (docs/runs.md): once W&B answers,
`headlab-sync multirun/heads -j 4` uploads them all, each as its own run of its sweep's group.
"""

import argparse
import sys
from pathlib import Path

from headlab.cli.arguments import at_least


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="headlab-sync", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="sweep or run directories (their wandb/offline-run-*)")
    parser.add_argument("-j", "--jobs", type=at_least(1), default=4, help="runs uploaded at a time (4)")
    parser.add_argument("--dry-run", action="store_true", help="say what would be uploaded; upload nothing")
    parser.add_argument(
        "--show",
        action="store_true",
        help="read each offline run back (name, group, steps, numbers); upload nothing",
    )
    args = parser.parse_args(argv)

    from headlab.escape import terminal
    from headlab.launch import wandb_offline, wandb_sync
    from headlab.training.loggers import wandb_mode

    for root in args.dirs:
        if not root.is_dir():
            what = "no such directory" if not root.exists() else "not a directory"
            print(terminal(f"headlab-sync: {root}: {what}: expected a sweep or run directory"), file=sys.stderr)
            sys.exit(2)
    found = wandb_sync.offline_runs(args.dirs)
    for line in found.left_out:
        print(f"headlab-sync: {terminal(line)}", file=sys.stderr)
    runs = found.runs
    if args.show:
        print("\n".join(wandb_offline.describe(run) for run in runs))
        return
    left = [r for r in runs if not wandb_sync.is_synced(r)]
    print(f"headlab-sync: {len(runs)} offline run(s): {len(runs) - len(left)} uploaded before, {len(left)} to upload")
    if args.dry_run or not left:
        print("\n".join(f"  {terminal(r)}" for r in left))
        return
    mode, why = wandb_mode()
    if mode != "online":
        sys.exit(f"headlab-sync: nothing uploaded: {why or f'WANDB_MODE={mode}'}; rerun once W&B answers")
    done = wandb_sync.sync(left, args.jobs)
    failed = [d for d in done if not d.ok]
    for d in failed:
        print(terminal(f"headlab-sync: {d.run}: not uploaded: {d.said}"), file=sys.stderr)
    rest = "; rerun for the rest" if failed else ""
    print(f"headlab-sync: {len(done) - len(failed)} of {len(done)} uploaded{rest}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
