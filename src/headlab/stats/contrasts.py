"""How an arm is compared with its baseline: the design of a comparison (which test, paired or not, the log scale,
the effect power is computed for), each test's p-value (over seeds, folds or test examples), and the power and
seeds a contrast needs (headlab.stats.inference and .power hold the statistics)."""

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from headlab.stats import inference, power, predictions


class CompareError(ValueError):
    """An analysis that cannot be made from these runs (a key that does not vary, an ambiguous baseline)."""


_EXAMPLES = (
    "for test/acc, a bootstrap over seeds and test examples both (2,000 resamples: the same examples for both arms, "
    "each arm's seeds on their own; intervals the same way), from the runs' kept predictions; other metrics: Welch's "
    "t-test"
)
_MCNEMAR = (
    "for test/acc, McNemar's exact test over the test examples between one run per arm, from the runs' kept "
    "predictions; other metrics: Welch's t-test"
)
TESTS = {  # --test: how each arm is compared with its baseline: (independent arms, paired over shared seeds)
    "welch": ("Welch's t-test", "paired t-test over shared seeds"),
    "paired": ("paired t-test over shared seeds", "paired t-test over shared seeds"),
    "rank": (
        "Mann-Whitney U test (exact without ties up to 40 runs, else 10,000 seeded permutations)",
        "Wilcoxon signed-rank test over shared seeds (exact without ties up to 40 pairs, else seeded permutations)",
    ),
    "permutation": (
        "permutation test of the difference of means (10,000 seeded resamples, exact when fewer)",
        "paired permutation test over shared seeds (signs flipped; 10,000 seeded resamples, exact when fewer)",
    ),
    "examples": (_EXAMPLES, _EXAMPLES),
    "mcnemar": (_MCNEMAR, _MCNEMAR),
}
EXAMPLE_TESTS = ("examples", "mcnemar")  # tests over the test examples: of test/acc, from kept predictions


@dataclass
class Design:
    """How to compare: the metrics shown; the group that every other is compared with (baseline KEY, VALUE), by
    which test (TESTS; paired over seeds or not), and the keys a row must share with its baseline (within;
    default: every other varying key); what counts as solving the task (metric, threshold); a key whose best
    value per arm is chosen on a validation metric (select KEY, ON); metrics analysed on the log scale (geometric
    means, tests on logs); the effect power is computed for (None: the observed one), whether the seeds needed
    for 80% power are reported (power), a threshold on a validation curve whose time to reach is compared
    (reach), a key over whose values (datasets) each contrast is pooled by a random-effects meta-analysis
    (meta), and one across whose values settings are ranked by their gap to each value's best (across)."""

    metrics: list[str]
    baseline: tuple[str, str] | None = None
    paired: bool = False
    solved: tuple[str, float] | None = None
    select: tuple[str, str] | None = None
    within: list[str] = field(default_factory=list)  # the keys a row shares with its baseline (default: all others)
    test: str = "welch"
    log: list[str] = field(default_factory=list)
    effect: float | None = None
    power: bool = False
    reach: tuple[str, str, float] | None = None  # (curve metric, ">=" or "<=", threshold): steps to reach it
    meta: str | None = None  # a key (the dataset) over whose values each contrast is pooled (random effects)
    across: str | None = None  # a key (the dataset) across whose values settings are ranked by their gap to the best

    @property
    def dataset(self) -> str | None:
        """The key whose values are datasets (--across or --meta), or None."""
        return self.across or self.meta

    @property
    def over_shared_seeds(self) -> bool:
        """Whether contrasts pair runs by seed (--paired, or --test paired)."""
        return self.paired or self.test == "paired"

    @property
    def test_name(self) -> str:
        return TESTS[self.test][self.over_shared_seeds]

    @property
    def solve_test_name(self) -> str:
        if self.over_shared_seeds:
            return (
                "for solve rates, the conditional logistic model with seeds as strata (McNemar's exact test of the "
                "seeds one arm solved and the other did not; OR: its conditional odds ratio)"
            )
        return "Fisher's exact test for solve rates"


def example_summary(runs: list[dict], test: str) -> dict:
    """The arm's test correctness per run and example ("examples", (runs, N) bool, from the kept predictions), the
    digest of the test split they are of, and (for --test examples) the two-way bootstrap interval."""
    kept = [predictions.correctness(r) for r in runs]
    if missing := [r.get("where", "a run") for r, k in zip(runs, kept, strict=True) if k is None]:
        raise CompareError(
            f"--test {test} needs the runs' test predictions; {len(missing)} run(s) kept none ({missing[0]}: made "
            "before headlab kept them, or tested by several DDP ranks)"
        )
    if len({k.size for k in kept}) > 1:
        raise CompareError(f"--test {test}: the runs of one arm were tested on different numbers of examples")
    digests = {str(((r.get("data") or {}).get("digests") or {}).get("splits", {}).get("test")) for r in runs}
    summary = {"examples": np.stack(kept), "test_digests": digests}
    if test == "examples":
        summary["low"], summary["high"] = inference.two_way_interval(summary["examples"])
    return summary


