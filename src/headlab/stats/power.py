"""Statistical power of a contrast between two arms, and the seeds a contrast needs (numpy and scipy only).

Means are compared by t-tests: power from the noncentral t distribution (Welch's degrees of freedom for
independent arms; the differences' sd for paired ones). Rank and permutation tests have no closed form: their
power is read from the t-test's, which they approach for the sample sizes a sweep has. The test over seeds and
test examples is powered by the normal approximation at its bootstrap's standard error. Solve rates are compared
by Fisher's exact test, its power simulated (seeded); paired over seeds, by McNemar's exact test, its power summed
exactly. Over cross-validation folds, the corrected resampled t-test's, from its corrected variance.

Power is read at a difference someone stated (the margin): power at the observed difference is a function of the
p-value and says nothing more (Hoenig & Heisey 2001). Without a margin, a contrast reports the smallest difference
its test had 80% power to detect.
"""

import math

import numpy as np
from scipy import stats

from headlab.stats import inference

ALPHA = 0.05
TARGET = 0.8  # the power a planned sweep aims at
MAX_SEEDS = 10_000


def t_power(delta: float, sd_a: float, sd_b: float, n_a: int, n_b: int, alpha: float = ALPHA) -> float:
    """Power of a two-sided Welch t-test to detect a difference of means `delta` between arms of these sds and
    sizes."""
    if n_a < 2 or n_b < 2 or any(map(math.isnan, (delta, sd_a, sd_b))):
        return math.nan
    va, vb = sd_a**2 / n_a, sd_b**2 / n_b
    if va + vb == 0:
        return 1.0 if delta else math.nan
    df = (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1)) if va and vb else n_a + n_b - 2
    return _two_sided_power(delta / math.sqrt(va + vb), df, alpha)


def paired_power(delta: float, sd_difference: float, n: int, alpha: float = ALPHA) -> float:
    """Power of a two-sided paired t-test over n pairs whose differences have this sd."""
    if n < 2 or math.isnan(delta) or math.isnan(sd_difference):
        return math.nan
    if sd_difference == 0:
        return 1.0 if delta else math.nan
    return _two_sided_power(delta / (sd_difference / math.sqrt(n)), n - 1, alpha)


def cv_paired_power(delta: float, sd_difference: float, folds: int, k: int, alpha: float = ALPHA) -> float:
    """Power of the corrected resampled paired t-test (inference.cv_paired_p) over `folds` of k-fold CV whose
    per-fold differences have this sd: noncentral t on folds - 1 df with the corrected variance of the mean. Exact
    where the folds' differences are exchangeable normals of correlation 1/k (Nadeau & Bengio's model, all k
    folds measured)."""
    if folds < 2 or math.isnan(delta) or math.isnan(sd_difference):
        return math.nan
    if sd_difference == 0:
        return 1.0 if delta else math.nan
    spread = math.sqrt(inference.cv_variance_factor(folds, k)) * sd_difference
    return _two_sided_power(delta / spread, folds - 1, alpha)


def normal_power(delta: float, se: float, alpha: float = ALPHA) -> float:
    """Power of a two-sided test whose estimate of a difference delta is normal with standard error se (a
    bootstrap's): how the test over seeds and test examples (--test examples) is powered."""
    if not se > 0:
        return math.nan
    z = stats.norm.ppf(1 - alpha / 2)
    return float(stats.norm.cdf(delta / se - z) + stats.norm.cdf(-delta / se - z))


def pooled_power(delta: float, se: float, k: int, alpha: float = ALPHA) -> float:
    """Power of a random-effects mean's two-sided t-test on k - 1 degrees of freedom (Hartung-Knapp) with this
    standard error to detect a pooled difference `delta`."""
    if k < 2 or not se > 0 or math.isnan(delta):
        return math.nan
    return _two_sided_power(delta / se, k - 1, alpha)


