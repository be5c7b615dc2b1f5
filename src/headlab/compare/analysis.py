"""What a comparison states: its analysis, as one mapping of option names to values (the command line's flags, an
experiment's `compare` key, a table's compare.json), checked once into an Analysis (a Design and what is read).

An option's name is its flag without the dashes, with _ for - (--select-on: select_on); a flag given several times
(--metric) is a list. Older records and experiment files give the analysis as the flags themselves (a list of
strings): from_flags reads those.
"""

import argparse
import math
from dataclasses import dataclass

from headlab.record import VAL_ACC_BEST
from headlab.stats import budget
from headlab.stats.comparison import METRICS
from headlab.stats.contrasts import TESTS, CompareError, Design


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options that say how runs are compared: what an experiment's `compare` key may state."""
    parser.add_argument(
        "--metric", action="extend", nargs="+", help=f"metrics to show (default: {', '.join(METRICS[:2])})"
    )
    parser.add_argument("--baseline", metavar="KEY=VALUE", help="add each group's difference to this group")
    parser.add_argument(
        "--within", metavar="KEY", action="append", help="with --baseline: compare only with the baseline of equal KEY"
    )
    parser.add_argument("--paired", action="store_true", help="with --baseline: pair the test over shared seeds")
    parser.add_argument(
        "--test",
        choices=list(TESTS),
        default="welch",
        help="with --baseline: the test (docs/statistics.md: which when)",
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
    parser.add_argument("--select-on", default=VAL_ACC_BEST, help="validation metric for --select")
    parser.add_argument(
        "--sequential",
        type=int,
        metavar="K",
        help="with --baseline: replay each contrast as sweep.sequential's K rounds over the seeds would have read it",
    )
    parser.add_argument("--pruning", action="store_true", help="add the pruning curves of heads.json per group")
    parser.add_argument("--roles", action="store_true", help="add the runs with a head in each role, per group")
    parser.add_argument(
        "--where", metavar="KEY=VALUE", action="append", help="only the runs whose config has KEY=VALUE (e.g. one rate)"
    )


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, add_help=False, allow_abbrev=False, exit_on_error=False)
    add_options(parser)
    return parser


DEFAULTS = {a.dest: a.default for a in _parser("")._actions}  # every option's name and its value when not given
FLAGS = {flag for action in _parser("")._actions for flag in action.option_strings}
LISTS = {a.dest for a in _parser("")._actions if isinstance(a, argparse._AppendAction)}
TYPES = {a.dest: a.type for a in _parser("")._actions if a.type is not None}  # effect: float


def from_flags(flags: list[str], prog: str) -> dict:
    """The options a list of flags states (["--select", "optim.lr", "--power"]), in the order first given; anything
    but analysis options, written out in full, is a CompareError naming where it was stated (prog)."""
    parser = _parser(prog)
    try:
        parsed, rest = parser.parse_known_args([str(f) for f in flags])
    except argparse.ArgumentError as error:
        raise CompareError(f"{prog}: {error}") from None
    if rest:  # exactly the analysis's options, written out: --int is not --into, nor anything else
        raise CompareError(f"{prog}: {rest[0]} is not an analysis option")
    given = vars(parsed)
    dests = {flag: a.dest for a in parser._actions for flag in a.option_strings}
    order = dict.fromkeys(dests[f.split("=", 1)[0]] for f in map(str, flags) if f.split("=", 1)[0] in dests)
    return {k: given[k] for k in order if given[k] != DEFAULTS[k]}


def options(stated, where: str) -> dict:
    """Every option's value: what `stated` says (a mapping of option names, or a list of flags), the defaults for
    the rest. An unknown name is a CompareError naming where it was stated."""
    if isinstance(stated, list | tuple):
        stated = from_flags(list(stated), where)
    unknown = sorted(set(stated) - set(DEFAULTS))
    if unknown:
        raise CompareError(f"{where}: {', '.join(unknown)} is not an analysis option; they are {', '.join(DEFAULTS)}")
    given = {k: ([v] if k in LISTS and not isinstance(v, list | tuple) else v) for k, v in stated.items()}
    given = {k: (list(map(str, v)) if k in LISTS and v is not None else v) for k, v in given.items()}
    for key in set(TYPES) & set(given):
        try:
            given[key] = TYPES[key](given[key]) if given[key] is not None else None
        except ValueError:
            raise CompareError(f"{where}: {key} takes a number, got {given[key]!r}") from None
    return {**given, **{k: v for k, v in DEFAULTS.items() if k not in given}}  # in the order stated


def stated(values: dict) -> dict:
    """The options that differ from their defaults: what a table's compare.json records."""
    return {k: v for k, v in values.items() if k in DEFAULTS and v != DEFAULTS[k]}


