"""What headlab's grid sweeper adds to the grid of a sweep's overrides.

Cross-validation: one job per fold where the composed config has folds and the overrides name none.
sweep.extend: after the grid, each arm whose best value of a key (the learning rate) is an edge of its grid gets one
more value beyond that edge, as new jobs of the same sweep, until every arm's best value is bracketed or the limit
of rounds is reached. An arm is a group of the other varying keys (headlab.stats.comparison); its best value has
the highest mean of sweep.extend.select_on over seeds, as `headlab-compare --select` chooses it. Each round decides
from the jobs numbered before it (the grid's and the earlier rounds'), so a resumed sweep replays the same rounds
into the same job directories, and finds their jobs done.
sweep.sequential: the grid's seeds in rounds instead, an arm stopping once its contrast with the baseline is decided
at a look (headlab.stats.sequential), the same numbering rule making a resumed sweep replay its rounds.
"""

import functools
import json
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from headlab.errors import fail
from headlab.files import write_text_atomic
from headlab.launch.planning import arms_of, same_written
from headlab.stats.comparison import group_runs, select_best, varying_keys
from headlab.stats.runs import load_dirs

log = logging.getLogger("headlab")


def fold_sweep(config: DictConfig, arguments: list[str]) -> list[str]:
    """The sweep's overrides, with data.cv.fold=range(k) added where the composed config cross-validates
    (data.cv.folds=k, from the command line, a data config or an experiment) and no fold is given: `headlab-train
    -m data=mr seed=0,1,2` is the whole k-fold protocol, each fold a job."""
    k = OmegaConf.select(config, "data.cv.folds", default=None)
    if not k or any(a.split("=", 1)[0].lstrip("+~") == "data.cv.fold" for a in arguments):
        return arguments
    return [*arguments, f"data.cv.fold=range({k})"]


def check_extension(key: str, arguments: list[str], params: dict | None) -> None:
    """sweep.extend.key names a key the sweep varies, given on the command line or in the sweeper's params (an
    experiment's), over numbers: a misspelt key would otherwise read as "every arm's best is inside its grid", and
    a key of names has no value beyond its grid."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweeps = ("range(", "choice(", "interval(", "glob(")
    given = [a.split("=", 1) for a in arguments if "=" in a] + [(k, str(v)) for k, v in (params or {}).items()]
    swept = {k.lstrip("+~"): v for k, v in given if "," in v or v.startswith(sweeps)}
    if key not in swept:
        fail("sweep.extend.key", key, f"a key the sweep varies: one of {', '.join(sorted(swept)) or 'none'}")
    override = OverridesParser.create().parse_override(f"{key}={swept[key]}")
    values = list(override.sweep_iterator()) if override.is_discrete_sweep() else []
    if not values or any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        fail("sweep.extend.key", key, f"a key the sweep varies over numbers (its grid is {swept[key]})")


def check_subdir(subdir, jobs: int) -> None:
    """A sweep of several jobs gives each its own run directory: hydra.sweep.subdir, where it names no value of the
    job (no interpolation), would make every job after the first refuse the directory the first one wrote."""
    if jobs > 1:
        fail(
            "hydra.sweep.subdir",
            subdir,
            f"a name that differs between the sweep's {jobs} jobs: one with an "
            "interpolation such as ${hydra.job.num} (headlab's default) or ${hydra.job.override_dirname}",
        )


def say_repeats(jobs: list[list[str]]) -> None:
    """A job that repeats an earlier one (a value given twice: seed=0,0; optim.lr=1e-3,0.001) trains the same run
    again, which headlab-compare counts once (headlab.stats.runs): said before the first job, with the cost."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, seen = OverridesParser.create(), {}

    @functools.cache
    def setting(given: str) -> tuple[str, str]:  # each override parsed once (a 440-job sweep: 0.4 s parsed per job)
        (override,) = parser.parse_overrides([given])
        return override.key_or_group, json.dumps(override.value(), sort_keys=True)

    for index, job in enumerate(jobs):
        run = frozenset(setting(given) for given in job)
        if run in seen:
            said = " ".join(job) or "the configuration as given"
            log.warning(
                "the sweep's jobs %d and %d are the same run (%s): it trains twice and headlab-compare counts it once;"
                " give each value once unless that is meant",
                seen[run],
                index,
                said,
            )
        seen.setdefault(run, index)


