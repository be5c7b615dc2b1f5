"""A sweep planned from an earlier one (numpy and scipy only): for each arm against the baseline, the smallest
difference the planned replicates detect at 80% power with the test compare will use, the replicates a stated margin
needs, and the share of the prior's runs still improving at the planned epoch.

The test is compare's: Welch's t over seeds (sds of the prior's arm and baseline), or the corrected resampled paired
t over k-fold cross-validation folds (the sd of the prior's per-fold differences). An arm the prior did not run is
planned with its baseline's spread on both sides (said in `from`). Shapes: plain lists of records (stats.runs).
"""

import math
import statistics

from headlab.stats import power
from headlab.stats.comparison import improving_at_end, same_value


def config_key(override: str) -> str:
    """The config key an override sets: +design=x -> design, ~a.b -> a.b."""
    return override.split("=", 1)[0].lstrip("+~")


def runs_of(records: list[dict], conditions: dict[str, str]) -> list[dict]:
    """The records whose config has each key at the value a command line writes."""
    return [r for r in records if all(same_value(r["config"].get(k), v) for k, v in conditions.items())]


def _values(runs: list[dict], metric: str) -> list[float]:
    return [float(r["metrics"][metric]) for r in runs if isinstance(r["metrics"].get(metric), int | float)]


def still_improving(runs: list[dict], epochs: int) -> float | None:
    """The share of runs whose val/acc at validation `epochs` beat every earlier one by more than compare's margin
    (compare's "improving at end", read at the planned epoch); None where no run validated that many times."""
    reached = [r["curve"][:epochs] for r in runs if len(r.get("curve") or []) >= epochs]
    return sum(map(improving_at_end, reached)) / len(reached) if reached else None


def contrast(arm: list[dict], base: list[dict], metric: str, folds: int | None) -> dict | None:
    """The spread a contrast's test meets: {sd_a, sd_b} over seeds, {sd_difference} over folds (paired by
    data.cv.fold); None where the prior has fewer than 2 values a side (or 2 paired folds)."""
    if folds:
        by_fold = lambda runs: {r["config"].get("data.cv.fold"): r["metrics"].get(metric) for r in runs}  # noqa: E731
        a, b = by_fold(arm), by_fold(base)
        paired = [
            a[f] - b[f] for f in a.keys() & b.keys() if isinstance(a[f], int | float) and isinstance(b[f], int | float)
        ]
        return {"sd_difference": statistics.stdev(paired)} if len(paired) >= 2 else None
    a, b = _values(arm, metric), _values(base, metric)
    if len(a) < 2 or len(b) < 2:
        return None
    return {"sd_a": statistics.stdev(a), "sd_b": statistics.stdev(b)}


def power_at(spread: dict, delta: float, n: int, folds: int | None) -> float:
    """The test's power to detect delta with n replicates an arm (n folds of `folds`-fold CV)."""
    if folds:
        return power.cv_paired_power(delta, spread["sd_difference"], n, folds)
    return power.t_power(delta, spread["sd_a"], spread["sd_b"], n, n)


def detectable(spread: dict, n: int, folds: int | None) -> float:
    """The smallest difference detected at 80% power with n replicates an arm."""
    sd = spread["sd_difference"] if folds else math.sqrt(spread["sd_a"] ** 2 + spread["sd_b"] ** 2)
    return power.smallest_detectable(lambda d: power_at(spread, d, n, folds), sd / math.sqrt(max(n, 1)))


def needed(spread: dict, effect: float, folds: int | None) -> int | None:
    """The fewest replicates an arm that detect `effect` at 80% power; None beyond 10,000 seeds (or beyond the k
    folds there are)."""
    return power.seeds_needed(lambda n: power_at(spread, effect, n, folds), limit=folds or power.MAX_SEEDS)


def plan_arm(
    arm: list[dict],
    base: list[dict],
    metric: str,
    replicates: int,
    epochs: int,
    effect: float | None = None,
    folds: int | None = None,
) -> dict:
    """An arm's plan from the prior's runs of it and of its baseline: {detectable, needed_for_effect,
    still_improving, from}; `from` says whose spread it rests on ("prior": both sides' runs; "baseline": the
    baseline's alone, the prior not having the arm; "none": neither, and nothing is said)."""
    spread, source = contrast(arm, base, metric, folds), "prior"
    if spread is None:
        spread, source = contrast(base, base, metric, None), "baseline"
        if spread is not None and folds:  # two independent folds' spread, as if unpaired
            spread = {"sd_difference": math.sqrt(2) * spread["sd_a"]}
    share = still_improving(arm or base, epochs)
    return {
        "from": source if spread else "none",
        "detectable": None if spread is None else round(detectable(spread, replicates, folds), 6),
        "needed_for_effect": None if spread is None or effect is None else needed(spread, effect, folds),
        "still_improving": None if share is None else round(share, 3),
    }


def largest_within(seconds_at, budget_s: float, most: int) -> int | None:
    """The largest replicates n in 2..most whose seconds_at(n) fit the budget; None where 2 do not."""
    fitting = [n for n in range(2, most + 1) if seconds_at(n) <= budget_s]
    return max(fitting) if fitting else None
