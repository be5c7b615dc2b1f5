"""Time to reach a threshold as a survival outcome: from each run's validation curve, the step at which a metric
first reached the threshold, or, for a run that never did, the last step it was validated at (censored).
Per arm, the Kaplan-Meier estimate of the share of runs not yet there, its median with a 95% interval, and the
log-rank test between arms (scipy's ecdf and logrank)."""

import math
import warnings

import numpy as np
from scipy import stats


def time_to_reach(curve: list[dict], metric: str, at_least: bool, threshold: float) -> tuple[int, bool] | None:
    """(step, reached): the first validation at which metric >= threshold (at_least) or <= threshold; else the last
    validation's step and False (censored). None for a run without that metric in its curve."""
    points = [p for p in curve if p.get(metric) is not None]
    if not points:
        return None
    for point in points:
        if (point[metric] >= threshold) if at_least else (point[metric] <= threshold):
            return point["step"], True
    return points[-1]["step"], False


def _censored(times: list[int], reached: list[bool]) -> stats.CensoredData:
    return stats.CensoredData(
        uncensored=[t for t, r in zip(times, reached, strict=True) if r],
        right=[t for t, r in zip(times, reached, strict=True) if not r],
    )


def kaplan_meier(times: list[int], reached: list[bool]) -> dict:
    """The Kaplan-Meier curve of the share of runs that have not reached the threshold by each step, with its 95%
    pointwise interval (Greenwood's variance, log-log scale); the median steps with its interval (where the
    curve's band crosses one half; None: not reached within the runs' budget); reached k of n."""
    summary = {"n": len(times), "k": int(sum(reached)), "median": None, "low": None, "high": None}
    if not summary["k"]:
        return {**summary, "steps": [], "survival": []}
    sf = stats.ecdf(_censored(times, reached)).sf
    with warnings.catch_warnings():  # undefined where the curve is 0 or 1: the band's limits there, below
        warnings.simplefilter("ignore", RuntimeWarning)
        band = sf.confidence_interval(0.95, method="log-log")
    steps, survival = sf.quantiles, sf.probabilities
    lower, upper = np.nan_to_num(band.low.probabilities, nan=0.0), np.nan_to_num(band.high.probabilities, nan=1.0)
    upper = np.where(survival == 0, 0.0, upper)  # every run there: no run left that has not
    first = lambda values: next((int(s) for s, v in zip(steps, values, strict=True) if v <= 0.5), None)  # noqa: E731
    summary.update(median=first(survival), low=first(lower), high=first(upper))
    return {**summary, "steps": steps.tolist(), "survival": survival.tolist()}


def logrank_p(a: tuple[list[int], list[bool]], b: tuple[list[int], list[bool]]) -> float:
    """Two-sided log-rank test between two arms' (times, reached); nan where neither reached the threshold.

    Where every run still at risk reaches it at the same single step (both arms alike), observed and expected
    counts agree and their variance is 0: scipy's 0/0 is nan, the test's limit is p = 1 (nothing tells them apart)."""
    if not (any(a[1]) or any(b[1])):
        return math.nan
    with np.errstate(invalid="ignore"):
        p = float(stats.logrank(_censored(*a), _censored(*b)).pvalue)
    return 1.0 if math.isnan(p) else p
