"""A contrast pooled over datasets: the random-effects meta-analysis against a textbook example and an independent
implementation, and headlab-compare --meta over datasets compared by Welch's, paired and cross-validated tests."""

import csv
import json
import math

import numpy as np
import pytest
from scipy import stats

from headlab.cli.compare import main
from headlab.stats import inference, meta

HEADS = "model.attention.n_heads"

# Colditz et al. (1994): BCG vaccine trials, (vaccinated TB, vaccinated without, control TB, control without), the
# worked example of Viechtbauer (2010, J. Stat. Softw. 36(3)) and of metafor's dat.bcg
BCG = [(4, 119, 11, 128), (6, 300, 29, 274), (3, 228, 11, 209), (62, 13536, 248, 12619), (33, 5036, 47, 5761),
       (180, 1361, 372, 1079), (8, 2537, 10, 619), (505, 87886, 499, 87892), (29, 7470, 45, 7232),
       (17, 1699, 65, 1600), (186, 50448, 141, 27197), (5, 2493, 3, 2338), (27, 16886, 29, 17825)]  # fmt: skip


def log_risk_ratios():
    a, b, c, d = np.array(BCG, float).T
    return np.log(a / (a + b) / (c / (c + d))), np.sqrt(1 / a - 1 / (a + b) + 1 / c - 1 / (c + d))


def test_random_effects_reproduce_the_bcg_textbook_example_and_an_independent_implementation():
    from statsmodels.stats.meta_analysis import combine_effects

    y, se = log_risk_ratios()
    pooled = meta.random_effects(list(y), list(se))
    # metafor, rma(measure="RR", method="DL"): Q(df = 12) = 152.2330, tau^2 = 0.3088, I^2 = 92.12%, mu = -0.7141
    assert round(pooled["q"], 4) == 152.2330 and round(pooled["tau2"], 4) == 0.3088
    assert round(100 * pooled["i2"], 2) == 92.12 and round(pooled["effect"], 4) == -0.7141
    assert pooled["q_p"] == pytest.approx(stats.chi2.sf(152.2330, 12), rel=1e-4)
    hksj = combine_effects(y, se**2, method_re="dl", use_t=True).summary_frame().loc["random effect wls"]
    assert (pooled["effect"], pooled["se"]) == pytest.approx((hksj["eff"], hksj["sd_eff"]), rel=1e-9)
    assert (pooled["low"], pooled["high"]) == pytest.approx((hksj["ci_low"], hksj["ci_upp"]), rel=1e-9)
    assert pooled["p_value"] == pytest.approx(2 * stats.t.sf(abs(hksj["eff"] / hksj["sd_eff"]), 12), rel=1e-9)
    # the prediction interval for a new trial (Higgins et al. 2009): t on k - 2 df, tau^2 + se^2
    spread = stats.t.ppf(0.975, 11) * math.sqrt(pooled["tau2"] + pooled["se"] ** 2)
    assert (pooled["pred_low"], pooled["pred_high"]) == pytest.approx((-0.7141 - spread, -0.7141 + spread), abs=1e-4)


def test_homogeneous_datasets_have_no_between_variance_and_too_few_datasets_pool_nothing():
    from statsmodels.stats.meta_analysis import combine_effects

    effects, errors = [0.010, 0.012, 0.011], [0.004, 0.005, 0.006]
    pooled = meta.random_effects(effects, errors)
    assert pooled["tau2"] == 0 and pooled["i2"] == 0  # Q below its degrees of freedom: tau^2 truncated at 0
    # with no between-dataset variance the random-effects mean is the fixed-effect one (statsmodels leaves its DL
    # tau^2 negative here, so its random-effects row is not the textbook estimator's)
    fixed = combine_effects(np.array(effects), np.array(errors) ** 2, method_re="dl").summary_frame()
    assert pooled["effect"] == pytest.approx(fixed.loc["fixed effect", "eff"], rel=1e-12)
    one = meta.random_effects([0.01], [0.004])
    assert one["k"] == 1 and math.isnan(one["effect"]) and math.isnan(one["p_value"])
    two = meta.random_effects([0.01, 0.02], [0.004, 0.004])
    assert not math.isnan(two["effect"]) and math.isnan(two["pred_low"])  # a prediction needs 3


