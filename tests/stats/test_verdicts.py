"""Verdicts that do not hang on the test, the grid or the seeds: rank and permutation tests, the log scale, power,
the smallest detectable difference, converged arms and unbracketed learning rates, each against an independent
computation."""

import itertools
import json
import math

import numpy as np
import pytest
from scipy import stats

from conftest import PACKED, TINY
from headlab.cli.compare import main
from headlab.compare.tables import table_rows
from headlab.launch.grid import job_number
from headlab.stats import budget, inference, power, predictions, survival
from headlab.stats.comparison import compare
from headlab.stats.contrasts import Design

HEADS = "model.attention.n_heads"


def brute_force_p(a, b, statistic) -> float:
    """Two-sided permutation p-value by enumerating every split of the pooled values (|stat| >= observed)."""
    pooled, n = list(a) + list(b), len(a)
    observed = abs(statistic(a, b))
    splits = list(itertools.combinations(range(len(pooled)), n))
    extreme = 0
    for chosen in splits:
        x = [pooled[i] for i in chosen]
        y = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        extreme += abs(statistic(x, y)) >= observed - 1e-12
    return extreme / len(splits)


def u_centred(x, y) -> float:
    ranks = stats.rankdata(list(x) + list(y))
    return ranks[: len(x)].sum() - len(x) * (len(x) + len(y) + 1) / 2


def test_rank_tests_are_exact_mann_whitney_and_wilcoxon_and_permute_where_ties_are():
    a, b = [0.81, 0.83, 0.80, 0.86, 0.84], [0.78, 0.79, 0.82, 0.77, 0.785, 0.775]
    assert inference.rank_p(a, b) == pytest.approx(stats.mannwhitneyu(a, b, method="exact").pvalue)
    tied = [0.5, 0.5, 1.0, 1.0, 1.0], [0.5, 0.5, 0.5, 0.5, 1.0]  # bimodal accuracies: a seed solves or not
    assert inference.rank_p(*tied) == pytest.approx(brute_force_p(*tied, u_centred))  # all 252 splits < 10,000
    pairs = {s: v for s, v in enumerate([0.3, -0.1, 0.5, 0.45, 0.2, 0.7, -0.05])}
    zero = dict.fromkeys(pairs, 0.0)
    assert inference.signed_rank_p(pairs, zero) == pytest.approx(
        stats.wilcoxon(list(pairs.values()), method="exact").pvalue
    )
    flips = [0.2, -0.2, 0.2, 0.4, 0.1]  # tied |d|: every sign flip enumerated
    signed = [sum(s * x for s, x in zip(signs, flips, strict=True)) for signs in itertools.product((1, -1), repeat=5)]
    ranks = stats.rankdata(np.abs(flips))
    w = lambda signs: sum(r for r, s, x in zip(ranks, signs, flips, strict=True) if s * x > 0)  # noqa: E731
    all_w = [w(signs) for signs in itertools.product((1, -1), repeat=5)]
    centre = ranks.sum() / 2
    expected = np.mean([abs(v - centre) >= abs(all_w[0] - centre) - 1e-12 for v in all_w])
    assert len(signed) == 32 and inference.signed_rank_p(
        dict(enumerate(flips)), dict.fromkeys(range(5), 0.0)
    ) == pytest.approx(expected)


def test_permutation_tests_enumerate_every_split_when_there_are_fewer_than_the_resamples():
    a, b = [0.40, 2.9, 0.35, 0.52, 0.61], [0.33, 0.30, 0.45, 0.31]  # a heavy tail (one diverged run)
    pooled, observed = a + b, np.mean(a) - np.mean(b)
    null = [
        np.mean([pooled[i] for i in chosen]) - np.mean([pooled[i] for i in range(9) if i not in chosen])
        for chosen in itertools.combinations(range(9), 5)
    ]  # two-sided: twice the smaller tail (the null is not symmetric with 5 against 4)
    tails = np.mean([t >= observed - 1e-12 for t in null]), np.mean([t <= observed + 1e-12 for t in null])
    assert inference.permutation_p(a, b) == pytest.approx(min(1.0, 2 * min(tails)))
    d = [0.01, 0.03, -0.005, 0.02, 0.015]
    flipped = [
        abs(np.mean([s * x for s, x in zip(signs, d, strict=True)])) for signs in itertools.product((1, -1), repeat=5)
    ]
    expected = np.mean([v >= abs(np.mean(d)) - 1e-12 for v in flipped])
    assert inference.permutation_p(dict(enumerate(d)), dict.fromkeys(range(5), 0.0), paired=True) == pytest.approx(
        expected
    )


