"""Group-sequential reading of a contrast (numpy and scipy only): a contrast read at K looks, as its replicates come
in, stops as soon as it is decided, with the overall type I error held at alpha.

The boundary is Lan & DeMets' alpha spending with the O'Brien-Fleming-like function
alpha(t) = 2 - 2 Phi(z_{alpha/2} / sqrt(t)) (t: the share of the planned replicates in at a look): it spends almost
nothing at early looks (a contrast stops early only when it is overwhelming), nearly all of alpha at the last, so
that a sweep run to its end reads almost as the fixed design would. Chosen over an anytime-valid test because the
looks are few and planned (the sweep's rounds), where spending loses least power. Each look's test is the one
compare uses (Welch's t over seeds, the corrected paired t over folds: folds_look); its two-sided p-value is read
as a z-score on the Brownian scale the boundaries are computed on, exact for normal statistics and close for t ones
(the simulation tests measure it). A contrast within a stated margin stops too: its repeated confidence interval (the
look's boundary as its level) lies inside +-margin.
"""

import math
from functools import cache

import numpy as np
from scipy import stats

from headlab.stats import inference

ALPHA = 0.05
SIGNIFICANT, WITHIN_MARGIN = "significant", "within margin"  # what a look decides (look(); None: the arm goes on)
PATHS = 400_000  # simulated Brownian paths the boundaries are read from (seeded: the same boundaries every time)


def look_sizes(replicates: int, looks: int) -> list[int]:
    """The replicates an arm has at each of `looks` rounds: evenly spread, the last all of them."""
    return sorted({max(2, -(-replicates * k // looks)) for k in range(1, looks + 1)})


def spent(t: float, alpha: float = ALPHA) -> float:
    """O'Brien-Fleming-like alpha spent by information fraction t (0 < t <= 1)."""
    return float(2 - 2 * stats.norm.cdf(stats.norm.ppf(1 - alpha / 2) / math.sqrt(t)))


@cache
def boundaries(fractions: tuple[float, ...], alpha: float = ALPHA) -> tuple[float, ...]:
    """Two-sided z boundaries c_k for looks at these information fractions (increasing, the last 1): under the null,
    the chance of first crossing |Z| >= c at look k is spent(t_k) - spent(t_{k-1}). The first is exact; the others
    are read from PATHS seeded Brownian paths."""
    if not fractions or any(b <= a for a, b in zip(fractions, fractions[1:], strict=False)) or fractions[0] <= 0:
        raise ValueError(f"information fractions must increase from above 0: {fractions}")
    rng = np.random.default_rng(0)
    steps = np.diff((0.0, *fractions))
    paths = np.cumsum(rng.standard_normal((PATHS, len(fractions))) * np.sqrt(steps), axis=1)
    z = np.abs(paths / np.sqrt(fractions))  # (PATHS, K)
    alive = np.ones(PATHS, dtype=bool)
    found, before = [], 0.0
    for k, t in enumerate(fractions):
        share = spent(t, alpha) - before
        before = spent(t, alpha)
        if k == 0:
            c = float(stats.norm.ppf(1 - share / 2))
        else:
            crossing = int(round(share * PATHS))  # the paths that may first cross here
            survivors = np.sort(z[alive, k])[::-1]
            c = float(survivors[crossing - 1]) if 0 < crossing <= len(survivors) else math.inf
        alive &= z[:, k] < c
        found.append(c)
    return tuple(found)


def z_of(p: float) -> float:
    """A two-sided p-value as the z it would be for a normal statistic."""
    return math.inf if p <= 0 else float(stats.norm.ppf(1 - p / 2))


def level(c: float) -> float:
    """The two-sided nominal level of a z boundary: the p-value a look must fall below."""
    return float(2 * (1 - stats.norm.cdf(c)))


def look(p: float, low_high: tuple[float, float], c: float, margin: float | None) -> str | None:
    """A contrast at one look: SIGNIFICANT where its p-value is below the look's nominal level, WITHIN_MARGIN where
    its repeated interval (at that level: low_high, computed by the caller's test) lies inside +-margin, else None
    (it goes on)."""
    if p < level(c):
        return SIGNIFICANT
    low, high = low_high
    if margin is not None and -margin < low and high < margin:
        return WITHIN_MARGIN
    return None


def welch_look(a: list[float], b: list[float], c: float) -> tuple[float, float, tuple[float, float]]:
    """Welch's test of a - b at a look with boundary c: (p, difference, its repeated interval at the look's level)."""
    a_, b_ = np.asarray(a, float), np.asarray(b, float)
    va, vb = a_.var(ddof=1) / len(a_), b_.var(ddof=1) / len(b_)
    d, se = float(a_.mean() - b_.mean()), math.sqrt(va + vb)
    if se == 0:
        return (1.0 if d == 0 else 0.0), d, (d, d)
    df = (va + vb) ** 2 / (va**2 / (len(a_) - 1) + vb**2 / (len(b_) - 1))
    p = float(2 * stats.t.sf(abs(d) / se, df))
    half = float(stats.t.ppf(1 - level(c) / 2, df)) * se
    return p, d, (d - half, d + half)


def folds_look(a: dict, b: dict, k: int, c: float) -> tuple[float, float, tuple[float, float]]:
    """The corrected paired t over the folds two arms share ({fold: value averaged over its seeds} each; k: the
    cross-validation's folds) at a look with boundary c: (p, difference, its repeated interval at the look's level)."""
    d = np.asarray([a[f] - b[f] for f in sorted(set(a) & set(b))], dtype=float)
    spread, mean = math.sqrt(inference.cv_variance_factor(len(d), k) * d.var(ddof=1)), float(d.mean())
    half = float(stats.t.ppf(1 - level(c) / 2, len(d) - 1)) * spread
    return inference.cv_paired_p(a, b, k), mean, (mean - half, mean + half)  # compare's test, its p


def run(arm_values: list[float], base_values: list[float], looks: tuple[int, ...], margin: float | None = None,
        alpha: float = ALPHA, test=welch_look) -> dict:  # fmt: skip
    """Read one contrast sequentially over looks at these replicate counts (increasing; the last the maximum),
    taking the first n of each arm's values at each look: {"look" (1-based, where it stopped or the last),
    "replicates", "reading" (significant, within margin, or None: not decided at the maximum), "p", "level" (the
    look's nominal level), "difference", "interval"}. test(a, b, c): a look's (p, difference, interval), Welch's by
    default; over folds, folds_look on the folds in order."""
    fractions = tuple(n / looks[-1] for n in looks)
    for k, (n, c) in enumerate(zip(looks, boundaries(fractions, alpha), strict=True), start=1):
        p, d, interval = test(arm_values[:n], base_values[:n], c)
        reading = look(p, interval, c, margin)
        if reading or k == len(looks):
            said = {"look": k, "replicates": n, "reading": reading, "p": p, "level": level(c)}
            return said | {"difference": d, "interval": interval}
    raise AssertionError("unreachable: the last look always returns")


def fixed(arm_values: list[float], base_values: list[float], margin: float | None = None, alpha: float = ALPHA) -> dict:
    """The same contrast read once, on every replicate (the fixed design): {"reading", "p", "difference",
    "interval"} at level alpha, decided as a look is."""
    c = float(stats.norm.ppf(1 - alpha / 2))
    p, d, interval = welch_look(arm_values, base_values, c)
    return {"reading": look(p, interval, c, margin), "p": p, "difference": d, "interval": interval}