def write(root, i, config, acc):
    run = root / str(i)
    run.mkdir(parents=True)
    metrics = {"test/acc": acc, "val/acc_best": acc}
    (run / "results.json").write_text(json.dumps({"status": "completed", "config": config, "metrics": metrics}))


def datasets(root, rng):
    """Three datasets, h = 1 and 4, 6 seeds each: h = 4 better by 0.02, 0.03 and 0.01; one of them (cr)
    cross-validated over 3 of 5 folds with 2 seeds a fold."""
    i = 0
    for name, gain in (("mr", 0.02), ("subj", 0.03)):
        for h in (1, 4):
            for seed in range(6):
                write(root, i, {"data": name, HEADS: h, "seed": seed}, 0.8 + gain * (h == 4) + rng.normal(0, 0.01))
                i += 1
    for h in (1, 4):
        for fold in range(3):
            for seed in range(2):
                config = {"data": "cr", HEADS: h, "seed": seed, "data.cv.fold": fold, "data.cv.folds": 5}
                write(root, i, config, 0.75 + 0.01 * (h == 4) + 0.02 * fold + rng.normal(0, 0.01))
                i += 1


def runs_of(root, name, h):
    out = []
    for path in sorted(root.glob("*/results.json")):
        record = json.loads(path.read_text())
        if record["config"]["data"] == name and record["config"][HEADS] == h:
            out.append(record)
    return out


def test_meta_pools_each_datasets_contrast_weighted_by_the_standard_error_its_design_gives(tmp_path, capsys):
    root = tmp_path / "sweeps"
    datasets(root, np.random.default_rng(0))
    main([str(root), "--baseline", f"{HEADS}=1", "--metric", "test/acc", "--meta", "data", "--effect", "0.005"])
    expected = {}
    for name in ("mr", "subj"):  # Welch: difference of means, sqrt(s_a^2 / n_a + s_b^2 / n_b)
        a, b = ([r["metrics"]["test/acc"] for r in runs_of(root, name, h)] for h in (4, 1))
        se = math.sqrt(np.var(a, ddof=1) / len(a) + np.var(b, ddof=1) / len(b))
        expected[name] = (np.mean(a) - np.mean(b), se)
    fold_means = {
        h: [np.mean([r["metrics"]["test/acc"] for r in runs_of(root, "cr", h) if r["config"]["data.cv.fold"] == f])
            for f in range(3)]
        for h in (1, 4)
    }  # fmt: skip
    d = np.subtract(fold_means[4], fold_means[1])  # corrected over folds: (1/3 + 1/(5-1)) var(d)
    expected["cr"] = (d.mean(), math.sqrt((1 / 3 + 1 / 4) * d.var(ddof=1)))
    row = next(csv.DictReader((root / "compare_meta.csv").open()))
    assert row[HEADS] == "4" and row["metric"] == "test/acc" and row["k"] == "3"
    names = ["cr", "mr", "subj"]
    pooled = meta.random_effects([expected[n][0] for n in names], [expected[n][1] for n in names])
    for field in ("effect", "low", "high", "p_value", "tau2", "i2"):
        assert float(row[field]) == pytest.approx(pooled[field], rel=1e-9, abs=1e-12), field
    each = dict(part.split("=") for part in row["datasets"].split(";"))
    assert set(each) == set(expected)
    for name, value in each.items():
        assert tuple(map(float, value.split(":"))) == pytest.approx(expected[name], rel=1e-9), name
    assert row["verdict"] == ("significant" if pooled["p_value"] < 0.05 else "inconclusive")
    per_dataset = [r for r in csv.DictReader((root / "compare.csv").open()) if r[HEADS] == "4"]
    assert len(per_dataset) == 3 and all(r["test/acc_p_holm"] == r["test/acc_p_value"] for r in per_dataset)
    table = (root / "compare.md").read_text()
    assert (
        "Pooled over the values of data (a random-effects meta-analysis" in table
        and "Holm-adjusted over the comparisons of each column and value of data." in table  # each read alone
        and "Hartung-Knapp-Sidik-Jonkman" in table
    )
    assert (
        "| model.attention.n_heads=4 | test/acc | 3 |" in table
        and "| model.attention.n_heads=4 |" in capsys.readouterr().out
    )


