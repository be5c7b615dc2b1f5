"""headlab-compare: a sweep as a table of means and 95% confidence intervals over seeds, with plots.

headlab-compare DIR [DIR ...] reads every results.json below the directories (or, with --wandb ENTITY/PROJECT
--group G, the runs of a W&B group), finds the configuration keys that vary, groups the runs by them (seeds
pooled), and writes compare.md, compare.csv and one PNG per metric into the first directory. Loading:
headlab.analysis.runs; grouping and statistics: headlab.analysis.comparison and .inference; this module keeps
the arguments, and compare_report / compare_plots the rendering.

Runs of an experiment record its pre-stated analysis (the experiment file's `compare` key): given no analysis
options, headlab-compare applies it. --into FILE puts the table into FILE's block for that experiment
(experiments/RESULTS.md), between <!-- headlab-compare: NAME --> and <!-- /headlab-compare: NAME --> (with --confirm,
NAME/confirm: the confirmation's block beside the first reading's).
--archive FILE.tar.xz writes the runs' records (headlab.analysis.archive), which headlab-compare reads in place of
the directories: a table recomputes from the archive kept beside it.
"""

import argparse
import math
import re
import shlex
import sys
from collections import Counter
from importlib.resources import files
from pathlib import Path

from omegaconf import OmegaConf

from headlab.analysis import archive, budget, datasets
from headlab.analysis.comparison import METRICS, check_metrics, compare, pruning_summary, same_value, select_best
from headlab.analysis.contrasts import TESTS, CompareError, Design
from headlab.analysis.roles import role_counts
from headlab.analysis.runs import Runs, head_means, load_dirs, mixed_data
from headlab.cli.compare_check import check
from headlab.cli.compare_datasets import across_table, meta_table, write_across, write_meta
from headlab.cli.compare_report import print_table, pruning_table, roles_table, write_outputs
from headlab.cli.pipe import piped
from headlab.errors import DiskFull
from headlab.files import write_atomic


