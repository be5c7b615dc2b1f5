"""Group-sequential reading of a contrast: Lan-DeMets O'Brien-Fleming-like boundaries whose type I error is measured
by simulating null experiments through the same code, power near the fixed design's with fewer replicates, and the
stops a sweep relies on (a broken arm at the first look, an arm without a real difference to the end)."""

import math

import numpy as np
import pytest
from scipy import stats

from headlab.stats import sequential

LOOKS = (4, 7, 10)  # seeds an arm at each look; 10 planned


def test_the_spending_function_and_the_first_boundary_are_lan_demets_obrien_fleming_like():
    z = stats.norm.ppf(0.975)
    assert sequential.spent(1.0) == pytest.approx(0.05)
    assert sequential.spent(0.4) == pytest.approx(2 - 2 * stats.norm.cdf(z / math.sqrt(0.4)))
    c = sequential.boundaries((0.4, 0.7, 1.0))
    assert c[0] == pytest.approx(stats.norm.ppf(1 - sequential.spent(0.4) / 2))  # the first look: exact
    assert c[0] > c[1] > c[2] > z  # early looks demand more; the last a little more than the fixed design's 1.96
    # each look spends what the function says: P(first crossing at k) by simulating Brownian paths of another seed
    rng = np.random.default_rng(7)
    paths = np.cumsum(rng.standard_normal((200_000, 3)) * np.sqrt([0.4, 0.3, 0.3]), axis=1) / np.sqrt([0.4, 0.7, 1.0])
    crossed = np.abs(paths) >= c
    first = [crossed[:, 0], crossed[:, 1] & ~crossed[:, 0], crossed[:, 2] & ~crossed[:, :2].any(axis=1)]
    spends = [sequential.spent(0.4), sequential.spent(0.7) - sequential.spent(0.4), 0.05 - sequential.spent(0.7)]
    for found, wanted in zip(first, spends, strict=True):
        assert found.mean() == pytest.approx(wanted, abs=0.002)


def test_two_thousand_null_experiments_find_at_most_five_and_a_half_percent_and_power_holds_with_fewer_runs():
    """Null: two arms of the same normal, read at 4, 7 and 10 seeds through sequential.run; alternative: a shift of
    1.5 sd, against the fixed design's Welch test at 10 seeds."""
    rng = np.random.default_rng(1)
    null = [sequential.run(list(rng.standard_normal(10)), list(rng.standard_normal(10)), LOOKS) for _ in range(2000)]
    false_positives = sum(r["reading"] == "significant" for r in null) / len(null)
    assert false_positives <= 0.055
    sequential_hits, fixed_hits, used = 0, 0, []
    for _ in range(2000):
        a, b = rng.standard_normal(10) + 1.5, rng.standard_normal(10)
        r = sequential.run(list(a), list(b), LOOKS)
        sequential_hits += r["reading"] == "significant"
        fixed_hits += stats.ttest_ind(a, b, equal_var=False).pvalue < 0.05
        used.append(r["replicates"])
    assert sequential_hits / 2000 >= fixed_hits / 2000 - 0.05
    assert np.mean(used) < 9  # fewer runs on average than the fixed design's 10 (about 17% fewer)


def test_a_broken_arm_stops_at_the_first_look_and_one_without_a_difference_runs_to_the_maximum():
    rng = np.random.default_rng(3)
    plain = list(0.9 + 0.01 * rng.standard_normal(10))
    broken = list(0.1 + 0.01 * rng.standard_normal(10))  # a learning rate of 1e-6: chance
    same = list(0.9 + 0.01 * rng.standard_normal(10))
    stopped = sequential.run(broken, plain, LOOKS)
    assert stopped["look"] == 1 and stopped["replicates"] == 4 and stopped["reading"] == "significant"
    assert stopped["p"] < sequential.level(sequential.boundaries((0.4, 0.7, 1.0))[0])
    ran = sequential.run(same, plain, LOOKS)  # no margin stated: a match cannot be decided early
    assert ran["look"] == 3 and ran["replicates"] == 10 and ran["reading"] is None
    within = sequential.run(same, plain, LOOKS, margin=0.05)  # with one: its repeated interval inside +-0.05
    assert within["reading"] == "within margin" and within["look"] < 3  # decided before the maximum
    low, high = within["interval"]
    assert -0.05 < low < within["difference"] < high < 0.05


def test_over_folds_two_thousand_null_experiments_find_at_most_five_and_a_half_percent():
    """Rounds over the folds of a 10-fold cross-validation (4, 7, 10 folds), the corrected paired t at each look:
    each fold's difference a null normal correlated 1/k with the others, as overlapping training sets make them
    (Nadeau & Bengio's model, which the correction assumes)."""
    rng, k = np.random.default_rng(5), 10
    folds = lambda a, b, c: sequential.folds_look(dict(enumerate(a)), dict(enumerate(b)), k, c)  # noqa: E731
    hits = 0
    for _ in range(2000):
        d = math.sqrt(1 / k) * rng.standard_normal() + math.sqrt(1 - 1 / k) * rng.standard_normal(k)
        hits += sequential.run(list(d), [0.0] * k, LOOKS, test=folds)["reading"] == "significant"
    assert hits / 2000 <= 0.055
    # the look's test is the corrected paired t, written out: t = mean / sqrt((1/m + 1/(k-1)) var), m - 1 df
    a, b = [0.81, 0.79, 0.84, 0.80], [0.78, 0.78, 0.80, 0.79]
    d = np.subtract(a, b)
    t = d.mean() / math.sqrt((1 / 4 + 1 / 9) * d.var(ddof=1))
    p, mean, (low, high) = folds(a, b, sequential.boundaries((0.4, 0.7, 1.0))[0])
    assert p == pytest.approx(2 * stats.t.sf(t, 3)) and mean == pytest.approx(d.mean()) and low < mean < high