def test_power_matches_the_textbook_values_and_the_seeds_needed():
    # Cohen's d = 1 with 20 per group: 0.869 (G*Power); d = 0.5 needs 64 per group; d_z = 0.5 needs 34 pairs
    assert power.t_power(1.0, 1.0, 1.0, 20, 20) == pytest.approx(0.8689528, abs=1e-4)
    assert power.seeds_needed(lambda n: power.t_power(0.5, 1.0, 1.0, n, n)) == 64
    assert power.paired_power(0.5, 1.0, 34) == pytest.approx(0.8077, abs=1e-3)
    assert power.seeds_needed(lambda n: power.paired_power(0.5, 1.0, n)) == 34


def test_fishers_simulated_power_agrees_with_its_exact_sum_over_tables():
    def exact(p_a, p_b, n):
        return sum(
            stats.binom.pmf(i, n, p_a) * stats.binom.pmf(j, n, p_b)
            for i in range(n + 1)
            for j in range(n + 1)
            if stats.fisher_exact([[i, n - i], [j, n - j]]).pvalue <= 0.05
        )

    for p_a, p_b, n in ((0.8, 1.0, 10), (0.3, 0.9, 12)):
        simulated = power.fisher_power(p_a, p_b, n)
        assert abs(simulated - exact(p_a, p_b, n)) < 4 * math.sqrt(0.25 / 2000)  # 2,000 simulations
    assert power.fisher_power(0.8, 1.0, 10) < 0.1  # 10 seeds cannot tell 0.8 from 1.0


def record(heads, seed, acc, lr=3e-3, improving=False, loss=None):
    curve = [{"step": 10, "val/acc": 0.5}, {"step": 20, "val/acc": 0.6 if improving else 0.5}]
    metrics = {"test/acc": acc, "val/acc_best": acc, **({"test/loss": loss} if loss else {})}
    return {
        "status": "completed",
        "config": {HEADS: heads, "seed": seed, "optim.lr": lr},
        "metrics": metrics,
        "curve": curve,
    }


def welch_power(delta, a, b):
    """A two-sided Welch t-test's power at delta, written out: noncentral t at Welch's df (scipy's nct)."""
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    critical, nc = stats.t.ppf(0.975, df), delta / math.sqrt(va + vb)
    return stats.nct.sf(critical, df, nc) + np.nan_to_num(stats.nct.cdf(-critical, df, nc))  # far tail: nan, ~0


def test_without_a_margin_a_contrast_gives_the_smallest_difference_it_could_detect_never_power_at_its_own():
    """Power at the observed difference is a function of p (Hoenig & Heisey 2001): with 2 folds a contrast once read
    "significant (power 1.00)". Without a margin the verdict is p's alone and the table says what 80% power needs."""
    rng = np.random.default_rng(0)
    runs = [record(h, s, 0.8 + 0.001 * (h == 4) + rng.normal(0, 0.01)) for h in (1, 4) for s in range(5)]
    _, rows = compare(runs, Design(["test/acc"], baseline=(HEADS, "1")))
    four = rows[1]["test/acc"]
    a = [r["metrics"]["test/acc"] for r in runs if r["config"][HEADS] == 4]
    b = [r["metrics"]["test/acc"] for r in runs if r["config"][HEADS] == 1]
    assert four["p_value"] == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)
    assert "power" not in four and four["p_holm"] >= 0.05 and four["verdict"] == "not significant"
    detectable = four["detectable"]  # power 0.8 there and less just below, by the formula written out
    assert welch_power(detectable, a, b) == pytest.approx(0.8, abs=1e-5)
    assert welch_power(0.95 * detectable, a, b) < 0.78
    header, body = table_rows([HEADS], rows, Design(["test/acc"], baseline=(HEADS, "1")))
    assert (
        f"not significant (detects ±{detectable:.4f} at 80%)"
        in body[1][header.index("test/acc (mean [95% bootstrap CI])")]
    )
    _, rows = compare(runs, Design(["test/acc"], baseline=(HEADS, "1"), effect=0.05))  # a large effect would show
    with_margin = rows[1]["test/acc"]
    assert with_margin["power"] == pytest.approx(welch_power(0.05, a, b))
    assert "detectable" not in with_margin and with_margin["verdict"] == "no difference found"
    header, body = table_rows([HEADS], rows, Design(["test/acc"], baseline=(HEADS, "1"), effect=0.05))
    assert (
        f"no difference found (power {with_margin['power']:.2f} at ±0.05)"
        in body[1][header.index("test/acc (mean [95% bootstrap CI])")]
    )
    clear = [record(h, s, 0.8 + 0.05 * (h == 4) + rng.normal(0, 0.01)) for h in (1, 4) for s in range(5)]
    assert compare(clear, Design(["test/acc"], baseline=(HEADS, "1")))[1][1]["test/acc"]["verdict"] == "significant"