def contrast_p(a: dict, b: dict, design: Design) -> float:
    """The p-value of an arm against its baseline by the design's test (cross-validated runs: the corrected
    resampled t-test over shared folds, whatever the test)."""
    if "folds" in a and "folds" in b:
        return inference.cv_paired_p(a["folds"], b["folds"], a["k"])
    if "examples" in a and "examples" in b:
        return example_p(a, b, design.test)
    by_seed, paired = [_by_seed(a), _by_seed(b)], design.over_shared_seeds
    if design.test in ("welch", "paired"):
        return inference.paired_p(*by_seed) if paired else inference.welch_p(a["values"], b["values"])
    if design.test == "rank":
        return inference.signed_rank_p(*by_seed) if paired else inference.rank_p(a["values"], b["values"])
    return (
        inference.permutation_p(*by_seed, paired=True) if paired else inference.permutation_p(a["values"], b["values"])
    )


def _fold_differences(a: dict, b: dict) -> list[float]:
    """Each shared fold's difference a - b (each fold's value averaged over its seeds), in fold order."""
    return [a["folds"][f] - b["folds"][f] for f in sorted(set(a["folds"]) & set(b["folds"]))]


def contrast_effect(a: dict, b: dict, design: Design) -> tuple[float, float, float]:
    """An arm's difference to its baseline, its standard error and the degrees of freedom of its t interval, on the
    scale its test uses (logs with --log), as a meta-analysis weighs it: over shared folds, the corrected
    resampled one (folds - 1 df); paired over shared seeds, the differences' sd / sqrt(pairs) (pairs - 1 df); else
    Welch's sqrt(sd_a^2 / n_a + sd_b^2 / n_b) on Welch-Satterthwaite's df."""
    if "folds" in a and "folds" in b:
        d = _fold_differences(a, b)
        if not d:
            return math.nan, math.nan, math.nan  # no fold in common
        return _mean(d), math.sqrt(inference.cv_variance_factor(len(d), a["k"]) * _sd(d) ** 2), len(d) - 1
    if design.over_shared_seeds:
        by_a, by_b = _by_seed(a), _by_seed(b)
        d = [by_a[s] - by_b[s] for s in sorted(set(by_a) & set(by_b))]
        return (_mean(d), _sd(d) / math.sqrt(len(d)), len(d) - 1) if d else (math.nan,) * 3  # no seed in common
    return welch(
        _mean(a["values"]), _sd(a["values"]), len(a["values"]), _mean(b["values"]), _sd(b["values"]), len(b["values"])
    )


def welch(mean_a: float, sd_a: float, n_a: int, mean_b: float, sd_b: float, n_b: int) -> tuple[float, float, float]:
    """Welch's difference of two means from their summaries: (difference, its standard error, the
    Welch-Satterthwaite degrees of freedom)."""
    va, vb = sd_a**2 / n_a, sd_b**2 / n_b
    df = (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1)) if va + vb > 0 else math.nan
    return mean_a - mean_b, math.sqrt(va + vb), df


def t_interval(effect: float, se: float, df: float) -> tuple[float, float]:
    """The 95% t interval of a difference from contrast_effect's (effect, se, df); (nan, nan) without one."""
    half = stats.t.ppf(0.975, df) * se if df > 0 and se > 0 else math.nan
    return effect - half, effect + half


def within_margin(summary: dict, effect: float | None) -> bool | None:
    """Whether the 95% interval of an arm's difference (contrast_effect's t interval; over seeds and examples, the
    bootstrap's) lies within +-effect, the smallest difference that matters (design.effect): the equivalence
    reading behind "no difference found". None without a margin or without an interval (solve rates, McNemar)."""
    if effect is None or "se" not in summary:
        return None
    low, high = difference_interval(summary)
    return -effect < low and high < effect  # nan compares False: no interval, no equivalence


def difference_interval(summary: dict) -> tuple[float, float]:
    """The 95% interval of an arm's difference to its baseline, on its test's scale: contrast_effect's t interval,
    over seeds and test examples the bootstrap's; (nan, nan) for a baseline or without one."""
    if "se" not in summary:
        return math.nan, math.nan
    return summary.get("interval") or t_interval(summary["effect"], summary["se"], summary["df"])