def load_wandb(path: str, group: str | None) -> Runs:
    """Finished runs of a W&B project (ENTITY/PROJECT), optionally one group, through the public API."""
    import wandb

    runs = Runs()
    filters = {"group": group} if group else {}
    for run in wandb.Api(timeout=30).runs(path, filters=filters):
        summary = {k: _summary_value(v) for k, v in dict(run.summary).items()}
        summary = {k: v for k, v in summary.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        metrics = {"val/acc_best": summary.get("val/acc"), **summary, **head_means(summary)}
        record = {"config": dict(run.config), "metrics": metrics, "head_analysis": {}}
        record["where"] = run.url
        if run.state == "finished":
            runs.completed.append(record)
        else:
            runs.failed.append((run.url, run.state))
    return runs


def _summary_value(value):
    """A W&B summary value as a number: metrics defined with summary="max" (or min, last) come back as
    {"max": ...}; media and tables stay what they are (and are left out)."""
    if isinstance(value, dict):
        return next((value[k] for k in ("max", "min", "last", "mean") if k in value), value)
    return value


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


def only(parser: argparse.ArgumentParser, records: list[dict], where: list[str]) -> list[dict]:
    """The records whose config has each KEY=VALUE of --where (a value as a command line writes it: true, dot;
    numbers by value, 3e-2 = 0.03); an error naming the values there are where none has it."""
    for condition in where:
        key, _, value = condition.partition("=")
        if not key or not value:
            parser.error(f"--where takes KEY=VALUE, got {condition!r}")
        kept = [r for r in records if same_value(r["config"].get(key), value.strip())]
        if not kept:
            there = sorted({_as_written(r["config"].get(key)) for r in records})
            raise SystemExit(f"headlab-compare: --where {condition}: no run has it; {key} is {', '.join(there)}")
        records = kept
    return records


def _as_written(value) -> str:
    """A config value as a command line writes it: 0.03, true, null, dot."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _design(parser: argparse.ArgumentParser, args) -> Design:
    def pair(text: str | None, sep: str, flag: str):
        if text is None:
            return None
        parts = text.split(sep, 1)
        if len(parts) != 2 or not all(parts):
            parser.error(f"{flag} takes KEY{sep}VALUE, got {text!r}")
        return parts[0].strip(), parts[1].strip()

    reach = _reach(parser, args.reach) if args.reach else None
    solved = pair(args.solved, ">=", "--solved")
    if solved:
        try:
            solved = (solved[0], float(solved[1]))
        except ValueError:
            parser.error(f"--solved takes METRIC>=NUMBER, got {args.solved!r}")
        if not math.isfinite(solved[1]):
            parser.error(f"--solved takes a finite threshold, got {args.solved!r}")
    if args.effect is not None and not (math.isfinite(args.effect) and args.effect > 0):
        parser.error(f"--effect takes a difference > 0 (the smallest that matters), got {args.effect}")
    if args.select in ("seed", "data.seed"):
        parser.error(f"--select takes a setting chosen per arm (optim.lr, say), not {args.select}: seeds replicate")
    baseline = pair(args.baseline, "=", "--baseline")
    select = (args.select, args.select_on) if args.select else None
    if args.within and not baseline:
        parser.error("--within needs --baseline")
    if args.power and not baseline:
        parser.error("--power needs --baseline (power is a contrast's)")
    if args.effect is not None and not (baseline or args.across):
        parser.error("--effect needs --baseline (the difference that matters) or --across (the gap that does not)")
    if args.meta and not baseline:
        parser.error("--meta needs --baseline (it pools each arm's contrast with its baseline)")
    metrics = args.metric or list(METRICS[:2])
    for at in args.at or []:
        try:
            metrics.append(budget.label(at))
        except ValueError:
            parser.error(
                f"--at takes steps=N or flops=F (compare at N training steps or F training FLOPs, read from the "
                f"curves), got {at!r}"
            )
    return Design(
        metrics,
        baseline,
        args.paired,
        solved,
        select,
        args.within or [],
        args.test,
        args.log or [],
        args.effect,
        args.power,
        reach,
        args.meta,
        args.across,
    )


def _reach(parser: argparse.ArgumentParser, text: str) -> tuple[str, str, float]:
    """--reach METRIC>=X or METRIC<=X -> (metric, op, X)."""
    op = ">=" if ">=" in text else "<="
    metric, _, threshold = text.partition(op)
    try:
        if metric.strip():
            return metric.strip(), op, float(threshold)
    except ValueError:
        pass
    parser.error(f"--reach takes METRIC>=X or METRIC<=X (a validation curve's metric), got {text!r}")


def experiment_name(records: list[dict]) -> str:
    names = {r["config"].get("experiment") for r in records}
    if len(names) != 1 or not re.fullmatch(r"\w+", str(next(iter(names)))):
        raise SystemExit(f"headlab-compare: --into needs the runs of one experiment, not {sorted(map(str, names))}")
    return names.pop()


def splice(path: Path, name: str, text: str) -> None:
    """Put text between the lines <!-- headlab-compare: NAME --> and <!-- /headlab-compare: NAME --> of a
    markdown file (experiments/RESULTS.md), replacing what was there."""
    start, end = f"<!-- headlab-compare: {name} -->", f"<!-- /headlab-compare: {name} -->"
    try:
        document = path.read_text()
    except OSError as error:
        raise SystemExit(f"headlab-compare: --into {path}: {error.strerror}") from None
    if document.count(start) != 1 or document.count(end) != 1 or document.index(start) > document.index(end):
        raise SystemExit(f"headlab-compare: --into {path} needs one block from {start} to {end}")
    head, rest = document.split(start, 1)
    spliced = f"{head}{start}\n{text.rstrip()}\n{end}{rest.split(end, 1)[1]}".encode()
    write_atomic(path, lambda f: f.write(spliced))  # a full disk or a kill leaves the file as it was


def add_analysis_options(parser: argparse.ArgumentParser) -> None:
    """The options that say how runs are compared: what an experiment's `compare` key may state."""
    parser.add_argument("--metric", action="append", help=f"metrics to show (default: {', '.join(METRICS[:2])})")
    parser.add_argument("--baseline", metavar="KEY=VALUE", help="add each group's difference to this group")
    parser.add_argument(
        "--within", metavar="KEY", action="append", help="with --baseline: compare only with the baseline of equal KEY"
    )
    parser.add_argument("--paired", action="store_true", help="with --baseline: pair the test over shared seeds")
    parser.add_argument(
        "--test", choices=list(TESTS), default="welch", help="with --baseline: the test (docs/sweeps.md: which when)"
    )
    parser.add_argument("--log", metavar="METRIC", action="append", help="analyse METRIC on the log scale")
    parser.add_argument(
        "--effect",
        type=float,
        metavar="X",
        help="with --baseline: the smallest difference that matters (power, equivalence); with --across: the "
        "largest gap to a dataset's best that does not (the target)",
    )
    parser.add_argument(
        "--power", action="store_true", help="with --baseline: the seeds each contrast needs for 80%% power"
    )
    parser.add_argument("--solved", metavar="METRIC>=X", help="solve rate per group with its exact interval")
    parser.add_argument(
        "--reach", metavar="METRIC>=X", help="steps to reach X on the validation curve: Kaplan-Meier, log-rank"
    )
    parser.add_argument(
        "--at",
        metavar="steps=N|flops=F",
        action="append",
        help="also val/acc at N training steps or F training FLOPs, read from the curves",
    )
    parser.add_argument(
        "--meta", metavar="KEY", help="with --baseline: pool each contrast over KEY's values (datasets), random effects"
    )
    parser.add_argument(
        "--across", metavar="KEY", help="rank settings by their gap to each KEY value's best (chosen on the 1st metric)"
    )
    parser.add_argument("--select", metavar="KEY", help="per arm, keep the value of KEY best on --select-on")
    parser.add_argument("--select-on", default="val/acc_best", help="validation metric for --select")
    parser.add_argument("--pruning", action="store_true", help="add the pruning curves of heads.json per group")
    parser.add_argument("--roles", action="store_true", help="add the runs with a head in each role, per group")
    parser.add_argument(
        "--where", metavar="KEY=VALUE", action="append", help="only the runs whose config has KEY=VALUE (e.g. one rate)"
    )


def pre_stated(records: list[dict], argv: list[str]) -> list[str]:
    """The analysis the runs' experiment states: the `compare` key of its file in headlab's experiments/ (with
    --confirm, its `confirm` key: the analysis stated after a first reading, for new seeds), never what the runs
    record (a record is data: options and paths never come from it); [] when the command line gives analysis
    options of its own, or the runs are not of one known experiment."""
    analysis = argparse.ArgumentParser(add_help=False)
    add_analysis_options(analysis)
    flags = {flag for action in analysis._actions for flag in action.option_strings}
    if any(a.split("=", 1)[0] in flags for a in argv):
        return []
    names = {r["config"].get("experiment") for r in records}
    if len(names) != 1 or not isinstance(name := next(iter(names)), str) or not re.fullmatch(r"\w+", name):
        return []
    path = files("headlab.conf").joinpath("experiment", f"{name}.yaml")
    if not path.is_file():
        print(f"headlab-compare: the runs are of experiment {name!r}, which this headlab has not", file=sys.stderr)
        return []
    key = "confirm" if "--confirm" in argv else "compare"
    stated = [str(a) for a in OmegaConf.create(path.read_text()).get(key) or []]
    if key == "confirm" and not stated:
        raise SystemExit(f"headlab-compare: experiments/{name}.yaml states no confirmation analysis (confirm key)")
    analysis.prog = f"{name}.yaml's {key} key"
    analysis.parse_args(stated)  # analysis options only: anything else is refused here
    if {tuple(r["config"].get(key) or ()) for r in records} != {tuple(stated)}:
        print(
            f"headlab-compare: the runs record another analysis than experiments/{name}.yaml states now; applying "
            "the file's",
            file=sys.stderr,
        )
    return stated


def make_parser() -> argparse.ArgumentParser:
    """headlab-compare's arguments."""
    parser = argparse.ArgumentParser(prog="headlab-compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="*", type=Path, help="sweep directories, or any directories with results.json")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="read runs from W&B instead of directories")
    parser.add_argument("--group", help="with --wandb: the W&B group (sweep or experiment)")
    add_analysis_options(parser)
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
        compare_command(argv)
    except DiskFull as error:
        raise SystemExit(f"headlab-compare: {error}: nothing written is half written") from None
    except KeyboardInterrupt:
        raise SystemExit("headlab-compare: interrupted: nothing written is half written") from None


def compare_command(argv: list[str] | None = None) -> None:
    parser = make_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.check or args.update:
        if not args.check or [a for a in argv if a.startswith("-") and a not in ("--check", "--update")]:
            parser.error("--check [--update] takes folders or compare.md files only (it replays each table's command)")
        raise SystemExit(check(args.dirs or [Path("experiments/results")], args.update))
    if not args.dirs and not args.wandb:
        parser.error("give sweep directories or --wandb ENTITY/PROJECT")
    if args.block and (not args.into or not re.fullmatch(r"\w+(/\w+)*", args.block)):
        parser.error(f"--block takes a block name of --into FILE (words joined by /), got {args.block!r}")
    if args.archive and (args.wandb or not all(d.is_dir() for d in args.dirs)):
        parser.error("--archive archives sweep directories: give directories only")
    design = _design(parser, args)  # bad options fail before any run is read
    runs = load_wandb(args.wandb, args.group) if args.wandb else load_dirs(args.dirs)
    for where, why in runs.unreadable:
        print(f"headlab-compare: skipped {where}: {why}", file=sys.stderr)
    _say_left_out(runs.failed)
    if not runs.completed:
        raise SystemExit("headlab-compare: no completed runs to compare")
    for line in mixed_data(runs.completed):
        print(f"headlab-compare: mixed data: {line}", file=sys.stderr)
    stated = pre_stated(runs.completed, argv)
    if args.confirm and not stated:
        raise SystemExit(
            "headlab-compare: --confirm applies the confirm key of the runs' experiment, without analysis options of "
            "the command line: give the runs of one experiment and no other analysis options"
        )
    if stated:
        print(f"headlab-compare: the experiment's pre-stated analysis: {shlex.join(stated)}", file=sys.stderr)
        argv = [*argv, *stated]
        args = parser.parse_args(argv)
        design = _design(parser, args)
    runs.completed = only(parser, runs.completed, args.where or [])
    try:
        check_metrics(runs.completed, design, args.metric or [])
        keys, rows = compare(runs.completed, design)
        pooled = datasets.pool(rows, keys, design) if design.meta else []
        ranked = datasets.across(rows, keys, design) if design.across else None
    except CompareError as error:
        raise SystemExit(f"headlab-compare: {error}") from None
    out = args.out or (args.dirs[0] if args.dirs and args.dirs[0].is_dir() else Path.cwd())
    out.mkdir(parents=True, exist_ok=True)
    written = write_outputs(out, keys, rows, design, runs, ["headlab-compare", *argv], args.plots)
    if pooled:
        written.append(write_meta(out, pooled, design))
    if ranked:
        written.append(write_across(out, ranked, design))
    chosen = select_best(runs.completed, *design.select)[0] if design.select else runs.completed
    if args.pruning:
        with (out / "compare.md").open("a") as f:
            f.write("\n" + "\n".join(pruning_table(pruning_summary(chosen, keys))))
    if args.roles:
        roles = roles_table(role_counts(chosen, keys, design.solved), design.solved)
        with (out / "compare.md").open("a") as f:
            f.write("\n" + "\n".join(roles or ["Head roles: no run recorded any (heads.json rows without `role`)."]))
    if args.archive:
        written.append(args.archive)
        print(f"archived {archive.write(args.archive, args.dirs)} runs' records", file=sys.stderr)
    if args.into:  # a confirmation has a block of its own beside the first reading's: NAME/confirm
        block = args.block or experiment_name(runs.completed) + ("/confirm" if args.confirm else "")
        splice(args.into, block, (out / "compare.md").read_text())

    print_table(keys, rows, design, len(runs.completed))
    if args.roles:
        print("\n".join(roles))
    if pooled:
        print("\n".join(meta_table(pooled, design)))
    if ranked:
        print("\n".join(across_table(ranked, design)))
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)


if __name__ == "__main__":
    main()
