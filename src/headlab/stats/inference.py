"""Statistics for comparing arms over seeds (numpy and scipy only).

Outcomes here are bounded (accuracies in [0, 1]) and often bimodal (a seed solves the task or does not), so:
means get percentile bootstrap intervals, which stay inside the range of the values; solve rates get exact
(Clopper-Pearson) intervals; arms are compared with Welch's t-test, a paired t-test over shared seeds, or
Fisher's exact test for solve rates (paired over seeds: a conditional logistic model, McNemar's exact test); many
comparisons at once get Holm's correction. Runs cross-validated over k
folds are summarised per fold, with Nadeau & Bengio's corrected resampled t interval and test.
"""

import functools
import hashlib
import math

import numpy as np
from scipy import stats

LEVEL = 0.95


def bootstrap_interval(values: list[float], resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval (LEVEL) of the mean; (nan, nan) for fewer than 2 values."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return math.nan, math.nan
    means = x[np.random.default_rng(seed).integers(0, len(x), (resamples, len(x)))].mean(axis=1)
    tail = (1 - LEVEL) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def solve_rate(values: list[float], threshold: float) -> dict:
    """How many values reach the threshold (k of n), with the exact Clopper-Pearson interval of the rate."""
    k, n = sum(v >= threshold for v in values), len(values)
    interval = stats.binomtest(k, n).proportion_ci(LEVEL, method="exact")
    return {"k": k, "n": n, "rate": k / n, "low": float(interval.low), "high": float(interval.high)}


def welch_p(a: list[float], b: list[float]) -> float:
    """Two-sided Welch t-test (unequal variances) between two arms' values."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def paired_p(a: dict, b: dict) -> float:
    """Two-sided paired t-test over the seeds two arms share ({seed: value} each)."""
    shared = sorted(set(a) & set(b))
    if len(shared) < 2:
        return math.nan
    return float(stats.ttest_rel([a[s] for s in shared], [b[s] for s in shared]).pvalue)


def paired_interval(a: dict, b: dict, level: float = 0.95) -> tuple[float, float]:
    """The t interval of the mean paired difference a - b over the seeds two arms share ({seed: value} each)."""
    shared = sorted(set(a) & set(b))
    if len(shared) < 2:
        return math.nan, math.nan
    d = np.array([a[s] - b[s] for s in shared], dtype=float)
    half = stats.t.ppf(0.5 + level / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return float(d.mean() - half), float(d.mean() + half)


def fisher_p(a: dict, b: dict) -> float:
    """Two-sided Fisher exact test between two solve rates (solve_rate's dicts)."""
    table = [[a["k"], a["n"] - a["k"]], [b["k"], b["n"] - b["k"]]]
    return float(stats.fisher_exact(table).pvalue)


def paired_solve(a: dict, b: dict) -> dict:
    """Solve rates of two arms paired over the seeds they share ({seed: solved} each): the conditional logistic
    model of solving on the arm with the seeds as strata (Breslow & Day 1980). With two arms only the seeds
    where exactly one arm solved inform it: the conditional odds ratio is (solved by a only) / (solved by b only),
    and its exact test the binomial test of those seeds (McNemar's exact test). {"p_value", "odds_ratio",
    "only_a", "only_b", "pairs"}."""
    shared = sorted(set(a) & set(b))
    x, y = np.array([bool(a[s]) for s in shared]), np.array([bool(b[s]) for s in shared])
    only_a, only_b = int(np.sum(x & ~y)), int(np.sum(~x & y))
    odds = only_a / only_b if only_b else (math.inf if only_a else math.nan)
    p = mcnemar_p(x, y) if shared else math.nan
    return {"p_value": p, "odds_ratio": odds, "only_a": only_a, "only_b": only_b, "pairs": len(shared)}


def holm(p_values: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (nan ones are left out of the family and stay nan)."""
    present = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    adjusted, running = [math.nan] * len(p_values), 0.0
    for rank, (p, i) in enumerate(present):
        running = max(running, min(1.0, (len(present) - rank) * p))
        adjusted[i] = running
    return adjusted


def cv_variance_factor(units: int, k: int) -> float:
    """Nadeau & Bengio's (2003) corrected resampled factor for k-fold cross-validation with `units` folds measured:
    1/units + n_test/n_train, n_test/n_train = 1/(k-1). It replaces 1/units in the variance of a mean over folds,
    whose training sets overlap (the uncorrected t-test over folds is too liberal)."""
    return 1 / units + 1 / (k - 1)


def cv_interval(fold_values: list[float], k: int) -> tuple[float, float]:
    """LEVEL interval of the mean over folds (each fold's value averaged over its seeds), with the corrected
    variance and Student's t on folds - 1 degrees of freedom; (nan, nan) for fewer than 2 folds."""
    x = np.asarray(fold_values, dtype=float)
    if len(x) < 2:
        return math.nan, math.nan
    half = stats.t.ppf((1 + LEVEL) / 2, len(x) - 1) * math.sqrt(cv_variance_factor(len(x), k) * x.var(ddof=1))
    return float(x.mean() - half), float(x.mean() + half)


def cv_paired_p(a: dict, b: dict, k: int) -> float:
    """Two-sided corrected resampled paired t-test over the folds two arms share ({fold: value averaged over its
    seeds} each): t = mean(d) / sqrt(cv_variance_factor * var(d)), folds - 1 degrees of freedom."""
    shared = sorted(set(a) & set(b))
    d = np.asarray([a[f] - b[f] for f in shared], dtype=float)
    if len(d) < 2:
        return math.nan
    spread = math.sqrt(cv_variance_factor(len(d), k) * d.var(ddof=1))
    if spread == 0:
        return 1.0 if d.mean() == 0 else 0.0
    return float(2 * stats.t.sf(abs(d.mean()) / spread, len(d) - 1))


EXACT_UP_TO = 40  # seeds (both arms together) up to which a rank test without ties uses its exact distribution
RESAMPLES = 10_000  # a permutation test's resamples (all permutations where there are fewer)


def _resampled():
    return stats.PermutationMethod(n_resamples=RESAMPLES, rng=np.random.default_rng(0))


def rank_p(a: list[float], b: list[float]) -> float:
    """Two-sided Mann-Whitney U test: exact without ties up to EXACT_UP_TO values, else by seeded permutation."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    exact = len(set(a) | set(b)) == len(a) + len(b) and len(a) + len(b) <= EXACT_UP_TO
    return float(stats.mannwhitneyu(a, b, method="exact" if exact else _resampled()).pvalue)


def signed_rank_p(a: dict, b: dict) -> float:
    """Two-sided Wilcoxon signed-rank test over the seeds two arms share ({seed: value} each): exact without zero
    or tied differences up to EXACT_UP_TO pairs, else by seeded permutation (signs flipped)."""
    shared = sorted(set(a) & set(b))
    d = [a[s] - b[s] for s in shared]
    if len(d) < 2:
        return math.nan
    if not any(d):
        return 1.0
    exact = 0 not in d and len({abs(x) for x in d}) == len(d) and len(d) <= EXACT_UP_TO
    return float(stats.wilcoxon(d, method="exact" if exact else _resampled()).pvalue)


def permutation_p(a, b, paired: bool = False) -> float:
    """Two-sided permutation test of the difference of means, twice the smaller one-sided p (seeded; exact where
    the permutations are fewer than RESAMPLES): a, b lists (independent) or {seed: value} dicts (paired over shared
    seeds, signs flipped)."""
    if paired:
        shared = sorted(set(a) & set(b))
        a, b = [a[s] for s in shared], [b[s] for s in shared]
    if len(a) < 2 or len(b) < 2:
        return math.nan
    result = stats.permutation_test(
        (np.asarray(a, float), np.asarray(b, float)),
        lambda x, y, axis: np.mean(x, axis=axis) - np.mean(y, axis=axis),
        permutation_type="samples" if paired else "independent",
        n_resamples=RESAMPLES,
        rng=np.random.default_rng(0),
        vectorized=True,
    )
    return float(result.pvalue)


def mcnemar_p(a: np.ndarray, b: np.ndarray) -> float:
    """Exact McNemar test between two runs' correctness on the same examples ((N,) bools): a binomial test of the
    examples one got right and the other wrong."""
    only_a, only_b = int(np.sum(a & ~b)), int(np.sum(~a & b))
    if only_a + only_b == 0:
        return 1.0
    return float(stats.binomtest(only_a, only_a + only_b, 0.5).pvalue)


def _two_way_means(correct: np.ndarray, seeds: np.ndarray, examples: np.ndarray) -> np.ndarray:
    """Mean correctness of resampled seeds and examples: correct (S, N); seeds (R, S) and examples (R, N) are how
    often each is drawn in each of R resamples -> (R,)."""
    drawn = seeds @ correct.astype(float)  # (R, N): each example's correct seeds, as drawn; integer sums, exact
    return np.einsum("rn,rn->r", drawn, examples) / (correct.shape[0] * correct.shape[1])


@functools.lru_cache(maxsize=2)
def _counts(seed: int, resamples: int, sizes: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """How often each of n items is drawn in each of `resamples` resamples, for each n of sizes in turn, from one
    generator seeded with seed: ((R, n), ...), read-only. The same for every arm (or pair) of those sizes: drawn
    once, not again for each (the multinomial draws are most of a table's bootstrap)."""
    rng = np.random.default_rng(seed)
    drawn = tuple(rng.multinomial(size, np.full(size, 1 / size), resamples).astype(float) for size in sizes)
    for counts in drawn:
        counts.setflags(write=False)
    return drawn


def two_way_interval(correct: np.ndarray, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """LEVEL percentile interval of an arm's accuracy over seeds and test examples both (correct (S, N), seeds
    crossed with the same examples): seeds and examples are resampled independently (a two-way bootstrap)."""
    means = _two_way_means(correct, *_counts(seed, resamples, correct.shape))
    tail = (1 - LEVEL) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


_DRAWN: dict[tuple, np.ndarray] = {}  # the latest pairs' resampled differences: a contrast's p-value and interval


def _two_way_differences(a: np.ndarray, b: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """The accuracy difference a - b of two arms on the same test examples (a (S_a, N), b (S_b, N)) in each of
    `resamples` two-way resamples: the examples drawn once for both arms, each arm's seeds on their own -> (R,),
    read-only. Drawn once for a pair (by content) whose p-value and interval are both asked for."""
    content = hashlib.sha256(a.tobytes() + b.tobytes()).digest()
    key = (a.shape, b.shape, a.dtype.str, b.dtype.str, content, resamples, seed)
    if key not in _DRAWN:
        examples, seeds_a, seeds_b = _counts(seed, resamples, (a.shape[1], a.shape[0], b.shape[0]))
        drawn = _two_way_means(a, seeds_a, examples) - _two_way_means(b, seeds_b, examples)
        drawn.setflags(write=False)
        if len(_DRAWN) >= 64:
            del _DRAWN[next(iter(_DRAWN))]
        _DRAWN[key] = drawn
    return _DRAWN[key]


def two_way_paired_p(a: np.ndarray, b: np.ndarray, resamples: int = 2000, seed: int = 0) -> float:
    """Two-sided bootstrap p-value of the accuracy difference of two arms on the same test examples: twice the
    smaller share of _two_way_differences on either side of 0."""
    d = _two_way_differences(a, b, resamples, seed)
    return float(min(1.0, 2 * min(np.mean(d <= 0), np.mean(d >= 0))))


def two_way_difference(a: np.ndarray, b: np.ndarray, resamples: int = 2000, seed: int = 0) -> dict:
    """The LEVEL percentile interval and the standard error of the accuracy difference a - b, from the resamples
    two_way_paired_p draws: {"low", "high", "se"}."""
    d = _two_way_differences(a, b, resamples, seed)
    tail = (1 - LEVEL) / 2
    low, high = np.quantile(d, [tail, 1 - tail])
    return {"low": float(low), "high": float(high), "se": float(d.std(ddof=1))}


FEW_REPLICATES = 5  # below this many seeds (or folds) an arm's standard deviation is itself too uncertain to lean on


def sd_interval_factors(n: int, level: float = 0.95) -> tuple[float, float]:
    """The 95% interval of a normal population's standard deviation, as multiples of the sample's from n values
    (chi-square with n - 1 degrees of freedom): how far a variance estimate from so few may be off."""
    df = n - 1
    return (
        math.sqrt(df / stats.chi2.ppf(1 - (1 - level) / 2, df)),
        math.sqrt(df / stats.chi2.ppf((1 - level) / 2, df)),
    )
