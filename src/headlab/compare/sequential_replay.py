"""A table's contrasts replayed as a group-sequential design (--sequential K): each arm read against its baseline
at K looks over its seeds in order, as sweep.sequential would have run them (Welch's test at each look's level,
headlab.stats.sequential), beside the same contrast read once on every seed; and how many runs the rounds would
have needed for it."""

from headlab.escape import markdown_cell
from headlab.stats import sequential
from headlab.stats.comparison import baselines
from headlab.stats.contrasts import CompareError, Design


def replay_table(rows: list[dict], keys: list[str], design: Design, looks: int) -> list[str]:
    """compare.md's lines: what the rounds would have read and run, then a row per contrast."""
    metric = design.metrics[0]
    if any("folds" in (row.get(metric) or {}) for row in rows):
        raise CompareError(
            "--sequential replays seeds, and these runs are cross-validated: folds are not read in rounds"
        )
    read, runs = [], {}  # runs: each group's replicates under the rounds (id of its row -> n)
    for row, base in zip(rows, baselines(rows, keys, design), strict=True):
        mine = _in_order(row.get(metric))
        runs[id(row)] = max(runs.get(id(row), 0), len(mine) if base is None else 0)
        if base is None or row is base or not mine or metric not in base:
            continue
        theirs = _in_order(base[metric])
        sizes = tuple(sequential.look_sizes(min(len(mine), len(theirs)), looks))
        rounds = sequential.run(mine, theirs, sizes, design.effect)
        once = sequential.fixed(mine[: sizes[-1]], theirs[: sizes[-1]], design.effect)
        read.append((row, sizes, rounds, once))
        runs[id(row)] = rounds["replicates"]  # its baseline runs as long as its longest arm
        runs[id(base)] = max(runs.get(id(base), 0), rounds["replicates"])
    if not read:
        return [f"Replayed as if sequential: no arm has a baseline with {metric} to read against."]
    all_runs = sum(len(_in_order(row.get(metric))) for row in rows)
    needed = sum(runs.values())
    same = sum(rounds["reading"] == once["reading"] for _, _, rounds, once in read)
    margin = f" or its repeated interval within ±{design.effect:g}" if design.effect else ""
    lines = [
        f"Replayed as if sequential (--sequential {looks}: sweep.sequential's rounds at {_sizes(read)} seeds, seeds "
        f"in order; Welch's test on {metric} at each look's Lan-DeMets O'Brien-Fleming-like level, an arm stopping "
        f"when significant{margin}): **{needed} of {all_runs} runs** ({needed / all_runs:.0%}), the same reading as "
        f"every seed read once in {same} of {len(read)} contrasts.",
        "",
        f"| {' | '.join(keys)} | stopped at | reading | p (the look's level) | Δ [repeated CI] | all seeds read once |",
        "|" + "---|" * (len(keys) + 5),
    ]
    for row, sizes, rounds, once in read:
        low, high = rounds["interval"]
        lines.append(
            f"| {' | '.join(markdown_cell(row[k]) for k in keys)} | look {rounds['look']} of {len(sizes)} "
            f"({rounds['replicates']} seeds) | {rounds['reading'] or 'undecided'} | {rounds['p']:.3g} "
            f"({rounds['level']:.3g}) | {rounds['difference']:+.4f} [{low:+.4f}, {high:+.4f}] | "
            f"{once['reading'] or 'undecided'} (p {once['p']:.3g}) |"
        )
    return lines


def _in_order(summary: dict | None) -> list[float]:
    """A group's values of a metric in the order of their seeds."""
    if not summary or "values" not in summary:
        return []
    pairs = sorted(zip(summary["seeds"], summary["values"], strict=True), key=lambda sv: (str(type(sv[0])), sv[0]))
    return [value for _, value in pairs]


def _sizes(read: list) -> str:
    sizes = sorted({s for _, sizes, _, _ in read for s in [sizes]})
    return "; ".join(", ".join(map(str, s)) for s in sizes)