def test_over_two_folds_the_detectable_difference_is_the_corrected_tests_and_large():
    """Two folds of 10-fold CV: the corrected t on 1 df, variance factor 1/2 + 1/9; 80% power needs a difference
    many times the folds' spread, which the table now says instead of power at the observed difference."""
    d, k = [0.010, 0.012], 10
    se = math.sqrt(1 / 2 + 1 / 9) * np.std(d, ddof=1)
    detectable = power.smallest_detectable(lambda x: power.cv_paired_power(x, np.std(d, ddof=1), 2, k), se)
    critical = stats.t.ppf(0.975, 1)
    at = lambda x: stats.nct.sf(critical, 1, x / se) + np.nan_to_num(stats.nct.cdf(-critical, 1, x / se))  # noqa: E731
    assert at(detectable) == pytest.approx(0.8, abs=1e-5) and detectable > 10 * se
    assert power.smallest_detectable(lambda x: 1.0, 0.0) == 0.0
    assert math.isnan(power.smallest_detectable(lambda x: math.nan, 0.01))


def test_no_difference_is_found_only_where_the_difference_interval_lies_within_the_stated_margin():
    z = np.random.default_rng(3).normal(size=(2, 10))
    z = (z - z.mean(axis=1, keepdims=True)) / z.std(axis=1, ddof=1, keepdims=True)  # sd 0.01 exactly, Δ 0.005
    runs = [record(h, s, 0.8 + 0.005 * (h == 4) + 0.01 * z[int(h == 4), s]) for h in (1, 4) for s in range(10)]
    four = compare(runs, Design(["test/acc"], baseline=(HEADS, "1"), effect=0.01))[1][1]["test/acc"]
    a, b = (0.8 + 0.005 * (h == 4) + 0.01 * z[int(h == 4)] for h in (4, 1))
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval()  # Welch's interval: 0.01 inside it
    half = stats.t.ppf(0.975, four["df"]) * four["se"]
    assert (four["effect"] - half, four["effect"] + half) == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert four["p_holm"] > 0.05 and four["power"] > 0.5 and ci.high > 0.01 and four["verdict"] == "inconclusive"
    wide = compare(runs, Design(["test/acc"], baseline=(HEADS, "1"), effect=0.03))[1][1]["test/acc"]
    assert wide["verdict"] == "no difference found"  # the whole interval within ±0.03
    assert [power.verdict(0.2, p, w) for p, w in ((0.3, True), (0.8, True), (0.8, False), (0.1, None))] == [
        "inconclusive", "no difference found", "inconclusive", "not significant"  # no margin: no "no difference"
    ]  # fmt: skip
    assert power.verdict(0.2, math.nan, None) == "not significant" and power.verdict(0.01, 0.1) == "significant"