def test_across_gives_a_cross_validated_gap_the_corrected_interval_over_folds(tmp_path):
    root = tmp_path / "sweeps"
    datasets(root, np.random.default_rng(0))
    main([str(root), "--across", "data", "--metric", "val/acc_best", "--no-plots"])
    rows = {(r["data"], r[HEADS]): r for r in csv.DictReader((root / "compare_across.csv").open())}
    assert rows["cr", "4"]["gap"] == "0.0"  # h = 4 is cr's best (by 0.01)

    def fold_means(h):
        return [np.mean([r["metrics"]["val/acc_best"] for r in runs_of(root, "cr", h) if r["config"]["data.cv.fold"]
                         == f]) for f in range(3)]  # fmt: skip

    d = np.array(fold_means(4)) - np.array(fold_means(1))  # best - setting, per fold
    half = stats.t.ppf(0.975, 2) * math.sqrt((1 / 3 + 1 / (5 - 1)) * d.var(ddof=1))  # Nadeau & Bengio, k = 5
    gap = rows["cr", "1"]
    assert float(gap["gap"]) == pytest.approx(d.mean())
    assert (float(gap["gap_low"]), float(gap["gap_high"])) == pytest.approx((d.mean() - half, d.mean() + half))


def test_meta_pairs_over_seeds_with_paired_and_refuses_what_it_cannot_pool(tmp_path, capsys):
    root = tmp_path / "sweeps"
    datasets(root, np.random.default_rng(1))
    main([str(root), "--baseline", f"{HEADS}=1", "--metric", "test/acc", "--meta", "data", "--paired"])
    row = next(csv.DictReader((root / "compare_meta.csv").open()))
    by_seed = {h: {r["seed"]: r["metrics"]["test/acc"] for r in map(lambda r: {**r, "seed": r["config"]["seed"]},
               runs_of(root, "mr", h))} for h in (1, 4)}  # fmt: skip
    d = [by_seed[4][s] - by_seed[1][s] for s in range(6)]
    mr = dict(part.split("=") for part in row["datasets"].split(";"))["mr"]
    assert tuple(map(float, mr.split(":"))) == pytest.approx((np.mean(d), np.std(d, ddof=1) / math.sqrt(6)))
    assert inference.holm([float(row["p_value"])]) == [pytest.approx(float(row["p_holm"]))]  # one arm: Holm is p
    from headlab.stats.comparison import compare
    from headlab.stats.contrasts import Design

    apart = [{"config": {HEADS: h, "seed": s}, "metrics": {"test/acc": 0.8}} for h, s in ((1, 0), (1, 1), (4, 2))]
    four = compare(apart, Design(["test/acc"], baseline=(HEADS, "1"), paired=True))[1][1]["test/acc"]
    assert math.isnan(four["effect"]) and math.isnan(four["se"]) and math.isnan(four["p_value"])  # no seed shared
    with pytest.raises(SystemExit, match="--meta key 'seed' does not vary; varying"):
        main([str(root), "--baseline", f"{HEADS}=1", "--meta", "seed"])
    for run in runs_of(root, "mr", 4) + runs_of(root, "mr", 1):  # one dataset alone: read it without --meta
        write(tmp_path / "mr", len(list((tmp_path / "mr").glob("*"))), run["config"], run["metrics"]["test/acc"])
    with pytest.raises(SystemExit, match="'data' does not vary \\(every run has 'mr': read one dataset without --meta"):
        main([str(tmp_path / "mr"), "--baseline", f"{HEADS}=1", "--meta", "data"])
    with pytest.raises(SystemExit):
        main([str(root), "--meta", "data"])
    assert "--meta needs --baseline" in capsys.readouterr().err


EPOCHS = "trainer.max_epochs"