def beyond(value: float, grid: list[float], factor: float) -> float:
    """The next value past the edge `value` of grid: x factor past the top, / factor past the bottom."""
    return float(f"{(value * factor if value == grid[-1] else value / factor):.6g}")


def job_number(run_dir: Path) -> int:
    """The sweep's number of the job that ran in run_dir (hydra.job.num: its directory's name by default)."""
    if run_dir.name.isdigit():
        return int(run_dir.name)
    return int(OmegaConf.load(run_dir / ".hydra" / "hydra.yaml").hydra.job.num)


def extension_jobs(sweep_dir: Path, key: str, factor: float, on: str, before: int) -> tuple[list[list[str]], list[str]]:
    """The overrides of the jobs that extend each arm at an edge (the overrides of its runs at the chosen value,
    with key at the value beyond), and one line per extended arm saying why; decided on the completed runs of the
    jobs numbered below `before`."""
    runs = [r for r in load_dirs([sweep_dir]).completed if job_number(Path(r["where"])) < before]
    if len({r["config"].get(key) for r in runs}) < 2:
        return [], []
    chosen, edges = select_best(runs, key, on)
    others = [k for k in varying_keys(runs) if k != key]
    jobs, said = [], []
    for arm, arm_runs in group_runs(chosen, others).items():
        if arm not in edges:
            continue
        value, grid = edges[arm]
        new = beyond(value, grid, factor)
        name = ", ".join(f"{k}={v}" for k, v in zip(others, arm, strict=True)) or "the only arm"
        said.append(f"{name}: best {key}={value} at the edge of {grid}; adding {key}={new}")
        for run in arm_runs:
            overrides = [str(o) for o in OmegaConf.load(Path(run["where"]) / ".hydra" / "overrides.yaml")]
            kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in (key, "sweep.resume")]
            jobs.append([*kept, f"{key}={new}"])
    return jobs, said


FOLD = "data.cv.fold"


def replicate_key(jobs: list[list[str]]) -> str:
    """The key whose values repeat each arm in a sequential sweep: the fold where the sweep runs several (a round
    adds folds, each with all its seeds), else the seed."""
    folds = {o.split("=", 1)[1] for job in jobs for o in job if o.split("=", 1)[0].lstrip("+~") == FOLD}
    return FOLD if len(folds) > 1 else "seed"


def sequential_rounds(jobs: list[list[str]], looks: int) -> tuple[list[dict[str, str]], list[int], list[int]]:
    """Each job's arm (headlab.launch.planning.arms_of), its replicate's rank within its arm (0 first; a fold's
    seeds share its rank), and the replicates an arm has at each look."""
    from headlab.stats import sequential  # scipy: imported by a sequential sweep only

    key = replicate_key(jobs)
    arms = arms_of(jobs)
    ranks, seen = [], {}
    for i, (job, arm) in enumerate(zip(jobs, arms, strict=True)):
        order = seen.setdefault(tuple(sorted(arm.items())), {})  # an arm's replicates, in the order they come
        replicate = next((o.split("=", 1)[1] for o in job if o.split("=", 1)[0].lstrip("+~") == key), None)
        ranks.append(order.setdefault(replicate if key == FOLD else i, len(order)))
    return arms, ranks, sequential.look_sizes(max(len(order) for order in seen.values()), looks)


def read_look(sweep_dir: Path, arms: list[dict], open_arms: set, settings, fractions: tuple, k: int,
              over_folds: bool) -> dict[tuple, dict]:  # fmt: skip
    """Every open arm's contrast with its baseline at look k, from the completed runs of the sweep directory:
    {arm key: its reading at the look's boundary (reading None: it goes on)}: Welch's test over seeds, or in rounds
    over folds (replicate_key) the corrected paired t over the folds both ran (sequential.folds_look); settings:
    sweep.sequential's (baseline, metric, effect, alpha)."""
    from headlab.stats import sequential
    from headlab.stats.plan import runs_of

    runs = load_dirs([sweep_dir]).completed
    folds = next((r["config"].get("data.cv.folds") for r in runs), None) if over_folds else None
    c = sequential.boundaries(fractions, float(settings.alpha))[k]
    key, _, value = str(settings.baseline).partition("=")
    metric, margin = settings.metric, settings.get("effect")
    found = {}
    for arm in arms:
        name = tuple(sorted(arm.items()))
        if name not in open_arms or same_written(arm.get(key), value):
            continue
        mine, theirs = (_replicates(runs_of(runs, on), metric, bool(folds)) for on in (arm, {**arm, key: value}))
        if (len(set(mine) & set(theirs)) if folds else min(len(mine), len(theirs))) < 2:
            continue
        if folds:
            p, difference, interval = sequential.folds_look(mine, theirs, int(folds), c)
        else:
            p, difference, interval = sequential.welch_look(list(mine.values()), list(theirs.values()), c)
        reading = sequential.look(p, interval, c, margin)
        found[name] = {"look": k + 1, "replicates": len(mine), "reading": reading, "p": p,
                       "level": sequential.level(c), "difference": difference, "interval": list(interval)}  # fmt: skip
    return found