def test_paired_solve_rates_are_a_conditional_logistic_model_over_seeds_tested_exactly_with_exact_power():
    from statsmodels.discrete.conditional_models import ConditionalLogit

    four = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0]  # by seed: 7 solved by h=4 only, 1 by h=1 only, 3 by both
    one = [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0]
    runs = [record(h, s, 0.1 + 0.9 * solved[s]) for h, solved in ((1, one), (4, four)) for s in range(12)]
    design = Design(["test/acc"], baseline=(HEADS, "1"), paired=True, solved=("test/acc", 0.9), power=True)
    solved = compare(runs, design)[1][1]["solved"]
    fit = ConditionalLogit(
        np.array(one + four), np.array([[0.0]] * 12 + [[1.0]] * 12), groups=np.array(list(range(12)) * 2)
    ).fit(disp=0)
    assert solved["odds_ratio"] == 7 and math.exp(fit.params[0]) == pytest.approx(7, rel=1e-4)
    assert solved["p_value"] == pytest.approx(stats.binomtest(7, 8, 0.5).pvalue)  # the discordant seeds

    def enumerated(only_a, only_b, n):  # every split of n seeds into a-only, b-only and concordant
        return sum(
            stats.multinomial.pmf([i, j, n - i - j], n, [only_a, only_b, 1 - only_a - only_b])
            for i in range(n + 1)
            for j in range(n + 1 - i)
            if i + j and stats.binomtest(i, i + j, 0.5).pvalue <= 0.05
        )

    assert solved["power"] == pytest.approx(enumerated(7 / 12, 1 / 12, 12), rel=1e-9)
    assert power.mcnemar_power(0.3, 0.05, 20) == pytest.approx(enumerated(0.3, 0.05, 20), rel=1e-9)
    n = solved["seeds_for_power"]
    assert power.mcnemar_power(7 / 12, 1 / 12, n) >= 0.8 > power.mcnemar_power(7 / 12, 1 / 12, n - 1)
    unpaired = compare(runs, Design(["test/acc"], baseline=(HEADS, "1"), solved=("test/acc", 0.9)))[1][1]["solved"]
    assert unpaired["p_value"] == pytest.approx(stats.fisher_exact([[10, 2], [4, 8]]).pvalue)
    header, body = table_rows([HEADS], compare(runs, design)[1], design)
    assert "4/12" in body[0][header.index("solved (test/acc >= 0.9; exact 95% CI)")]
    assert " OR 7 (7:1 seeds) p=" in body[1][header.index("solved (test/acc >= 0.9; exact 95% CI)")]


def test_a_log_scale_metric_is_summarised_by_its_geometric_mean_and_tested_on_its_logs():
    losses = {1: [0.40, 2.9, 0.35, 0.52, 0.61], 4: [0.33, 0.30, 0.45, 0.31, 0.36]}
    runs = [record(h, s, 0.8, loss=v) for h, vs in losses.items() for s, v in enumerate(vs)]
    _, rows = compare(runs, Design(["test/loss"], baseline=(HEADS, "1"), log=["test/loss"]))
    one, four = (row["test/loss"] for row in rows)
    assert one["mean"] == pytest.approx(stats.gmean(losses[1])) and four["ratio"] == pytest.approx(
        stats.gmean(losses[4]) / stats.gmean(losses[1])
    )
    assert four["p_value"] == pytest.approx(
        stats.ttest_ind(np.log(losses[4]), np.log(losses[1]), equal_var=False).pvalue
    )


def test_the_table_names_its_test_marks_unbracketed_rates_and_says_which_arms_converged(tmp_path):
    rates = {1: {1e-3: 0.70, 3e-3: 0.75, 1e-2: 0.80}, 4: {1e-3: 0.70, 3e-3: 0.85, 1e-2: 0.80}}  # 1 head: the edge
    for h, by_rate in rates.items():
        for lr, acc in by_rate.items():
            for s in range(3):
                run = tmp_path / "sweep" / f"{h}-{lr}-{s}"
                run.mkdir(parents=True)
                (run / "results.json").write_text(json.dumps(record(h, s, acc + 0.001 * s, lr, improving=h == 1)))
    main([str(tmp_path / "sweep"), "--select", "optim.lr", "--baseline", f"{HEADS}=1", "--test", "rank", "--power"])
    table = (tmp_path / "sweep" / "compare.md").read_text()
    assert "p: Mann-Whitney U test (exact without ties up to 40 runs" in table and "Verdicts: significant" in table
    one, four = (line for line in table.splitlines() if line.startswith(("| 1 |", "| 4 |")))
    assert "0.01 (edge of its grid 0.001..0.01: not bracketed)" in one and "not bracketed" not in four
    assert "3/3 improving: not converged" in one and "0/3 improving: converged" in four
    assert "seeds an arm" in four  # --power: the seeds each contrast needs


# predictions kept, and the tests over test examples
def test_predictions_round_trip_through_their_compact_field():
    rng = np.random.default_rng(1)
    for classes in (rng.integers(0, 5, 1821), rng.integers(0, 300, 77)):  # uint8, uint16
        correct = rng.random(classes.size) < 0.8
        field = predictions.encode(classes, correct)
        assert len(json.dumps(field)) < 4 * classes.size + 400  # a few KB for a few thousand examples
        back_classes, back_correct = predictions.decode(field)
        assert np.array_equal(back_classes, classes) and np.array_equal(back_correct, correct)