def test_across_ranks_settings_by_their_gap_to_each_datasets_best_and_chooses_on_validation(tmp_path, capsys):
    # validation accuracy of 5 and 10 epochs on three datasets; 20 epochs run on two only
    means = {("mr", 5): 0.70, ("mr", 10): 0.74, ("subj", 5): 0.89, ("subj", 10): 0.92, ("sst2", 5): 0.82,
             ("sst2", 10): 0.81, ("mr", 20): 0.75, ("subj", 20): 0.93}  # fmt: skip
    rng, root, i = np.random.default_rng(2), tmp_path / "search", 0
    for (name, epochs), mean in means.items():
        for seed in range(4):
            run = root / str(i)
            run.mkdir(parents=True)
            acc = mean + rng.normal(0, 0.005)
            test = acc + (0.02 if (name, epochs) == ("subj", 10) else -0.01)  # subj: best on test, not on val
            metrics = {"val/acc_best": acc, "test/acc": test, "test/loss": 1 - acc}
            config = {"data": name, EPOCHS: epochs, "seed": seed}
            (run / "results.json").write_text(json.dumps({"status": "completed", "config": config, "metrics": metrics}))
            i += 1
    main([str(root), "--across", "data", "--metric", "val/acc_best", "--metric", "test/acc", "--metric", "test/loss"])
    observed = {}
    for path in root.glob("*/results.json"):
        record = json.loads(path.read_text())
        key = (record["config"]["data"], record["config"][EPOCHS])
        observed.setdefault(key, []).append(record["metrics"]["val/acc_best"])
    mean = {k: np.mean(v) for k, v in observed.items()}
    best = {d: max(m for (n, _), m in mean.items() if n == d) for d in ("mr", "subj", "sst2")}
    gaps = {e: [best[d] - mean[(d, e)] for d in ("mr", "sst2", "subj")] for e in (5, 10)}
    rows = list(csv.DictReader((root / "compare_across.csv").open()))
    worst = {int(r[EPOCHS]): float(r["worst"]) for r in rows if r["metric"] == "val/acc_best"}
    assert worst[5] == pytest.approx(max(gaps[5])) and worst[10] == pytest.approx(max(gaps[10]))
    assert math.isnan(worst[20])  # not run on sst2: never chosen
    assert {int(r[EPOCHS]) for r in rows if r["chosen"] == "True"} == {10}  # the smallest worst gap (about 0.01)
    loss = {(r["data"], int(r[EPOCHS])): float(r["gap"]) for r in rows if r["metric"] == "test/loss"}
    assert loss[("sst2", 5)] == 0 and loss[("sst2", 10)] > 0 and loss[("mr", 5)] > 0  # lower loss is better
    # on test, gaps are to the setting chosen on validation (subj: 20 epochs), never to the best on test
    on_test = {
        (r["data"], int(r[EPOCHS])): (float(r["mean"]), float(r["gap"])) for r in rows if r["metric"] == "test/acc"
    }
    assert on_test["subj", 20][1] == 0 and on_test["subj", 10][0] > on_test["subj", 20][0]
    assert on_test["subj", 10][1] == pytest.approx(on_test["subj", 20][0] - on_test["subj", 10][0])
    assert on_test["subj", 10][1] < 0  # it beats the chosen setting on test
    # the gap's interval: Welch's 95% interval of (the dataset's best) - (the setting), by scipy
    mr5 = next(r for r in rows if r["metric"] == "val/acc_best" and (r["data"], r[EPOCHS]) == ("mr", "5"))
    expected = stats.ttest_ind(observed["mr", 20], observed["mr", 5], equal_var=False).confidence_interval(0.95)
    assert (float(mr5["gap_low"]), float(mr5["gap_high"])) == pytest.approx(tuple(expected))
    assert float(mr5["gap_low"]) < float(mr5["gap"]) < float(mr5["gap_high"])
    best_mr = next(r for r in rows if r["metric"] == "val/acc_best" and (r["data"], r[EPOCHS]) == ("mr", "20"))
    assert best_mr["gap"] == "0.0" and best_mr["gap_low"] == "nan"  # the best itself: no interval
    rank = next(float(r["rank"]) for r in rows if r["metric"] == "val/acc_best" and r[EPOCHS] == "10")
    assert rank == 2  # second everywhere: behind 20 epochs on mr and subj, behind 5 on sst2
    table = (root / "compare.md").read_text()
    assert "| trainer.max_epochs=10 **(chosen)** |" in table and "not run" in table
    # subj's 10 epochs beat its best on validation (20) on test beyond doubt: said once, under test/acc only
    beat = on_test["subj", 20][0] - on_test["subj", 10][0]
    ten = next(r for r in rows if r["metric"] == "test/acc" and (r["data"], r[EPOCHS]) == ("subj", "10"))
    said = [line for line in table.splitlines() if "beats the setting best on val/acc_best" in line]
    assert said == [
        f"- subj: trainer.max_epochs=10 beats the setting best on val/acc_best by {-beat:.4f} "
        f"[{-float(ten['gap_high']):.4f}, {-float(ten['gap_low']):.4f}]: on subj the gaps measure against a setting "
        "that is not the best on test/acc."
    ]
    assert table.index(said[0]) > table.index("| setting (test/acc)") and "val/acc_best and test/acc disagree" in table
    assert "val/acc_best and test/loss disagree" not in table  # the loss follows validation here
    assert "Settings across the values of data (k = 3)" in capsys.readouterr().out
    assert "target" not in table

    # a target: within 0.015 of each dataset's best (met: the gap's interval ends at most 0.015 above 0)
    main([str(root), "--across", "data", "--metric", "val/acc_best", "--effect", "0.015", "--no-plots"])
    rows = list(csv.DictReader((root / "compare_across.csv").open()))
    for r in rows:
        gap, high, best = float(r["gap"]), float(r["gap_high"]), r["gap_low"] == "nan" and float(r["gap"]) == 0
        assert r["target"] == ("missed" if gap > 0.015 else "met" if best or high <= 0.015 else "inconclusive")
    assert {r["target"] for r in rows} == {"met", "missed", "inconclusive"}
    five = {r["data"]: r["target"] for r in rows if r[EPOCHS] == "5"}
    assert five == {"mr": "missed", "subj": "missed", "sst2": "met"}  # 0.05 and 0.04 below; sst2's best
    assert "| trainer.max_epochs=5 | " in (table := (root / "compare.md").read_text())
    assert "target (gap ≤ 0.015)" in table and "met on 1 of 3; missed: mr, subj" in table
    main(
        [
            str(root),
            "--across",
            "data",
            "--metric",
            "val/acc_best",
            "--metric",
            "test/acc",
            "--effect",
            "0.015",
            "--no-plots",
        ]
    )
    assert "on test/acc, and a target met there is met against it." in (root / "compare.md").read_text()


