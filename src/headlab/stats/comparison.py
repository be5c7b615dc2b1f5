"""A sweep as groups of runs and their statistics: the configuration keys that vary, runs grouped by them (seeds
pooled), each metric summarised over seeds (or folds), a value chosen per arm on validation, and each group compared
with a baseline group (headlab.stats.contrasts). What headlab-compare prints is rendered from what this computes.
"""

import itertools
import json
import math

from headlab.conventions import ANALYSIS_KEYS, PATH_SUFFIXES, is_launch_key
from headlab.record import TEST_ACC, TEST_LOSS, VAL_ACC_BEST
from headlab.stats import budget, inference, power, survival
from headlab.stats.contrasts import (
    EXAMPLE_TESTS,
    CompareError,
    Design,
    contrast_effect,
    contrast_p,
    contrast_power,
    example_summary,
    solve_rate_contrast,
    within_margin,
)

# keys that differ between runs without defining the experiment: where files go, the seed itself, and the
# cross-validation fold (folds x seeds are the replicates of an arm)
FOLD = "data.cv.fold"
LOGGING_CADENCE = ("callbacks.attention.every_n_val_epochs", "callbacks.attention.figures_every_n_val_epochs")
IGNORED_KEYS = ("seed", "data.seed", "callbacks.attention.seed", FOLD, *LOGGING_CADENCE)  # not arms
METRICS = (TEST_ACC, VAL_ACC_BEST, "val/acc", TEST_LOSS, "val/loss")
IMPROVING_MARGIN = 0.005  # val/acc gained at the last validation (10 of 2,000 examples) that counts as improving


def improving_at_end(curve: list[dict], margin: float = IMPROVING_MARGIN) -> bool:
    """Whether the last validation beat every earlier one by more than margin: training stopped while the run
    was still getting better."""
    return len(curve) > 1 and curve[-1]["val/acc"] > max(p["val/acc"] for p in curve[:-1]) + margin


def hashable(value):
    """A config value usable as a group's key (lists and dicts as JSON)."""
    return json.dumps(value, sort_keys=True) if isinstance(value, list | dict) else value


def same_value(value, text: str) -> bool:
    """Whether a config value is the one a command line names: null (or None) for None, numbers by value (3e-3 is
    0.003), anything else by its text."""
    if value is None or text in ("null", "None"):
        return value is None and text in ("null", "None")
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return float(text) == value
        except ValueError:
            return False
    return str(value) == text or (isinstance(value, bool) and text == str(value).lower())


def varying_keys(records: list[dict]) -> list[str]:
    """Config keys whose value differs between runs, leaving out the seed and output locations."""
    keys = sorted({k for r in records for k in r["config"]})
    varying = []
    for key in keys:
        if (
            key in IGNORED_KEYS
            or is_launch_key(key)
            or key.split(".")[0] in ANALYSIS_KEYS
            or key.endswith(PATH_SUFFIXES)
        ):
            continue
        if len({hashable(r["config"].get(key)) for r in records}) > 1:
            varying.append(key)
    return varying