def test_mcnemar_is_the_exact_binomial_test_of_the_discordant_examples():
    a = np.array([1] * 40 + [0] * 12 + [1] * 3 + [0] * 45, dtype=bool)  # 40 both right, 45 both wrong
    b = np.array([1] * 40 + [1] * 12 + [0] * 3 + [0] * 45, dtype=bool)
    only_a, only_b = 3, 12
    n = only_a + only_b
    expected = min(1.0, 2 * sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2**n)
    assert inference.mcnemar_p(a, b) == pytest.approx(expected) and inference.mcnemar_p(a, a) == 1.0


def test_the_two_way_bootstrap_agrees_with_a_plain_loop_and_widens_with_seed_noise():
    rng = np.random.default_rng(2)
    hard = rng.random(600) < 0.3  # examples every run gets wrong more often
    correct = rng.random((6, 600)) < np.where(hard, 0.4, 0.9) + rng.normal(0, 0.01, (6, 1))
    low, high = inference.two_way_interval(correct)
    loop = np.random.default_rng(99)
    means = [correct[loop.integers(0, 6, 6)][:, loop.integers(0, 600, 600)].mean() for _ in range(2000)]
    assert (low, high) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])), abs=0.004)
    one = correct[:1]
    p = one.mean()
    wald = 1.96 * math.sqrt(p * (1 - p) / 600)  # one seed: the examples' binomial error alone
    assert inference.two_way_interval(one) == pytest.approx((p - wald, p + wald), abs=0.006)
    better = correct.copy()
    better[:, :120] = True  # a fifth of the examples right in every run: about 4 points more than a seed's spread
    assert inference.two_way_paired_p(better, correct) < 0.01 and inference.two_way_paired_p(correct, correct) > 0.5


def test_arms_of_one_shape_share_the_seeded_draws_and_each_gets_its_own_interval_and_difference():
    """The resample counts depend only on the seed and the sizes (drawn once for every arm, or pair, of a shape):
    each arm's interval and each pair's difference are still the bootstrap of its own runs, written out here."""

    def counts(rng, size):
        return rng.multinomial(size, np.full(size, 1 / size), 500).astype(float)

    def means(correct, seeds, examples):  # each resample's mean correctness, seeds and examples weighted as drawn
        drawn = zip(seeds, examples, strict=True)
        return np.array([(s @ correct.astype(float) * e).sum() / correct.size for s, e in drawn])

    rng = np.random.default_rng(8)
    arms = [rng.random((4, 300)) < p for p in (0.6, 0.7, 0.8)]
    for arm in [*arms, arms[0]]:
        draw = np.random.default_rng(3)
        seeds = counts(draw, 4)
        expected = np.quantile(means(arm, seeds, counts(draw, 300)), [0.025, 0.975])
        assert inference.two_way_interval(arm, resamples=500, seed=3) == pytest.approx(tuple(expected), abs=1e-12)
    for a, b in [(arms[1], arms[0]), (arms[2], arms[0]), (arms[2], arms[1])]:
        draw = np.random.default_rng(6)
        examples = counts(draw, 300)
        diffs = means(a, counts(draw, 4), examples) - means(b, counts(draw, 4), examples)
        found = inference.two_way_difference(a, b, resamples=500, seed=6)
        assert (found["low"], found["high"]) == pytest.approx(tuple(np.quantile(diffs, [0.025, 0.975])), abs=1e-12)
        assert found["se"] == pytest.approx(diffs.std(ddof=1), abs=1e-12)