def test_two_nearly_agreeing_datasets_cannot_pool_into_an_interval_narrower_than_either_allows():
    """QK-norm on CR and MPQA: +0.0056 (se 0.0108) and +0.0060 (se 0.0059). Hartung-Knapp's scale from two nearly
    equal estimates is ~0: untruncated, the interval would be tens of times narrower than either dataset's own. The
    variance is never below DerSimonian-Laird's (here tau² = 0: the fixed-effect variance), written out."""
    effects, errors = [0.0056, 0.0060], [0.0108, 0.0059]
    pooled = meta.random_effects(effects, errors)
    w = [1 / e**2 for e in errors]
    mean = sum(wi * y for wi, y in zip(w, effects, strict=True)) / sum(w)
    scale = sum(wi * (y - mean) ** 2 for wi, y in zip(w, effects, strict=True)) / (2 - 1)
    assert scale < 0.01  # what the untruncated Hartung-Knapp variance would have been scaled by
    se = math.sqrt(1 / sum(w))  # truncated: DerSimonian-Laird's
    half = stats.t.ppf(0.975, 1) * se
    assert pooled["tau2"] == 0 and pooled["se"] == pytest.approx(se, rel=1e-12)
    assert (pooled["low"], pooled["high"]) == pytest.approx((mean - half, mean + half), rel=1e-9)
    assert pooled["low"] < -0.05 and pooled["high"] > 0.05  # [-0.060, +0.071]: no match can be read from it


