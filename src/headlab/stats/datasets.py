"""Readings over several datasets, from the rows headlab.stats.comparison computed per dataset: each arm's
contrast pooled over the datasets by a random-effects meta-analysis (pool, --meta KEY), and settings ranked by how
far each falls from every dataset's own best (across, --across KEY: how defaults that transfer are chosen).

A key with one value per dataset (its files, its folds) belongs to the dataset, not to an arm or a setting."""

import math

from headlab.stats import inference, meta
from headlab.stats.comparison import hashable
from headlab.stats.contrasts import Design, contrast_effect, t_interval


def setting_keys(rows: list[dict], keys: list[str], dataset: str, design: Design) -> list[str]:
    """The keys that name an arm or a setting over datasets: those that vary within some dataset (the dataset key,
    and a key chosen per arm by --select, left out)."""
    values = {hashable(r[dataset]) for r in rows}
    within = lambda k: any(len({hashable(r[k]) for r in rows if hashable(r[dataset]) == d}) > 1 for d in values)  # noqa: E731
    return [k for k in keys if k != dataset and within(k) and (not design.select or k != design.select[0])]


def pool(rows: list[dict], keys: list[str], design: Design) -> list[dict]:
    """Each arm's contrast with its baseline pooled over the values of design.meta (the datasets): per arm and
    metric, the random-effects mean of the datasets' effects (meta.random_effects, weighted by
    contrasts.contrast_effect's standard errors), Holm-adjusted over the arms of a metric.
    [{"arm": {key: value}, "metric", "datasets": {value: (effect, se)}, "left_out": [values], **random_effects}];
    a dataset whose contrast has no standard error (one run or fold, or every run alike) cannot be weighted and
    is left out, by name."""
    arm_keys = setting_keys(rows, keys, design.meta, design)
    pooled = []
    for metric in design.metrics:
        arms: dict[tuple, list] = {}
        for row in rows:
            if "se" in (row.get(metric) or {}):
                arm = tuple(row[k] for k in arm_keys)
                summary = row[metric]
                contrast = (row[design.meta], summary["effect"], summary["se"], summary.get("verdict", ""))
                arms.setdefault(arm, []).append(contrast)
        found = []
        for arm, contrasts in arms.items():
            usable = [(d, e, se, v) for d, e, se, v in contrasts if se > 0 and math.isfinite(se)]
            combined = meta.random_effects([e for _, e, _, _ in usable], [se for _, _, se, _ in usable])
            combined["datasets"] = {d: (e, se) for d, e, se, _ in usable}
            combined["verdicts"] = {d: v for d, _, _, v in usable}  # each dataset's own reading
            combined["left_out"] = [d for d, _, se, _ in contrasts if not (se > 0 and math.isfinite(se))]
            found.append({"arm": dict(zip(arm_keys, arm, strict=True)), "metric": metric, **combined})
        for result, adjusted in zip(found, inference.holm([r["p_value"] for r in found]), strict=True):
            result["p_holm"] = adjusted
        pooled += found
    return pooled


def _best_on(settings: list[dict], metric: str, dataset) -> dict | None:
    """The setting with the best mean of metric on dataset (lowest for a loss); None where none was run there."""
    run = [s for s in settings if dataset in s.get(metric, {}).get("means", {})]
    sign = -1 if "loss" in metric else 1
    return max(run, key=lambda s: sign * s[metric]["means"][dataset], default=None)


def target(gap: float, high: float, effect: float) -> str:
    """Whether a setting is within effect of a dataset's best: "met" where the gap's 95% interval ends at most
    effect above 0 (high: its upper end, 0 for the best itself), "missed" where the gap itself exceeds effect,
    "inconclusive" between (and where the gap has no interval)."""
    if gap > effect:
        return "missed"
    return "met" if high <= effect else "inconclusive"  # nan compares False: no interval, no verdict