def test_the_test_over_examples_has_a_difference_interval_and_power_so_a_small_test_set_reads_inconclusive():
    rng = np.random.default_rng(4)
    hard = rng.random(600) < 0.3
    correct = rng.random((6, 600)) < np.where(hard, 0.4, 0.9)
    better = correct.copy()
    better[:, :120] = True
    # the interval: the same resamples as the p-value, against a plain loop drawing the examples once for both arms
    found = inference.two_way_difference(better, correct)
    loop, diffs = np.random.default_rng(5), []
    for _ in range(2000):
        examples = loop.integers(0, 600, 600)
        diffs.append(
            better[loop.integers(0, 6, 6)][:, examples].mean() - correct[loop.integers(0, 6, 6)][:, examples].mean()
        )
    assert (found["low"], found["high"]) == pytest.approx(tuple(np.quantile(diffs, [0.025, 0.975])), abs=0.004)
    assert found["se"] == pytest.approx(np.std(diffs, ddof=1), rel=0.1)
    assert power.normal_power(0.01, 0.005) == pytest.approx(
        stats.norm.cdf(2 - 1.96) + stats.norm.cdf(-2 - 1.96), abs=1e-4
    )

    def arm(heads, rows):
        classes = np.zeros(rows.shape[1], dtype=int)
        return [{"status": "completed", "config": {HEADS: heads, "seed": s}, "metrics": {"test/acc": float(r.mean())},
                 "predictions": predictions.encode(classes, r)} for s, r in enumerate(rows)]  # fmt: skip

    runs = arm(1, correct) + arm(4, correct[::-1])  # the same runs: no difference at all
    for effect, verdict in ((0.005, "inconclusive"), (0.2, "no difference found")):
        design = Design(["test/acc"], baseline=(HEADS, "1"), test="examples", effect=effect)
        four = compare(runs, design)[1][1]["test/acc"]
        se = inference.two_way_difference(correct[::-1], correct)["se"]
        assert four["power"] == pytest.approx(power.normal_power(effect, se)) and four["verdict"] == verdict
    assert four["power"] > 0.99 and -0.2 < four["interval"][0] < 0 < four["interval"][1] < 0.2