def example_p(a: dict, b: dict, test: str) -> float:
    """A contrast over the test examples both arms were tested on (the same test split, by its digest)."""
    if a["test_digests"] != b["test_digests"] or a["examples"].shape[1] != b["examples"].shape[1]:
        raise CompareError(
            f"--test {test} pairs arms over their test examples: these arms were tested on different ones"
        )
    if test == "mcnemar":
        if len(a["examples"]) != 1 or len(b["examples"]) != 1:
            raise CompareError("--test mcnemar compares one run per arm; with several seeds use --test examples")
        return inference.mcnemar_p(a["examples"][0], b["examples"][0])
    return inference.two_way_paired_p(a["examples"], b["examples"])


def contrast_power(a: dict, b: dict, design: Design) -> dict:
    """What the contrast could detect, on the scale its test used (t-test approximation): with a margin
    (design.effect), the power it had there ("power", "power_effect"); without one, the smallest difference it had
    80% power to detect ("detectable"); over seeds, the seeds per arm that give 80% power at the margin, else at
    the observed difference ("seeds_for_power": a plan for a new sweep). Over folds, the corrected test's (more
    seeds do not shrink its fold term); over seeds and test examples (--test examples), the normal approximation at
    the two-way bootstrap's standard error, with the difference's bootstrap interval ("interval"); {} for
    McNemar's."""
    found = {}
    if "examples" in a:  # over seeds and examples: at the bootstrap's standard error, with its interval
        if design.test != "examples" or "examples" not in b:
            return {}
        difference = inference.two_way_difference(a["examples"], b["examples"])
        se = difference["se"]
        at = lambda delta: power.normal_power(delta, se)  # noqa: E731
        found["interval"] = (difference["low"], difference["high"])
    elif "folds" in a and "folds" in b:
        d = _fold_differences(a, b)
        sd = _sd(d)
        se = math.sqrt(inference.cv_variance_factor(len(d), a["k"])) * sd if d else math.nan
        at = lambda delta: power.cv_paired_power(delta, sd, len(d), a["k"])  # noqa: E731
    elif "folds" in a or "folds" in b:
        return {}
    else:
        effect = design.effect if design.effect is not None else abs(_mean(a["values"]) - _mean(b["values"]))
        if design.over_shared_seeds:
            by_a, by_b = _by_seed(a), _by_seed(b)
            d = [by_a[s] - by_b[s] for s in sorted(set(by_a) & set(by_b))]
            sd, n = _sd(d), len(d)
            se = sd / math.sqrt(n) if n else math.nan
            at = lambda delta: power.paired_power(delta, sd, n)  # noqa: E731
            plan = lambda seeds: power.paired_power(effect, sd, seeds)  # noqa: E731 (power with n seeds an arm)
        else:
            sd_a, sd_b, n_a, n_b = _sd(a["values"]), _sd(b["values"]), len(a["values"]), len(b["values"])
            se = math.sqrt(sd_a**2 / n_a + sd_b**2 / n_b)  # nan with fewer than 2 values an arm (_sd)
            at = lambda delta: power.t_power(delta, sd_a, sd_b, n_a, n_b)  # noqa: E731
            plan = lambda seeds: power.t_power(effect, sd_a, sd_b, seeds, seeds)  # noqa: E731
        found["seeds_for_power"] = power.seeds_needed(plan) if effect else None
    if design.effect is not None:
        found.update(power=at(design.effect), power_effect=design.effect)
    else:
        found["detectable"] = power.smallest_detectable(at, se)
    return found


def solve_rate_contrast(a: dict, b: dict, design: Design) -> dict:
    """An arm's solve rate against its baseline's (inference.solve_rate's dicts, with "by_seed"): Fisher's exact
    test of independent arms; paired over shared seeds, the conditional logistic model with seeds as strata
    (inference.paired_solve: McNemar's exact test of the seeds one arm solved and the other did not). With
    design.power: the test's power at the observed rates with the seeds there are, and the seeds per arm that give
    it 80% (up to 500)."""
    if not design.over_shared_seeds:
        at = lambda n: power.fisher_power(a["rate"], b["rate"], n)  # noqa: E731
        found, seeds = {"p_value": inference.fisher_p(a, b)}, min(a["n"], b["n"])
    else:
        found = inference.paired_solve(a["by_seed"], b["by_seed"])
        seeds = found["pairs"]
        only_a, only_b = (found[k] / seeds if seeds else math.nan for k in ("only_a", "only_b"))
        at = lambda n: power.mcnemar_power(only_a, only_b, n)  # noqa: E731
    if design.power:
        found.update(power=at(seeds), seeds_for_power=power.seeds_needed(at, limit=500))
    return found


def _by_seed(summary: dict) -> dict:
    """{seed: value} of a metric's summary over seeds."""
    return dict(zip(summary["seeds"], summary["values"], strict=True))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _sd(values: list[float]) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else math.nan
