"""The dry run's plan (sweep.plan; --prior, --baseline, --effect, --budget): what the sweep's seeds or folds can
tell before it runs. From an earlier sweep on the same data and metric (the prior), for each arm against the
baseline: the smallest difference the planned replicates detect at 80% power with compare's test, the replicates a
stated margin needs, and the share of the prior's runs still improving at the planned epoch (headlab.stats.plan).
With a budget, the most replicates an arm whose sweep fits it, priced from the dry run's own measurements."""

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from headlab.errors import ConfigError
from headlab.printing import duration, seconds_of
from headlab.stats import plan as stats_plan
from headlab.stats.comparison import same_value, varying_keys
from headlab.stats.runs import load_dirs

REPLICATES = ("seed", "data.cv.fold")  # what repeats an arm: seeds, or the folds of cross-validation
MOST_SEEDS = 1000  # the most seeds an arm a budget is searched up to


@dataclass
class Plan:
    """What the dry run says beyond its costs: nothing where no plan key is set."""

    said: list[str] = field(default_factory=list)
    rows: list[dict] | None = None
    replicates: int | None = None
    budget: dict | None = None

    def lines(self) -> list[str]:
        return self.said

    def as_json(self) -> dict:
        found = {"plan": self.rows, "replicates": self.replicates, "budget": self.budget}
        return {k: v for k, v in found.items() if v is not None}


def same_written(a: str | None, b: str) -> bool:
    """Two values as command lines write them: numbers by value (1e-2 is 0.01), anything else as text."""
    try:
        return a is not None and float(a) == float(b)
    except ValueError:
        return a == b


def arms_of(jobs: list[list[str]]) -> list[dict[str, str]]:
    """Each job's arm: its overrides of the keys that differ between jobs, but replicates (seed, fold)."""
    settings = [{stats_plan.config_key(o): o.split("=", 1)[1] for o in job if "=" in o} for job in jobs]
    keys = {k for s in settings for k in s if k not in REPLICATES and len({s.get(k) for s in settings}) > 1}
    return [{k: v for k, v in s.items() if k in keys} for s in settings]


def as_planned(records: list[dict], cfg: DictConfig, arm_keys: set[str]) -> list[dict]:
    """The prior's runs as the planned sweep would run them: on each key that varies among them and that the sweep
    fixes (a learning rate, a width), those at the sweep's value."""
    for key in varying_keys(records):
        planned = OmegaConf.select(cfg, key, default=None)
        if key in arm_keys or planned is None or isinstance(planned, DictConfig):
            continue
        records = [r for r in records if same_value(r["config"].get(key), str(planned))]
    return records


def plan(settings: DictConfig, groups: list, configs: list, measured: list, total_s: float, startup_s: float) -> Plan:
    """The plan of a sweep whose jobs are grouped as it runs them (groups), each group's composed config and Cost;
    total_s: the sweep's estimated seconds. A ConfigError names the key of a prior or baseline that cannot serve."""
    prior, baseline, effect, budget = (settings.get(k) for k in ("prior", "baseline", "effect", "budget"))
    if prior is None and baseline is None and effect is None and budget is None:
        return Plan()
    jobs = [(job, cost, cfg) for group, cost, cfg in zip(groups, measured, configs, strict=True) for job in group]
    arms: dict[tuple, dict] = {}
    for arm, (_, cost, cfg) in zip(arms_of([job for job, _, _ in jobs]), jobs, strict=True):
        key = tuple(sorted(arm.items()))
        arms.setdefault(key, {"arm": arm, "jobs": 0, "epochs": cost.epochs, "config": cfg})["jobs"] += 1
    replicates = max(a["jobs"] for a in arms.values())
    folds = (configs[0].data.get("cv") or {}).get("folds")
    what = f"{replicates} {'folds' if folds else 'seeds'} an arm"
    test = f"the corrected paired t over {folds}-fold CV" if folds else "Welch's t over seeds"
    done = Plan(replicates=replicates)
    unit = "folds" if folds else "seeds"
    if budget is not None:  # the sweep's time grows with its replicates; its start-up does not
        seconds_at = lambda n: startup_s + (total_s - startup_s) * n / replicates  # noqa: E731
        fits = stats_plan.largest_within(seconds_at, seconds_of(budget), folds or MOST_SEEDS)
        done.budget = {"seconds": seconds_of(budget), "replicates": fits}
        if fits is None:
            done.said.append(
                f"budget {budget}: not even 2 {unit} an arm fit (they take about {duration(seconds_at(2))})"
            )
        else:
            done.said.append(f"budget {budget}: {fits} {unit} an arm fit (about {duration(seconds_at(fits))})")
            replicates, what = fits, f"{fits} {unit} an arm (the budget's)"
    if prior is None or baseline is None:
        done.said.append(
            "a plan of what the replicates detect needs --prior DIR (an earlier sweep or archive, same data and metric)"
            " and --baseline KEY=VALUE (the arm the others are compared with)"
        )
        return done
    key, _, value = str(baseline).partition("=")
    if not any(key in a["arm"] for a in arms.values()):
        varied = ", ".join(sorted({k for a in arms.values() for k in a["arm"]})) or "none"
        raise ConfigError(
            f"sweep.plan.baseline={baseline} is invalid: expected KEY=VALUE of a key the sweep varies ({varied})"
        )
    metric = settings.get("metric") or "test/acc"
    records = [r for r in load_dirs([Path(str(prior))]).completed if metric in r.get("metrics", {})]
    if not records:
        raise ConfigError(
            f"sweep.plan.prior={prior} is invalid: expected a sweep directory or archive with completed runs "
            f"that recorded {metric}"
        )
    arm_keys = {k for a in arms.values() for k in a["arm"]}
    rows = []
    for a in arms.values():
        if same_written(a["arm"].get(key), value):
            continue  # the baseline itself
        base_arm = {**a["arm"], key: value}
        base = next((b for b in arms.values() if _same_arm(b["arm"], base_arm)), a)  # its config, where planned
        arm_runs = as_planned(stats_plan.runs_of(records, a["arm"]), a["config"], arm_keys)
        base_runs = as_planned(stats_plan.runs_of(records, base_arm), base["config"], arm_keys)
        planned = stats_plan.plan_arm(arm_runs, base_runs, metric, replicates, a["epochs"], effect, folds)
        rows.append({"arm": " ".join(f"{k}={v}" for k, v in a["arm"].items()), **planned})
    done.rows = rows
    done.said.append(f"plan against {baseline} on {metric} ({test}), {what}, from {len(records)} runs of {prior}:")
    for row in rows:
        if row["detectable"] is None:
            done.said.append(f"  {row['arm']}: the prior has too few runs of it or of its baseline to say")
            continue
        said = f"  {row['arm']}: detects ±{row['detectable']:.4f} at 80% power"
        if effect is not None:
            n = row["needed_for_effect"]
            most = f"more than {folds or stats_plan.power.MAX_SEEDS}"
            said += f"; ±{effect:g} needs {n or most} {unit} an arm"
        if row["still_improving"] is not None:
            said += f"; {row['still_improving']:.0%} of the prior's runs still improving at this epoch"
        said += "" if row["from"] == "prior" else " (the prior has no runs of it: its baseline's spread on both sides)"
        done.said.append(said)
    return done


def _same_arm(arm: dict[str, str], other: dict[str, str]) -> bool:
    return arm.keys() == other.keys() and all(same_written(arm[k], v) for k, v in other.items())