def summarise(values: list[float]) -> dict:
    """n, mean, sample standard deviation, and the 95% percentile bootstrap interval of the mean (low, high)."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan
    low, high = inference.bootstrap_interval(values)
    return {"n": n, "mean": mean, "std": std, "low": low, "high": high}


def group_runs(records: list[dict], keys: list[str]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault(tuple(hashable(r["config"].get(k)) for k in keys), []).append(r)
    return dict(sorted(groups.items(), key=lambda item: [(v is None, str(type(v)), v) for v in item[0]]))


def check_metrics(records: list[dict], design: Design, named: list[str]) -> None:
    """The metrics a command names (named: --metric's; --solved's, --select-on's, --reach's, --log's) are ones the
    runs have: a misspelt name is an error listing theirs, not an empty column."""
    have = sorted({m for r in records for m in r.get("metrics") or {}})
    curves = sorted({k for r in records for point in r.get("curve") or [] for k in point if k not in ("epoch", "step")})
    wanted = [m for m in named if not budget.parse(m)]
    wanted += [design.solved[0]] if design.solved else []
    wanted += [design.select[1]] if design.select else []  # --select-on
    for metric in wanted:
        if metric not in have:
            raise CompareError(f"no run has the metric {metric!r}; theirs: {', '.join(have) or 'none'}")
    if design.reach and design.reach[0] not in curves:
        raise CompareError(
            f"--reach {design.reach[0]}: no run's validation curve has it; theirs: {', '.join(curves) or 'none'}"
        )
    for metric in design.metrics:  # --at: a budget some run reached
        if (at := budget.parse(metric)) and all(budget.at_budget(r, *at) is None for r in records):
            option = "steps" if at[1] == "step" else "flops"
            ends = [
                budget.training_flops(r) if option == "flops" else (r.get("curve") or [{}])[-1].get("step")
                for r in records
            ]
            if (most := max((e for e in ends if e is not None), default=None)) is not None:
                raise CompareError(f"--at {option}={at[2]:g}: no run trained that far (the longest: {most:g} {option})")
            if option == "steps":
                raise CompareError("--at steps: no run recorded a validation curve")
    if shown := [m for m in design.log if m not in design.metrics]:
        raise CompareError(
            f"--log {shown[0]} is not a metric compared ({', '.join(design.metrics)}): add --metric {shown[0]}"
        )


def compare(records: list[dict], design: Design) -> tuple[list, list]:
    """One row per group: the varying keys' values, each metric summarised over seeds, params, throughput."""
    edges: dict = {}
    on_flops = [m for m in design.metrics if (budget.parse(m) or ("", ""))[1] == "flops"]
    if on_flops and not any(budget.training_flops(r) for r in records):
        raise CompareError(
            f"{on_flops[0]} reads FLOPs from learning curves that count training tokens, and these runs' curves "
            "count none (made before headlab counted them): compare at steps (--at steps=N)"
        )
    if design.select:
        records, edges = select_best(records, *design.select)
    keys = varying_keys(records)
    if design.select and design.select[0] not in keys:
        keys.append(design.select[0])  # every arm chose the same value: still shown
    for flag, key in (("--meta", design.meta), ("--across", design.across)):
        if key and key not in keys:
            one = {hashable(r["config"][key]) for r in records if key in r["config"]}
            alone = f" (every run has {one.pop()!r}: read one dataset without {flag})" if len(one) == 1 else ""
            raise CompareError(f"{flag} key {key!r} does not vary{alone}; varying keys: {', '.join(keys)}")
    rows = []
    for values, runs in group_runs(records, keys).items():
        row = dict(zip(keys, values, strict=True))
        row["runs"] = len(runs)
        for metric in design.metrics:
            found = [(_seed(r, i), _metric(r, metric)) for i, r in enumerate(runs) if _metric(r, metric) is not None]
            if found:
                seeds, values = (list(column) for column in zip(*found, strict=True))
                row[metric] = summarise_metric(values, seeds, metric in design.log, metric)
                if metric == TEST_ACC and design.test in EXAMPLE_TESTS:
                    row[metric].update(example_summary(runs, design.test))
                if any(_fold(r) is not None for r in runs):
                    row[metric].update(summarise_folds(runs, metric))
        if design.solved:
            metric, threshold = design.solved
            found = [(_seed(r, i), r["metrics"][metric]) for i, r in enumerate(runs) if _metric(r, metric) is not None]
            row["solved"] = None
            if found:
                row["solved"] = inference.solve_rate([v for _, v in found], threshold)
                row["solved"]["by_seed"] = {seed: v >= threshold for seed, v in found}
        if design.reach:
            row["reach"] = reach_summary(runs, *design.reach)
        curves = [r["curve"] for r in runs if r.get("curve")]
        row["improving"] = (sum(map(improving_at_end, curves)), len(curves)) if curves else None
        row["curves"] = curves
        params = [r["params"]["total"] for r in runs if r.get("params")]
        speed = [
            r["throughput"]["train_tokens_per_s"] for r in runs if (r.get("throughput") or {}).get("train_tokens_per_s")
        ]
        row["params"] = params[0] if params else None
        flops = {r.get("flops_per_token") for r in runs if r.get("flops_per_token")}
        row["flops_per_token"] = flops.pop() if len(flops) == 1 else None
        row["train_flops"] = budget.mean_flops(runs)
        row["chance"], row["chance_varies"] = chance(runs)
        row["tokens_per_s"] = sum(speed) / len(speed) if speed else None
        if design.select:
            row["select_grid"] = edges.get(tuple(row[k] for k in keys if k != design.select[0]))
        rows.append(row)
    if design.baseline:
        add_baseline(rows, keys, design)
    return keys, rows


def summarise_metric(values: list[float], seeds: list, log: bool, metric: str) -> dict:
    """summarise() of a metric's values over seeds; log: on the log scale (the values kept for the tests are the
    logs; mean and interval are the geometric mean and its interval, back-transformed)."""
    if not log:
        return {**summarise(values), "values": values, "seeds": seeds}
    if not all(v > 0 for v in values):
        raise CompareError(f"--log {metric}: its values must be positive, not {min(values)}")
    logs = [math.log(v) for v in values]
    summary = summarise(logs)
    back = {k: math.exp(summary[k]) if not math.isnan(summary[k]) else math.nan for k in ("mean", "low", "high")}
    return {**summary, **back, "values": logs, "seeds": seeds, "log": True}


def chance(runs: list[dict]) -> tuple[float | None, bool]:
    """The chance accuracy of an arm's mean: the mean of its runs' chance (cross-validation folds each have their
    own majority rate), and whether the runs' values differ; None where a run has none."""
    chances = [_chance(r) for r in runs]
    if not chances or None in chances:
        return None, False
    return round(sum(chances) / len(chances), 6), len({round(c, 6) for c in chances}) > 1


def _chance(record: dict) -> float | None:
    """The accuracy of always answering the most common test label, as the run recorded it (else 1 / classes)."""
    data = record.get("data") or {}
    return data.get("chance") or (1 / data["n_classes"] if data.get("n_classes") else None)


def _metric(record: dict, metric: str):
    """A metric of the run; "val/acc@step=N" or "val/acc@flops=F": the curve's value at its last validation within
    that budget (None for a run whose training ended before it: headlab.stats.budget)."""
    if at := budget.parse(metric):
        return budget.at_budget(record, *at)
    return (record.get("metrics") or {}).get(metric)


def reach_summary(runs: list[dict], metric: str, op: str, threshold: float) -> dict | None:
    """Steps to reach metric op threshold on the validation curve, per run (censored where it never did), as a
    Kaplan-Meier summary (headlab.stats.survival), with the times and outcomes the log-rank test takes."""
    found = [survival.time_to_reach(r.get("curve") or [], metric, op == ">=", threshold) for r in runs]
    found = [f for f in found if f is not None]
    if not found:
        return None
    times, reached = [t for t, _ in found], [r for _, r in found]
    return {**survival.kaplan_meier(times, reached), "times": times, "reached": reached, "budget": max(times)}


def _seed(record: dict, index: int):
    return record["config"].get("seed", index)


def _fold(record: dict):
    return record["config"].get(FOLD)


def summarise_folds(runs: list[dict], metric: str) -> dict:
    """For cross-validated runs: the metric averaged over each fold's seeds ({fold: mean}), their mean (folds
    weigh alike), and the corrected resampled t interval over folds (inference.cv_interval), which accounts for
    the seeds within a fold and the folds both. k: data.cv.folds."""
    by_fold: dict = {}
    for r in runs:
        if _metric(r, metric) is not None:
            by_fold.setdefault(_fold(r), []).append(_metric(r, metric))
    means = {fold: sum(v) / len(v) for fold, v in sorted(by_fold.items(), key=lambda item: str(item[0]))}
    k = runs[0]["config"].get("data.cv.folds") or len(means)
    low, high = inference.cv_interval(list(means.values()), k)
    if is_proportion(metric):  # the t interval is unbounded: an accuracy's is clipped to what it can be
        low, high = max(low, 0.0), min(high, 1.0)
    return {"mean": sum(means.values()) / len(means), "low": low, "high": high, "folds": means, "k": k}


def is_proportion(metric: str) -> bool:
    """An accuracy (val/acc, test/acc, val/acc_best): a number in [0, 1]."""
    return metric.split("@", 1)[0].rsplit("/", 1)[-1].startswith("acc")


def select_best(records: list[dict], key: str, on: str) -> tuple[list[dict], dict]:
    """Per arm (the groups of the other varying keys), the runs at the value of `key` whose mean `on` (a
    validation metric) is highest over seeds; the other values' runs are dropped. Also, per arm whose choice is
    the lowest or highest value of its grid (numeric, 2 or more values): {arm's values: (chosen, grid)}, an
    optimum not bracketed."""
    others = [k for k in varying_keys(records) if k != key]
    if key not in {k for r in records for k in r["config"]}:
        raise CompareError(f"--select key {key!r} is not in the runs' configs")
    chosen, edges = [], {}
    for arm, runs in group_runs(records, others).items():
        by_value = group_runs(runs, [key])
        scores = {v: [_metric(r, on) for r in rs if _metric(r, on) is not None] for v, rs in by_value.items()}
        best = max((v for v in scores if scores[v]), key=lambda v: sum(scores[v]) / len(scores[v]), default=None)
        if best is None:
            named = ", ".join(f"{k}={v}" for k, v in zip(others, arm, strict=True))
            raise CompareError(f"--select {key}: no run of the arm {named} has {on} to choose on")
        chosen += by_value[best]
        grid = sorted(v[0] for v in by_value if isinstance(v[0], int | float))
        if len(grid) > 1 and best[0] in (grid[0], grid[-1]):
            edges[arm] = (best[0], grid)
    return chosen, edges


def baselines(rows: list[dict], keys: list[str], design: Design) -> list[dict | None]:
    """Each group's baseline: the group with key=value and the other keys equal (a selected key may differ, and so
    may a key that follows from key's value, one value of it for each value of key); None where there is none."""
    key, value = design.baseline
    if key not in keys:
        raise CompareError(f"--baseline key {key!r} does not vary; varying keys: {', '.join(keys)}")
    values = {hashable(r[key]) for r in rows}  # keys with one value per value of key describe it (design=plain:
    # gate none, ...), so no row can share them with its baseline
    follows = [k for k in keys if k != key and len({(hashable(r[key]), hashable(r[k])) for r in rows}) == len(values)]
    others = design.within or [
        k for k in keys if k != key and k not in follows and (not design.select or k != design.select[0])
    ]
    if unknown := [k for k in design.within if k not in keys]:
        raise CompareError(f"--within key(s) {', '.join(unknown)} do not vary; varying: {', '.join(keys)}")
    if not any(same_value(r[key], value) for r in rows):
        values = ", ".join(sorted({"null" if r[key] is None else str(r[key]) for r in rows}))
        raise CompareError(f"--baseline {key}={value} matches no group: {key} takes {values}")
    found = []
    for row in rows:
        bases = [b for b in rows if same_value(b[key], value) and all(b[k] == row[k] for k in others)]
        if len(bases) > 1:
            raise CompareError(
                f"{len(bases)} groups have {key}={value} and the same {', '.join(others)}: name the keys that pick "
                "one baseline per group with --within"
            )
        found.append(bases[0] if bases else None)
    return found


def add_baseline(rows: list[dict], keys: list[str], design: Design) -> None:
    """Difference of each group to its baseline (baselines): the design's test (contrasts.contrast_p), solve rates
    by Fisher's test or paired over seeds (contrasts.solve_rate_contrast), and Holm's correction over all the
    comparisons of a metric (of a metric and dataset with --meta: each dataset read as it would be alone)."""
    for row, base in zip(rows, baselines(rows, keys, design), strict=True):
        # a contrast where a run of either arm was still improving when training ended holds at this budget only
        budget = base is not None and any(r.get("improving") and r["improving"][0] for r in (row, base))
        for metric in design.metrics:
            if base is None or metric not in row or metric not in base:
                continue
            a, b = row[metric], base[metric]
            p = math.nan if row is base else contrast_p(a, b, design)
            a.update(delta=a["mean"] - b["mean"], p_value=p, is_baseline=row is base)
            if a.get("log"):
                a["ratio"] = a["mean"] / b["mean"]
            if row is not base:
                a["effect"], a["se"], a["df"] = contrast_effect(a, b, design)  # what a meta-analysis weighs it by
                a.update(contrast_power(a, b, design), at_budget=budget)
        if base is not None and row.get("solved") and base.get("solved"):
            if row is base:
                row["solved"]["p_value"] = math.nan
            else:
                row["solved"].update(solve_rate_contrast(row["solved"], base["solved"], design), at_budget=budget)
        if base is not None and row.get("reach") and base.get("reach"):
            times = [(s["times"], s["reached"]) for s in (row["reach"], base["reach"])]
            row["reach"]["p_value"] = math.nan if row is base else survival.logrank_p(*times)
    families = {hashable(r.get(design.meta)) for r in rows}  # with --meta, each dataset is read as alone
    for metric, family in itertools.product([*design.metrics, "solved", "reach"], families):
        summaries = [
            r[metric]
            for r in rows
            if isinstance(r.get(metric), dict) and "p_value" in r[metric] and hashable(r.get(design.meta)) == family
        ]
        for summary, adjusted in zip(summaries, inference.holm([s["p_value"] for s in summaries]), strict=True):
            summary["p_holm"] = adjusted
            within = within_margin(summary, design.effect)
            summary["verdict"] = power.verdict(adjusted, summary.get("power", math.nan), within)


def pruning_summary(records: list[dict], keys: list[str]) -> list[dict]:
    """Per group whose runs have pruning curves (heads.json): at each step, the accuracy after pruning in importance
    order and in each baseline order (summarised over runs), and the paired difference importance - baseline with
    its p-value (paired t-test over runs) and Holm's over the group's steps and baselines. [{"group": {key:
    value}, "runs", "split", "orders", "steps"}]."""
    out = []
    for values, runs in group_runs(records, keys).items():
        analysed = [r["head_analysis"] for r in runs if r.get("head_analysis", {}).get("pruning_curve")]
        if not analysed:
            continue
        curves = [{"importance": h["pruning_curve"], **h.get("pruning_baselines", {})} for h in analysed]
        orders = [o for o in curves[0] if all(o in c for c in curves)]
        steps = []
        for step in range(min(len(c[o]) for c in curves for o in orders)):
            at = {o: [c[o][step]["metric"] for c in curves] for o in orders}
            point = curves[0]["importance"][step]
            importance = dict(enumerate(at["importance"]))
            differences = {
                b: {
                    "delta": (sum(at["importance"]) - sum(at[b])) / len(curves),
                    "p": inference.paired_p(importance, dict(enumerate(at[b]))),
                    "interval": inference.paired_interval(importance, dict(enumerate(at[b]))),
                }
                for b in orders[1:]
            }
            steps.append(
                {
                    "heads_pruned": point["heads_pruned"],
                    "fraction": point["fraction_pruned"],
                    "orders": {o: summarise(at[o]) for o in orders},
                    "differences": differences,
                }
            )
        family = [d for step in steps for d in step["differences"].values()]  # Holm over every step and baseline
        for d, adjusted in zip(family, inference.holm([d["p"] for d in family]), strict=True):
            d["p_holm"] = adjusted
        group = dict(zip(keys, values, strict=True))
        split = analysed[0].get("pruning_split", "validation")
        out.append({"group": group, "runs": len(curves), "split": split, "orders": orders, "steps": steps})
    return out