@dataclass(frozen=True)
class Analysis:
    """A comparison's analysis, checked: the Design the statistics take, and what is read and added to the table
    (only the runs with each KEY=VALUE of where; the pruning curves; the head roles; the contrasts replayed as K
    sequential rounds)."""

    design: Design
    where: tuple[str, ...] = ()
    pruning: bool = False
    roles: bool = False
    sequential: int | None = None
    options: tuple = ()  # (name, value) of each option stated: what compare.json records


def analysis(values: dict) -> Analysis:
    """The Analysis of every option's value (options()); a value that means nothing is a CompareError naming its
    flag."""
    v = values
    solved = _pair(v["solved"], ">=", "--solved")
    if solved:
        try:
            solved = (solved[0], float(solved[1]))
        except ValueError:
            raise CompareError(f"--solved takes METRIC>=NUMBER, got {v['solved']!r}") from None
        if not math.isfinite(solved[1]):
            raise CompareError(f"--solved takes a finite threshold, got {v['solved']!r}")
    if v["effect"] is not None and not (math.isfinite(v["effect"]) and v["effect"] > 0):
        raise CompareError(f"--effect takes a difference > 0 (the smallest that matters), got {v['effect']}")
    if v["select"] in ("seed", "data.seed"):
        raise CompareError(
            f"--select takes a setting chosen per arm (optim.lr, say), not {v['select']}: seeds replicate"
        )
    if v["test"] not in TESTS:
        raise CompareError(f"--test takes one of {', '.join(TESTS)}, got {v['test']!r}")
    baseline = _pair(v["baseline"], "=", "--baseline")
    needs = {"within": "--within needs --baseline", "power": "--power needs --baseline (power is a contrast's)"}
    needs["meta"] = "--meta needs --baseline (it pools each arm's contrast with its baseline)"
    needs["sequential"] = "--sequential needs --baseline (it replays each arm's contrast with its baseline)"
    for name, said in needs.items():
        if v[name] and not baseline:
            raise CompareError(said)
    if v["effect"] is not None and not (baseline or v["across"]):
        raise CompareError(
            "--effect needs --baseline (the difference that matters) or --across (the gap that does not)"
        )
    if v["sequential"] is not None and v["sequential"] < 2:
        raise CompareError(f"--sequential takes the number of looks, 2 or more, got {v['sequential']}")
    if v["sequential"] and (v["select"] or v["meta"] or v["across"]):
        raise CompareError(
            "--sequential replays what sweep.sequential runs, every arm at each of its values over seeds: not with "
            "--select, --meta or --across (read each rate with --within KEY)"
        )
    metrics = list(v["metric"] or METRICS[:2])
    for at in v["at"] or []:
        try:
            metrics.append(budget.label(at))
        except ValueError:
            raise CompareError(
                f"--at takes steps=N or flops=F (compare at N training steps or F training FLOPs, read from the "
                f"curves), got {at!r}"
            ) from None
    design = Design(
        metrics=metrics,
        baseline=baseline,
        paired=bool(v["paired"]),
        solved=solved,
        select=(v["select"], v["select_on"]) if v["select"] else None,
        within=list(v["within"] or []),
        test=v["test"],
        log=list(v["log"] or []),
        effect=v["effect"],
        power=bool(v["power"]),
        reach=_reach(v["reach"]) if v["reach"] else None,
        meta=v["meta"],
        across=v["across"],
    )
    chosen = tuple((k, tuple(x) if isinstance(x, list) else x) for k, x in stated(values).items())
    read = (tuple(v["where"] or ()), bool(v["pruning"]), bool(v["roles"]), v["sequential"])
    return Analysis(design, *read, chosen)


def _pair(text: str | None, sep: str, flag: str) -> tuple[str, str] | None:
    if text is None:
        return None
    parts = str(text).split(sep, 1)
    if len(parts) != 2 or not all(p.strip() for p in parts):
        raise CompareError(f"{flag} takes KEY{sep}VALUE, got {text!r}")
    return parts[0].strip(), parts[1].strip()


def _reach(text: str) -> tuple[str, str, float]:
    """--reach METRIC>=X or METRIC<=X -> (metric, op, X)."""
    op = ">=" if ">=" in text else "<="
    metric, _, threshold = text.partition(op)
    try:
        if metric.strip():
            return metric.strip(), op, float(threshold)
    except ValueError:
        pass
    raise CompareError(f"--reach takes METRIC>=X or METRIC<=X (a validation curve's metric), got {text!r}")


def to_flags(values: dict) -> list[str]:
    """The flags that state these options (what a table's Command line shows)."""
    flags = []
    for name, value in stated(values).items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif name in LISTS:
            flags += [word for item in value for word in (flag, str(item))]
        else:
            flags += [flag, str(value)]
    return flags


def takes_no_value(flag: str) -> bool:
    """Whether an analysis flag stands alone (--power) rather than taking a value (--select optim.lr)."""
    return any(flag in a.option_strings and a.nargs == 0 for a in _parser("")._actions)
