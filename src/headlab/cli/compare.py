"""headlab-compare: a sweep as a table of means and 95% confidence intervals over seeds, with plots.

headlab-compare DIR [DIR ...] reads every results.json below the directories (or, with --wandb ENTITY/PROJECT
--group G, the runs of a W&B group), finds the configuration keys that vary, groups the runs by them (seeds
pooled), and writes compare.md, compare.csv, compare.json and one PNG per metric into the first directory. This
module is the arguments and what is printed; the comparison is headlab.compare's.

Runs of an experiment are read with its pre-stated analysis (the experiment file's `compare` key) when no analysis
option is given. --into FILE puts the table into FILE's block for that experiment (experiments/RESULTS.md),
between <!-- headlab-compare: NAME --> and <!-- /headlab-compare: NAME --> (with --confirm, NAME/confirm: the
confirmation's block beside the first reading's). --archive FILE.tar.xz writes the runs' records
(headlab.stats.archive), which headlab-compare reads in place of the directories: a table recomputes from the
archive kept beside it (--check).
"""

import argparse
import re
import shlex
import sys
from collections import Counter
from pathlib import Path

from headlab.cli.pipe import piped
from headlab.compare import analysis, blocks, experiment, findings, sources
from headlab.compare.check import check
from headlab.compare.over_datasets import across_table, meta_table
from headlab.compare.report import report
from headlab.compare.tables import print_table
from headlab.errors import DiskFull
from headlab.stats import archive
from headlab.stats.contrasts import CompareError
from headlab.stats.runs import mixed_data