@pytest.mark.parametrize(
    "k, verdicts, low_high, se, said",
    [
        (2, {"cr": "inconclusive", "mpqa": "inconclusive"}, (-0.004, 0.008), 0.0005, "inconclusive"),
        (2, {"cr": "no difference found", "mpqa": "no difference found"}, (-0.004, 0.008), 0.0005,
         "no difference found"),
        (3, {"a": "inconclusive", "b": "inconclusive", "c": "inconclusive"}, (-0.004, 0.008), 0.0005,
         "no difference found"),
        (3, {"a": "inconclusive", "b": "inconclusive", "c": "inconclusive"}, (-0.004, 0.008), 0.02, "inconclusive"),
        (3, {}, (-0.004, 0.012), 0.0005, "inconclusive"),
    ],
)  # fmt: skip
def test_a_pooled_match_needs_three_datasets_or_each_alone_and_the_power_every_match_needs(
    k, verdicts, low_high, se, said
):
    """Within the margin (0.01) is not enough: with two datasets each must find no difference alone; and the pooled
    test's power at the margin must be 0.5 or more (se 0.02 on 2 df: far below), as for every contrast."""
    from headlab.compare.over_datasets import meta_verdict

    result = {"p_holm": 0.6, "low": low_high[0], "high": low_high[1], "se": se, "k": k, "verdicts": verdicts}
    assert meta_verdict(result, 0.01) == said
    assert meta_verdict(result, None) == "not significant"


def test_leave_one_dataset_out_chooses_on_the_others_and_reads_the_choice_on_the_one_held_out(tmp_path):
    """Each dataset held out of the choice: the setting with the smallest worst validation gap over the other
    datasets (worked out here by hand), its test accuracy on the held-out one, beside the choice made with every
    dataset and the held-out dataset's own best."""
    val = {("a", 1): 0.80, ("a", 2): 0.78, ("a", 3): 0.70,  # a prefers 1; b and c prefer 2
           ("b", 1): 0.60, ("b", 2): 0.66, ("b", 3): 0.65,
           ("c", 1): 0.50, ("c", 2): 0.55, ("c", 3): 0.54}  # fmt: skip
    root, i = tmp_path / "search", 0
    for (name, setting), mean in val.items():
        for seed, wiggle in enumerate((-0.001, 0.001)):
            run = root / str(i)
            run.mkdir(parents=True)
            metrics = {"val/acc_best": mean + wiggle, "test/acc": mean - 0.05 + wiggle}
            config = {"data": name, EPOCHS: setting, "seed": seed}
            (run / "results.json").write_text(json.dumps({"status": "completed", "config": config, "metrics": metrics}))
            i += 1
    main([str(root), "--across", "data", "--metric", "val/acc_best", "--metric", "test/acc", "--no-plots"])
    best = {d: max(m for (n, _), m in val.items() if n == d) for d in "abc"}
    gap = {(d, s): best[d] - val[(d, s)] for (d, s) in val}

    def choose(datasets):
        return min((1, 2, 3), key=lambda s: max(gap[(d, s)] for d in datasets))

    rows = {(r["held_out"], r["metric"]): r for r in csv.DictReader((root / "compare_loo.csv").open())}
    assert choose("abc") == 2
    for d in "abc":
        chosen = choose([o for o in "abc" if o != d])
        row = rows[(d, "test/acc")]
        assert int(row[EPOCHS]) == chosen
        assert float(row["mean"]) == pytest.approx(val[(d, chosen)] - 0.05)
        assert float(row["in_sample"]) == pytest.approx(val[(d, 2)] - 0.05)
        assert float(row["best"]) == pytest.approx(best[d] - 0.05)
    assert int(rows[("b", "test/acc")][EPOCHS]) == 2 and int(rows[("a", "test/acc")][EPOCHS]) == 2
    assert "Leave one data value out" in (root / "compare.md").read_text()
