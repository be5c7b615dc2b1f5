"""A sweep planned from an earlier one: what the planned seeds (or folds) detect at 80% power equals a noncentral-t
computation written out here from the prior's variances; the seeds a margin needs; the share of the prior's runs
still improving at the planned epoch."""

import math
import statistics

import pytest
from scipy import optimize, stats

from headlab.stats import plan


def record(design: str, seed: int, acc: float, curve: list[float] | None = None, fold: int | None = None) -> dict:
    config = {"design": design, "seed": seed, "data.cv.fold": fold}
    points = [{"epoch": e, "step": e + 1, "val/acc": v} for e, v in enumerate(curve or [])]
    return {"config": config, "metrics": {"test/acc": acc}, "curve": points}


PLAIN = [0.80, 0.82, 0.79, 0.85, 0.81]
GATE = [0.83, 0.86, 0.84, 0.90, 0.82]


def welch_detectable_by_hand(sd_a: float, sd_b: float, n: int) -> float:
    """The d whose two-sided Welch test at alpha 0.05 has power 0.8: noncentral t with Welch's df, solved by root."""
    va, vb = sd_a**2 / n, sd_b**2 / n
    df = (va + vb) ** 2 / (va**2 / (n - 1) + vb**2 / (n - 1))
    crit = stats.t.ppf(0.975, df)

    def power(d):  # the far tail underflows to nan in scipy: 0 to many digits
        nc = d / math.sqrt(va + vb)
        return stats.nct.sf(crit, df, nc) + (0 if math.isnan(far := stats.nct.cdf(-crit, df, nc)) else far)

    return optimize.brentq(lambda d: power(d) - 0.8, 1e-9, 40 * math.sqrt(va + vb))


def test_detectable_differences_and_seeds_needed_follow_the_noncentral_t_from_the_prior_s_variances():
    prior = [record("plain", s, a) for s, a in enumerate(PLAIN)] + [record("gate", s, a) for s, a in enumerate(GATE)]
    plain = plan.runs_of(prior, {"design": "plain"})
    gate = plan.plan_arm(plan.runs_of(prior, {"design": "gate"}), plain, "test/acc", 10, 5, effect=0.02)
    sink = plan.plan_arm(plan.runs_of(prior, {"design": "sink"}), plain, "test/acc", 10, 5)
    expected = welch_detectable_by_hand(statistics.stdev(GATE), statistics.stdev(PLAIN), 10)
    assert gate["from"] == "prior"
    assert gate["detectable"] == pytest.approx(expected, abs=1e-5)
    # seeds for 0.02: the fewest n whose power reaches 0.8, by the same formula
    by_hand = next(
        n
        for n in range(2, 1000)
        if welch_detectable_by_hand(statistics.stdev(GATE), statistics.stdev(PLAIN), n) <= 0.02
    )
    assert gate["needed_for_effect"] == by_hand
    # an arm the prior never ran: the baseline's spread on both sides, said
    assert sink["from"] == "baseline"
    assert sink["detectable"] == pytest.approx(welch_detectable_by_hand(*[statistics.stdev(PLAIN)] * 2, 10), abs=1e-5)


def test_over_folds_the_corrected_paired_t_of_the_prior_s_fold_differences_is_planned():
    k = 10
    plain = [record("plain", 0, a, fold=f) for f, a in enumerate(PLAIN)]
    gate = [record("gate", 0, a, fold=f) for f, a in enumerate(GATE)]
    row = plan.plan_arm(gate, plain, "test/acc", 10, 5, folds=k)
    sd = statistics.stdev([g - p for g, p in zip(GATE, PLAIN, strict=True)])
    factor = 1 / 10 + 1 / (k - 1)  # Nadeau & Bengio: the variance of the mean of 10 folds of 10-fold CV, over sd^2
    crit = stats.t.ppf(0.975, 9)

    def power(d):
        nc = d / (sd * math.sqrt(factor))
        return stats.nct.sf(crit, 9, nc) + stats.nct.cdf(-crit, 9, nc)

    bracket = 6 * sd * math.sqrt(factor)
    assert row["detectable"] == pytest.approx(optimize.brentq(lambda d: power(d) - 0.8, 1e-9, bracket), abs=1e-5)


def test_still_improving_is_read_at_the_planned_epoch_from_the_prior_s_curves():
    rising, flat = [0.5, 0.6, 0.7, 0.8, 0.9], [0.5, 0.9, 0.9, 0.9, 0.9]
    prior = [record("plain", s, 0.8, rising if s < 2 else flat) for s in range(4)]
    assert plan.still_improving(prior, 5) == 0.5  # two of four still rising at their fifth validation
    assert plan.still_improving(prior, 2) == 1.0  # at the second, every run had just improved
    assert plan.still_improving(prior, 6) is None  # none validated six times
    assert plan.largest_within(lambda n: 60 * n, 300, 10) == 5 and plan.largest_within(lambda n: 600, 300, 10) is None