def make_parser() -> argparse.ArgumentParser:
    """headlab-compare's arguments."""
    parser = argparse.ArgumentParser(prog="headlab-compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="*", type=Path, help="sweep directories, or any directories with results.json")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="read runs from W&B instead of directories")
    parser.add_argument("--group", help="with --wandb: the W&B group (sweep or experiment)")
    analysis.add_options(parser)
    parser.add_argument("--out", type=Path, help="where to write (default: the first directory)")
    parser.add_argument("--no-plots", dest="plots", action="store_false", help="write the tables only, no figures")
    parser.add_argument(
        "--confirm", action="store_true", help="apply the experiment file's confirmation analysis (its confirm key)"
    )
    parser.add_argument("--into", type=Path, metavar="FILE", help="also put compare.md into FILE's experiment block")
    parser.add_argument(
        "--block", metavar="NAME", help="with --into: fill this block (default: the experiment's name, NAME/confirm)"
    )
    parser.add_argument(
        "--archive", type=Path, metavar="FILE.tar.xz", help="also archive the runs' records, which this reads as a DIR"
    )
    parser.add_argument(
        "--check", action="store_true", help="recompute every compare.md below DIRs (default experiments/results)"
    )
    parser.add_argument("--update", action="store_true", help="with --check: rewrite the tables that differ")
    return parser


@piped
def main(argv: list[str] | None = None) -> None:
    """headlab-compare: a full disk or Ctrl-C ends it in one line, leaving every file it writes as it was."""
    try:
        compare_command(sys.argv[1:] if argv is None else argv)
    except CompareError as error:
        raise SystemExit(f"headlab-compare: {error}") from None
    except DiskFull as error:
        raise SystemExit(f"headlab-compare: {error}: nothing written is half written") from None
    except KeyboardInterrupt:
        raise SystemExit("headlab-compare: interrupted: nothing written is half written") from None
    except OSError as error:  # --out under a file, a folder without write permission
        raise SystemExit(f"headlab-compare: cannot write {error.filename}: {error.strerror}") from None


def compare_command(argv: list[str]) -> None:
    parser = make_parser()
    args = parser.parse_args(argv)
    if taken := [m for m in args.metric or [] if Path(m).exists()]:  # --metric A B DIR: the directory is a source
        args.metric = [m for m in args.metric if m not in taken] or None
        args.dirs = [*args.dirs, *map(Path, taken)]
    if args.check or args.update:
        others = [
            k for k, v in vars(args).items() if k not in ("check", "update", "dirs") and v != parser.get_default(k)
        ]
        if not args.check or others:
            parser.error("--check [--update] takes folders or compare.md files only (it replays each table)")
        raise SystemExit(check(args.dirs or [Path("experiments/results")], args.update))
    if not args.dirs and not args.wandb:
        parser.error("give sweep directories or --wandb ENTITY/PROJECT")
    if args.block and (not args.into or not re.fullmatch(r"\w+(/\w+)*", args.block)):
        parser.error(f"--block takes a block name of --into FILE (words joined by /), got {args.block!r}")
    if args.archive and (args.wandb or not all(d.is_dir() for d in args.dirs)):
        parser.error("--archive archives sweep directories: give directories only")
    given = {k: v for k, v in vars(args).items() if k in analysis.DEFAULTS}
    try:
        chosen = analysis.analysis(given)  # bad options fail before any run is read
    except CompareError as error:
        parser.error(str(error))
    runs = sources.load(args.dirs, args.wandb, args.group)
    for where, why in runs.unreadable:
        print(f"headlab-compare: skipped {where}: {why}", file=sys.stderr)
    _say_left_out(runs.failed)
    if not runs.completed:
        raise SystemExit("headlab-compare: no completed runs to compare")
    for line in mixed_data(runs.completed):
        print(f"headlab-compare: mixed data: {line}", file=sys.stderr)
    own = any(v != analysis.DEFAULTS[k] for k, v in given.items())  # the command line's analysis, not the file's
    stated, notes = (None, []) if own else experiment.stated(runs.completed, args.confirm)
    for note in notes:
        print(f"headlab-compare: {note}", file=sys.stderr)
    if args.confirm and not stated:
        raise SystemExit(
            "headlab-compare: --confirm applies the confirm key of the runs' experiment, without analysis options of "
            "the command line: give the runs of one experiment and no other analysis options"
        )
    if stated:
        flags = analysis.to_flags(stated)
        print(f"headlab-compare: the experiment's pre-stated analysis: {shlex.join(flags)}", file=sys.stderr)
        argv = [*argv, *flags]
        try:
            chosen = analysis.analysis(stated)
        except CompareError as error:
            parser.error(str(error))
    out = args.out or (args.dirs[0] if args.dirs and args.dirs[0].is_dir() else Path.cwd())
    where = {"dirs": [str(d) for d in args.dirs], "wandb": args.wandb, "group": args.group}
    where |= {"into": args.into and str(args.into), "block": args.block, "archive": args.archive and str(args.archive)}
    done = report(runs, chosen, out, {k: v for k, v in where.items() if v}, ["headlab-compare", *argv], args.plots)
    if args.archive:
        done.written.append(args.archive)
        print(f"archived {archive.write(args.archive, args.dirs)} runs' records", file=sys.stderr)
    if args.into:  # a confirmation has a block of its own beside the first reading's: NAME/confirm
        name = experiment.name_of(runs.completed)
        if not args.block and name is None:
            names = sorted({str(r["config"].get("experiment")) for r in runs.completed})
            raise SystemExit(f"headlab-compare: --into needs the runs of one experiment, not {names}")
        block = args.block or name + ("/confirm" if args.confirm else "")
        blocks.splice(args.into, block, (out / "compare.md").read_text(), out)
        if findings.refresh(args.into):
            print(f"refreshed the findings table of {args.into}", file=sys.stderr)
    print_table(done.keys, done.rows, done.design, done.n_runs)
    if done.roles is not None:
        print("\n".join(done.roles))
    if done.pooled:
        print("\n".join(meta_table(done.pooled, done.design)))
    if done.ranked:
        print("\n".join(across_table(done.ranked, done.design)))
    print("wrote " + ", ".join(str(p) for p in done.written), file=sys.stderr)


def _say_left_out(failed: list[tuple[str, str]], each: int = 5) -> None:
    """The runs that did not complete, one line each; of a sweep still running (more than `each`), their number
    per status on one line (compare.md lists every one)."""
    if len(failed) <= each:
        for where, why in failed:
            print(f"headlab-compare: left out {where}: {why}", file=sys.stderr)
        return
    statuses = Counter(why.split(":")[0] for _, why in failed)
    counts = ", ".join(f"{n} {status}" for status, n in statuses.most_common())
    print(
        f"headlab-compare: left out {len(failed)} runs that did not complete ({counts}): compare.md lists each",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