def _two_sided_power(noncentrality: float, df: float, alpha: float) -> float:
    """P(|T| > critical) for T noncentral t; the far tail, where scipy's nct returns nan, is 0 to many digits."""
    critical, nc = stats.t.ppf(1 - alpha / 2, df), abs(noncentrality)
    near, far = stats.nct.sf(critical, df, nc), stats.nct.cdf(-critical, df, nc)
    return float(min(1.0, (1.0 if math.isnan(near) else near) + (0.0 if math.isnan(far) else far)))


def seeds_needed(power_at, target: float = TARGET, limit: int = MAX_SEEDS) -> int | None:
    """The fewest seeds per arm n (2 or more) with power_at(n) >= target; None beyond limit (or no effect)."""
    if not power_at(limit) >= target:
        return None
    low, high = 1, 2
    while not power_at(high) >= target:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if power_at(middle) >= target else (middle, high)
    return high


def smallest_detectable(power_at, scale: float, target: float = TARGET) -> float:
    """The smallest difference d > 0 with power_at(d) >= target (power rises with d), by bisection from scale (the
    test's standard error): the effect the design could detect. 0 where scale is 0; nan where power is unknown."""
    if scale == 0:
        return 0.0
    if not scale > 0 or math.isnan(power_at(scale)):
        return math.nan
    low, high = 0.0, scale
    while power_at(high) < target:
        low, high = high, high * 2
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (low, middle) if power_at(middle) >= target else (middle, high)
        if high - low <= 1e-6 * high:
            break
    return high


def fisher_power(rate_a: float, rate_b: float, n: int, alpha: float = ALPHA, sims: int = 2000, seed: int = 0) -> float:
    """Power of a two-sided Fisher exact test between two solve rates with n seeds each, by simulation."""
    if n < 1 or rate_a == rate_b:
        return math.nan if n < 1 else alpha  # no difference to find: the test's size at most
    rng = np.random.default_rng([seed, n])
    k_a, k_b = rng.binomial(n, rate_a, sims), rng.binomial(n, rate_b, sims)
    tables = {}
    for pair in zip(k_a.tolist(), k_b.tolist(), strict=True):  # few distinct tables: each tested once
        if pair not in tables:
            table = [[pair[0], n - pair[0]], [pair[1], n - pair[1]]]
            tables[pair] = stats.fisher_exact(table).pvalue <= alpha
    return float(np.mean([tables[pair] for pair in zip(k_a.tolist(), k_b.tolist(), strict=True)]))


def mcnemar_power(only_a: float, only_b: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the exact McNemar test over n paired seeds (paired solve rates) where a seed is solved by arm a
    only with probability only_a and by arm b only with only_b: exact, summed over how many seeds are discordant
    (m) and how many of those arm a solved (the test rejects where its binomial p at one half is <= alpha)."""
    discordant = only_a + only_b
    if n < 1 or only_a == only_b:
        return math.nan if n < 1 else alpha  # no difference to find: the test's size at most
    total = 0.0
    for m in range(1, n + 1):
        x = np.arange(m + 1)
        p = np.minimum(1.0, 2 * np.minimum(stats.binom.cdf(x, m, 0.5), stats.binom.sf(x - 1, m, 0.5)))
        total += stats.binom.pmf(m, n, discordant) * stats.binom.pmf(x[p <= alpha], m, only_a / discordant).sum()
    return float(total)


def verdict(p_holm: float, power: float, within: bool | None = None, alpha: float = ALPHA) -> str:
    """'significant' (Holm-adjusted p below alpha); else, given a smallest difference that matters, 'no difference
    found' where the difference's 95% interval lies within it (within: contrasts.within_margin) and the test's
    power there was 0.5 or more, 'inconclusive' where not; without one (within None), 'not significant': a margin
    nobody stated cannot be shown absent (the table gives the smallest difference the test could detect)."""
    if math.isnan(p_holm):
        return ""
    if p_holm < alpha:
        return "significant"
    if within is None:
        return "not significant"
    return "no difference found" if within and power >= 0.5 else "inconclusive"