def across(rows: list[dict], keys: list[str], design: Design) -> dict:
    """Every setting (the keys that vary within a dataset) ranked across the values of design.across (the
    datasets). A dataset's best setting is the one best on the first metric (a validation metric). Per metric and
    dataset: each setting's mean and its gap to that best setting's mean of the same metric (best - mean: 0 for
    the best; for a loss, where lower is better, mean - best; below 0 on test where a setting beats the one chosen
    on validation), with the 95% t interval of the gap (contrasts.contrast_effect: corrected over folds, paired
    over shared seeds with --paired, else Welch's), and with design.effect whether it is within that of the best
    (target); per setting its worst gap and its mean rank (1: a dataset's best mean) over the datasets it was run
    on. The choice is made on the first metric: the setting, run on every dataset, with the smallest worst gap
    (ties: the better mean rank). {"datasets", "settings": [{"setting", metric: {"means", "gaps", "gap_intervals",
    "targets", "intervals", "summaries", "worst", "rank"}}], "chosen": index or None, "metric"}."""
    names = setting_keys(rows, keys, design.across, design)
    datasets = sorted({r[design.across] for r in rows}, key=str)
    found: dict[tuple, dict] = {}
    for row in rows:
        setting = found.setdefault(tuple(row[k] for k in names), {"setting": {k: row[k] for k in names}})
        for metric in design.metrics:
            if row.get(metric):
                entry = setting.setdefault(metric, {"means": {}, "intervals": {}, "summaries": {}})
                entry["means"][row[design.across]] = row[metric]["mean"]
                entry["intervals"][row[design.across]] = (row[metric]["low"], row[metric]["high"])
                entry["summaries"][row[design.across]] = row[metric]
    settings = list(found.values())
    first = design.metrics[0]
    best = {d: _best_on(settings, first, d) for d in datasets}  # each dataset's best setting, chosen on the first
    for metric in design.metrics:
        lower_is_better = "loss" in metric
        for d in datasets:
            scored = [s[metric]["means"][d] for s in settings if d in s.get(metric, {}).get("means", {})]
            reference = best[d].get(metric, {}).get("summaries", {}).get(d) if best[d] else None
            order = sorted(set(scored), reverse=not lower_is_better)
            for s in settings:
                if d in s.get(metric, {}).get("means", {}) and reference is not None:
                    mean, ref = s[metric]["means"][d], reference["mean"]
                    s[metric].setdefault("gaps", {})[d] = (mean - ref) if lower_is_better else (ref - mean)
                    s[metric].setdefault("ranks", {})[d] = 1 + order.index(mean)
                    ends = (s[metric]["summaries"][d], reference)[:: 1 if lower_is_better else -1]
                    gap = (math.nan,) * 2 if s is best[d] else t_interval(*contrast_effect(*ends, design))
                    s[metric].setdefault("gap_intervals", {})[d] = gap
                    if design.effect is not None:
                        reached = target(s[metric]["gaps"][d], 0.0 if s is best[d] else gap[1], design.effect)
                        s[metric].setdefault("targets", {})[d] = reached
        for s in settings:
            entry = s.get(metric, {})
            complete = len(entry.get("gaps", {})) == len(datasets)
            entry["worst"] = max(entry["gaps"].values()) if complete else math.nan
            entry["rank"] = sum(entry["ranks"].values()) / len(datasets) if complete else math.nan
    ranked = [i for i, s in enumerate(settings) if not math.isnan(s.get(first, {}).get("worst", math.nan))]
    chosen = min(ranked, key=lambda i: (settings[i][first]["worst"], settings[i][first]["rank"]), default=None)
    return {"datasets": datasets, "settings": settings, "chosen": chosen, "metric": first, "metrics": design.metrics}


def leave_one_out(ranked: dict) -> list[dict]:
    """Each dataset held out of the choice (across's, on its first metric: the smallest worst gap over the other
    datasets, ties by their mean rank), and what that choice gives on it: [{"dataset", "chosen" (a setting's index),
    metric: {"held_out": its mean on the dataset, "gap": its gap there, "in_sample": the mean there of the setting
    chosen with every dataset, "best": the mean there of the dataset's own best}}]. Defaults that transfer do as
    well held out as in sample. Empty with fewer than three datasets (a choice from one dataset is that one's best)."""
    datasets, settings, first = ranked["datasets"], ranked["settings"], ranked["metric"]
    if len(datasets) < 3:
        return []
    complete = [i for i, s in enumerate(settings) if len(s.get(first, {}).get("gaps", {})) == len(datasets)]
    out = []
    for d in datasets:
        others = [o for o in datasets if o != d]
        scores = {i: _score_without(settings[i][first], others) for i in complete}
        chosen = min(complete, key=scores.__getitem__, default=None)
        if chosen is None:
            continue
        best = min(complete, key=lambda i: settings[i][first]["gaps"][d])  # noqa: B023  (a gap of 0: its own best)
        row = {"dataset": d, "chosen": chosen}
        for metric in ranked.get("metrics", [first]):
            means = {i: settings[i].get(metric, {}).get("means", {}).get(d, math.nan) for i in complete}
            in_sample = means.get(ranked["chosen"], math.nan)
            gap = settings[chosen].get(metric, {}).get("gaps", {}).get(d, math.nan)
            row[metric] = {"held_out": means[chosen], "gap": gap, "in_sample": in_sample, "best": means[best]}
        out.append(row)
    return out


def _score_without(entry: dict, datasets: list) -> tuple[float, float]:
    """A setting's worst gap and mean rank over these datasets: what the choice minimises."""
    return max(entry["gaps"][d] for d in datasets), sum(entry["ranks"][d] for d in datasets) / len(datasets)