@pytest.mark.e2e
def test_runs_and_pack_members_keep_their_test_predictions_and_compare_tests_over_examples(run_cli, tmp_path):
    sweep = tmp_path / "sweep"
    done = run_cli("-m", *PACKED, *TINY, "model.attention.n_heads=1,2", "seed=0,1", "logger=csv",
                   "callbacks.attention=null", f"hydra.sweep.dir={sweep}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    single = run_cli(*TINY, "logger=csv", "callbacks.attention=null", "hydra.run.dir=single")
    assert single.returncode == 0, single.stderr[-3000:]
    for run in [*sweep.glob("[0-9]*"), tmp_path / "single"]:
        record = json.loads((run / "results.json").read_text())
        assert predictions.correctness(record).mean() == pytest.approx(record["metrics"]["test/acc"], abs=1e-6)
        # the real training tokens by each validation: 256 sequences of 32 tokens an epoch, no padding
        assert [p["tokens"] for p in record["curve"]] == [256 * 32, 2 * 256 * 32]
        assert budget.training_flops(record) == record["flops_per_token"] * 2 * 256 * 32
    main([str(sweep), "--baseline", f"{HEADS}=1", "--test", "examples"])
    table = (sweep / "compare.md").read_text()
    assert "p: for test/acc, a bootstrap over seeds and test examples both" in table
    with pytest.raises(
        SystemExit, match="--test mcnemar compares one run per arm; with several seeds use --test examples"
    ):
        main([str(sweep), "--baseline", f"{HEADS}=1", "--test", "mcnemar"])


# budget: time to reach a threshold, and an equal budget
SIX_MP = ([6, 6, 6, 6, 7, 9, 10, 10, 11, 13, 16, 17, 19, 20, 22, 23, 25, 32, 32, 34, 35],
          [1, 1, 1, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0])  # fmt: skip
PLACEBO = [1, 1, 2, 2, 3, 4, 4, 5, 5, 8, 8, 8, 8, 11, 11, 12, 12, 15, 17, 22, 23]


def test_kaplan_meier_and_log_rank_reproduce_the_textbook_leukaemia_example():
    # Freireich et al. (1963), remission in weeks, as worked in Kleinbaum & Klein's Survival Analysis, chapter 2
    six_mp = survival.kaplan_meier(SIX_MP[0], [bool(e) for e in SIX_MP[1]])
    by_week = dict(zip(six_mp["steps"], six_mp["survival"], strict=True))
    assert [round(by_week[t], 4) for t in (6, 7, 10, 13, 16, 22, 23)] == [
        0.8571,
        0.8067,
        0.7529,
        0.6902,
        0.6275,
        0.5378,
        0.4482,
    ]
    assert six_mp["median"] == 23 and (six_mp["k"], six_mp["n"]) == (9, 21)
    placebo = survival.kaplan_meier(PLACEBO, [True] * 21)
    assert placebo["median"] == 8 and placebo["low"] <= 8 <= placebo["high"]
    p = survival.logrank_p((SIX_MP[0], [bool(e) for e in SIX_MP[1]]), (PLACEBO, [True] * 21))
    assert p == pytest.approx(stats.chi2.sf(16.79, 1), rel=2e-3)  # the textbook's log-rank chi-square, 16.79
    all_at_626 = ([626] * 10, [True] * 10)  # heads_fixed_width's h = 2 and h = 4: every seed at one validation
    assert survival.logrank_p(all_at_626, all_at_626) == 1.0  # scipy gives 0/0 = nan


def curve_run(heads, seed, reach_at, budget=500):
    """A run whose val/acc crosses 0.9 at step reach_at (None: never, within its budget)."""
    points = [{"step": s, "epoch": s // 100, "val/acc": 0.95 if reach_at and s >= reach_at else 0.5}
              for s in range(100, budget + 1, 100)]  # fmt: skip
    metrics = {"test/acc": points[-1]["val/acc"], "val/acc_best": max(p["val/acc"] for p in points)}
    config = {HEADS: heads, "seed": seed}
    return {
        "status": "completed",
        "config": config,
        "curve": points,
        "flops_per_token": 1000 * heads,
        "metrics": metrics,
    }


def test_steps_to_reach_are_censored_kaplan_meier_arms_compared_by_log_rank_and_budgets_read_from_curves(tmp_path):
    fast = [curve_run(4, s, 100 * (1 + s % 2)) for s in range(6)]  # 100 or 200 steps
    slow = [curve_run(1, s, [300, 400, 500, None, None, None][s]) for s in range(6)]  # half never within 500
    design = Design(["test/acc", "val/acc@step=200"], baseline=(HEADS, "1"), reach=("val/acc", ">=", 0.9))
    _, rows = compare(fast + slow, design)
    one, four = rows
    assert (one["reach"]["k"], one["reach"]["median"]) == (3, 500) and (
        four["reach"]["k"],
        four["reach"]["median"],
    ) == (6, 100)
    times = lambda runs: [survival.time_to_reach(r["curve"], "val/acc", True, 0.9) for r in runs]  # noqa: E731
    assert times(slow)[3] == (500, False)  # censored at the last validation
    expected = stats.logrank(
        stats.CensoredData(uncensored=[100, 200] * 3), stats.CensoredData(uncensored=[300, 400, 500], right=[500] * 3)
    ).pvalue
    assert four["reach"]["p_value"] == pytest.approx(expected)
    assert (
        four["val/acc@step=200"]["mean"] == pytest.approx(0.95) and one["val/acc@step=200"]["mean"] == 0.5
    )  # equal budget
    for i, run in enumerate(fast + slow):
        (tmp_path / "sweep" / str(i)).mkdir(parents=True)
        (tmp_path / "sweep" / str(i) / "results.json").write_text(json.dumps(run))
    main([str(tmp_path / "sweep"), "--baseline", f"{HEADS}=1", "--reach", "val/acc>=0.9", "--at", "steps=200"])
    table = (tmp_path / "sweep" / "compare.md").read_text()
    assert "steps to val/acc>=0.9 (Kaplan-Meier median [95% CI]; reached)" in table and "FLOPs/token" in table
    four_line = next(line for line in table.splitlines() if line.startswith("| 4 |"))
    assert "| 100 [100, 200] 6/6 reached p=" in four_line and "| 4,000 |" in four_line
    with pytest.raises(SystemExit, match="these runs' curves count none .* compare at steps"):
        main([str(tmp_path / "sweep"), "--at", "flops=1e12"])  # curves without token counts
    with pytest.raises(SystemExit):
        main([str(tmp_path / "sweep"), "--at", "flops=lots"])
    with pytest.raises(SystemExit, match=r"--at steps=600: no run trained that far \(the longest: 500 steps\)$"):
        main([str(tmp_path / "sweep"), "--at", "steps=600"])  # not an empty column


def test_training_flops_are_flops_a_token_times_the_tokens_counted_and_passes_and_budgets_read_at_equal_flops():
    # FLOPs a token 1,000 (h=1) and 4,000 (h=4), 100 real tokens a step, validated every 100 steps
    runs = [curve_run(h, s, 100 if h == 4 else 300) for h in (1, 4) for s in range(3)]
    for run in runs:
        for point in run["curve"]:
            point["tokens"] = 100 * point["step"]
    both = {**runs[0], "config": {**runs[0]["config"], "optim.rdrop": 0.5, "optim.sam_rho": 0.05}}
    assert budget.training_flops(runs[0]) == 1000 * 100 * 500  # FLOPs a token x the tokens at the last point
    assert budget.training_flops(both) == 1000 * 100 * 500 * 4  # R-Drop's two passes, SAM's two steps
    # at 4e7 FLOPs: h=4 has spent them at step 100 (4,000 x 100 x 100), h=1 (without R-Drop/SAM) at step 400
    assert budget.at_budget(runs[3], "val/acc", "flops", 4e7) == 0.95  # h=4, step 100: reached
    assert budget.at_budget(runs[1], "val/acc", "flops", 4e7) == 0.95  # h=1, step 400 (reached at 300)
    assert budget.at_budget(runs[1], "val/acc", "flops", 2.9e7) == 0.5  # h=1, step 200 (not yet)
    assert budget.at_budget(runs[3], "val/acc", "flops", 1e12) is None  # beyond what the run spent: no value
    # h=1 spent 5e7 in all: a budget written rounded up (by less than 1e-4) is its whole budget; 2e-4 more is not
    assert budget.at_budget(runs[1], "val/acc", "flops", 5.0004e7) == 0.95
    assert budget.at_budget(runs[1], "val/acc", "flops", 5.001e7) is None
    design = Design(["test/acc", budget.label("flops=2.5e7")], baseline=(HEADS, "1"))
    _, (one, four) = compare(runs, design)
    # at 2.5e7 FLOPs h=1 is at step 200 (0.5); h=4's first validation (step 100) had spent 4e7: no value
    assert "val/acc@flops=2.5e+07" not in four and one["val/acc@flops=2.5e+07"]["mean"] == 0.5
    assert (one["train_flops"], four["train_flops"]) == (1000 * 50_000, 4000 * 50_000)


@pytest.mark.e2e
def test_sweep_extend_adds_a_value_beyond_an_arms_edge_as_jobs_of_the_same_sweep_and_resumes_them(run_cli, tmp_path):
    command = ["-m", *PACKED, *TINY, "logger=csv", "callbacks.attention=null", "optim.lr=1e-5,1e-4",
               "seed=0,1", "sweep.extend.key=optim.lr", "sweep.extend.limit=1", "hydra.sweep.dir=sweep"]  # fmt: skip
    done = run_cli(*command)
    assert done.returncode == 0, done.stderr[-3000:]
    records = {int(p.parent.name): json.loads(p.read_text()) for p in (tmp_path / "sweep").glob("*/results.json")}
    assert sorted(records) == list(range(6))  # the grid's 4 jobs, then 2 more: the new value for each seed
    grid = [records[i] for i in range(4)]
    means = {
        lr: np.mean([r["metrics"]["val/acc_best"] for r in grid if r["config"]["optim.lr"] == lr])
        for lr in (1e-5, 1e-4)
    }
    best = max(means, key=means.get)  # an edge whichever wins: a grid of two
    beyond = 3e-4 if best == 1e-4 else float(f"{1e-5 / 3:.6g}")
    said = f"the only arm: best optim.lr={best} at the edge of [1e-05, 0.0001]; adding optim.lr={beyond}"
    assert f"sweep.extend round 1: {said}" in done.stdout
    added = [(r["config"]["optim.lr"], r["config"]["seed"], r["status"]) for i, r in sorted(records.items()) if i >= 4]
    assert added == [(beyond, 0, "completed"), (beyond, 1, "completed")]
    assert all(records[i]["pack"]["size"] == 2 for i in (4, 5))  # the extension is packed like the grid
    again = run_cli(*command, "sweep.resume=true")  # the same extension: its jobs are found done, none added
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(list((tmp_path / "sweep").glob("*/results.json"))) == 6
    assert f"sweep.extend round 1: {said}" in again.stdout  # decided on the grid's jobs alone, as the first time
    assert again.stdout.count("completed before with the same config") == 6


def test_a_jobs_number_is_its_directory_name_or_the_hydra_job_num_it_recorded(tmp_path):
    assert job_number(tmp_path / "12") == 12  # hydra.sweep.subdir=${hydra.job.num}, headlab's default
    named = tmp_path / "lr_0.01_seed_1"  # another subdir: the number the job's .hydra/hydra.yaml recorded
    (named / ".hydra").mkdir(parents=True)
    (named / ".hydra" / "hydra.yaml").write_text("hydra:\n  sweep:\n    subdir: lr_0.01_seed_1\n  job:\n    num: 7\n")
    assert job_number(named) == 7