def _replicates(runs: list[dict], metric: str, folds: bool) -> dict:
    """An arm's values of metric: {fold: its seeds' mean} in rounds over folds, else {run's place: value}."""
    by_fold: dict = {}
    for i, r in enumerate(x for x in runs if metric in x["metrics"]):
        by_fold.setdefault(r["config"].get(FOLD) if folds else i, []).append(r["metrics"][metric])
    return {fold: sum(values) / len(values) for fold, values in by_fold.items()}


def sequential_sweep(launch, jobs: list[list[str]], settings, sweep_dir: Path, resume: bool) -> list:
    """sweep.sequential: the jobs in rounds, each launched by `launch` (the sweep's launcher's): at look k each
    open arm's next seeds run, then every arm's contrast with its baseline is read at the look's boundary; a decided
    arm stops (its baseline goes on while any arm reads against it). Each round's jobs are numbered after the
    earlier rounds', so a resumed sweep replays the same rounds. sequential.json in the sweep directory gives each
    arm's look, reading and runs."""
    arms, ranks, sizes = sequential_rounds(jobs, int(settings.looks))
    key, _, value = str(settings.baseline).partition("=")
    if not any(same_written(arm.get(key), value) for arm in arms):
        named = sorted({f"{k}={v}" for arm in arms for k, v in arm.items()})
        fail("sweep.sequential.baseline", settings.baseline, f"an arm of the sweep: one of {', '.join(named)}")
    fractions = tuple(n / sizes[-1] for n in sizes)
    over_folds = replicate_key(jobs) == FOLD
    names = [tuple(sorted(arm.items())) for arm in arms]
    open_arms, readings, numbers = set(names), {}, {}
    returns, done = [], 0
    for k, size in enumerate(sizes):
        start = sizes[k - 1] if k else 0
        todo = [
            i
            for i, (name, rank) in enumerate(zip(names, ranks, strict=True))
            if name in open_arms and start <= rank < size
        ]
        batch = [[*jobs[i], "sweep.resume=true"] if resume else jobs[i] for i in todo]
        if batch:
            returns.append(launch(batch, initial_job_idx=done))
            numbers |= {i: done + n for n, i in enumerate(todo)}
            done += len(batch)
        found = read_look(sweep_dir, arms, open_arms, settings, fractions, k, over_folds)
        for name, reading in found.items():
            readings[name] = reading
            if reading["reading"]:
                open_arms.discard(name)
                said = f"{reading['reading']} (p {reading['p']:.3g}, the look's level {reading['level']:.3g})"
                log.info("sweep.sequential look %d: %s: %s; it stops at %d seeds", k + 1, _name(name), said, size)
        if not {n for n in open_arms if not same_written(dict(n).get(key), value)}:
            break
    arms_json = [
        {
            "arm": _name(name),
            **readings.get(
                name, {"look": None, "reading": "baseline" if same_written(dict(name).get(key), value) else None}
            ),
            "runs": sorted(numbers[i] for i, n in enumerate(names) if n == name and i in numbers),
        }
        for name in dict.fromkeys(names)
    ]
    text = json.dumps(
        {
            "looks": sizes,
            "baseline": str(settings.baseline),
            "metric": settings.metric,
            "effect": settings.get("effect"),
            "alpha": float(settings.alpha),
            "arms": arms_json,
        },
        indent=2,
    )
    write_text_atomic(sweep_dir / "sequential.json", text + "\n")
    return returns


def _name(arm: tuple) -> str:
    return " ".join(f"{k}={v}" for k, v in arm) or "the only arm"
