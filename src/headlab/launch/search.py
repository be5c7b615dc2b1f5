"""hydra/sweeper=search: a study of Optuna's (TPE with a seeded sampler; a median pruner if asked) whose trials
are jobs of the sweep. The search space is the sweep overrides, in Hydra's grammar (choice, range, interval,
tag(log, ...)); every other override is each trial's. A study kept in storage continues: the same command asks
for trials until the study holds n_trials, and with sweep.resume=true first finishes the trials a killed sweep
left running (each job continues from its last.ckpt). The trial number is the job number, so trial N trains in
the sweep's directory N."""

import contextlib
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from omegaconf import OmegaConf
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from headlab.config.check import POSITIVE, RULES
from headlab.errors import ConfigError, as_written, fail
from headlab.files import write_text_atomic
from headlab.record import VAL_ACC_BEST
from headlab.training.pruning import PRUNERS, make_pruner

log = logging.getLogger("headlab")
optuna.logging.set_verbosity(optuna.logging.WARNING)  # headlab says each trial in its own words


@dataclass
class Space:
    """The trials' overrides: those every trial takes as given, and the distributions TPE samples."""

    fixed: list[str]
    distributions: dict[str, BaseDistribution]


def space(overrides: list[Override]) -> Space:
    """The search space of parsed overrides: each sweep override a distribution (choice: categorical; range:
    its values' span and step, integers where all three are; interval: floats, integers with tag(int, ...);
    tag(log, ...): sampled on a log scale)."""
    fixed, distributions = [], {}
    for override in overrides:
        if not override.is_sweep_override():
            fixed.append(override.input_line)
            continue
        key, sweep = override.get_key_element(), override.value()
        try:
            distributions[key] = _distribution(override, sweep)
        except ValueError as error:  # Optuna's refusal of the span (low above high, log with a step or from 0)
            raise ConfigError(f"hydra.sweeper.params.{key}: {sweep} cannot be searched: {error}") from None
    if not distributions:
        raise ConfigError("hydra.sweeper.params: nothing to search: expected a choice, range or interval of a key")
    return Space(fixed, distributions)


def _distribution(override: Override, sweep) -> BaseDistribution:
    log_scale = "log" in sweep.tags
    if isinstance(sweep, ChoiceSweep):
        return CategoricalDistribution(list(override.sweep_string_iterator()))
    if isinstance(sweep, IntervalSweep):
        if "int" in sweep.tags:
            return IntDistribution(int(sweep.start), int(sweep.end), log=log_scale)
        return FloatDistribution(sweep.start, sweep.end, log=log_scale)
    if isinstance(sweep, RangeSweep):  # stop excluded, as range() excludes it
        span = (sweep.start, sweep.stop - sweep.step, sweep.step)
        if all(isinstance(v, int) for v in span):
            return IntDistribution(*span[:2], log=log_scale, step=1 if log_scale else span[2])
        return FloatDistribution(*span[:2], log=log_scale, step=None if log_scale else span[2])
    raise ValueError("expected choice, range or interval")


def check(n_trials: int, n_jobs: int, pruner: str, packed: bool, direction: str, objective: str) -> None:
    """The sweeper's own settings, before the study is opened."""
    for key, value in (("n_trials", n_trials), ("n_jobs", n_jobs)):
        if not POSITIVE[0](value):
            fail(f"hydra.sweeper.{key}", value, POSITIVE[1])
    if pruner not in PRUNERS:
        fail("hydra.sweeper.pruner", pruner, f"one of {', '.join(PRUNERS)}")
    if pruner != "none" and packed:
        fail("hydra.sweeper.pruner", pruner, "none with a packed launcher (a pack trains its members to the end)")
    if direction not in ("maximize", "minimize"):
        fail("hydra.sweeper.direction", direction, "maximize or minimize")
    ok, allowed = RULES["sweep.objective"]  # the config check's rule: no job is composed before the trials
    if not ok(objective):
        fail("sweep.objective", objective, allowed)


def absolute(storage: str | None) -> str | None:
    """A SQLite URL's file from where the sweep started, so that jobs running elsewhere find the same study."""
    if storage and (path := re.fullmatch(r"sqlite:///(?!/)(.+)", storage)):
        return f"sqlite:///{Path(path.group(1)).resolve()}"
    return storage


def open_study(
    name: str, storage: str | None, direction: str, pruner: str, objective: str = VAL_ACC_BEST
) -> optuna.Study:
    """The study, created or (in storage) loaded, with what it optimises: a stored study continues only under its
    own direction and objective (its trials' values mean nothing under another)."""
    if pruner != "none" and not shared(storage):
        raise ConfigError(
            f"hydra.sweeper.pruner={pruner!r} is invalid without a storage the jobs share "
            f"(hydra.sweeper.storage={as_written(storage)}): trials report to the study through it "
            "(e.g. sqlite:///optuna.db)"
        )
    with _storage_said(storage):
        study = optuna.create_study(
            study_name=name, storage=storage, direction=direction, load_if_exists=True, pruner=make_pruner(pruner)
        )
    stored = {"direction": study.direction.name.lower(), "objective": study.user_attrs.get("objective", objective)}
    for key, value in (("hydra.sweeper.direction", direction), ("sweep.objective", objective)):
        if stored[key.rsplit(".", 1)[-1]] != value:
            raise ConfigError(
                f"{key}={value!r} is invalid: the stored study {name!r} {_what(stored)}; continue it as it is, or "
                "name another study (hydra.sweeper.study_name)"
            )
    study.set_user_attr("objective", objective)
    return study


def shared(storage: str | None) -> bool:
    """Whether jobs in other processes reach this storage (an in-memory SQLite database is the process's own)."""
    return bool(storage) and not re.fullmatch(r"sqlite://(/:memory:)?(\?.*)?", storage)


def _what(stored: dict) -> str:
    return f"{stored['direction'].replace('ize', 'ises')} {stored['objective']}"


@contextlib.contextmanager
def _storage_said(storage: str | None):
    """A storage that cannot be opened as one line: a database's driver (psycopg2, pymysql) not installed, a URL
    or database that SQLAlchemy refuses."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as error:
        chain, cause = [], error
        while cause is not None and cause not in chain:
            chain.append(cause)
            cause = cause.__cause__ or cause.__context__
        missing = [c for c in chain if isinstance(c, ModuleNotFoundError)]  # the driver, under Optuna's own error
        lines = str(error).strip().splitlines() or [type(error).__name__]
        why = f"its database driver is not installed ({missing[-1].msg})" if missing else lines[0][:300]
        raise ConfigError(f"hydra.sweeper.storage={storage!r} cannot be opened: {why}") from None


def dry_run(config, loader, packed: bool, search: Space, storage: str | None, name: str, n_trials: int,
            n_jobs: int) -> list:  # fmt: skip
    """--dry-run of a search: the trials the study lacks, each priced at the first value of every key (the values
    TPE draws change a trial's time); the study is read, never created or changed, and nothing trains."""
    from headlab.launch import dry_run as dry

    left = n_trials - stored_trials(name, storage)
    if left <= 0:
        print(f"headlab-train --dry-run: study {name!r} holds its {n_trials} trials; nothing would train")
        return []
    first = [f"{key}={_first(d)}" for key, d in search.distributions.items()]
    print(f"search: {left} trial(s) to ask of study {name!r}, {n_jobs} at a time; priced at {' '.join(first)} "
          "(the values TPE draws change a trial's time)")  # fmt: skip
    max_pack = min(n_jobs, int(config.hydra.launcher.get("max_pack") or 1))
    return dry.say([[*search.fixed, *first]] * left, config, loader, packed, "trials", max_pack)


def stored_trials(name: str, storage: str | None) -> int:
    """How many trials the study holds in storage (0 where there is none yet), read without creating anything."""
    path = re.fullmatch(r"sqlite:///(.+)", storage or "")
    if not shared(storage) or (path and not Path(path.group(1)).exists()):
        return 0
    with _storage_said(storage):
        try:
            return len(optuna.load_study(study_name=name, storage=storage).trials)
        except KeyError:  # no study of that name
            return 0


def _first(distribution: BaseDistribution):
    return distribution.choices[0] if isinstance(distribution, CategoricalDistribution) else distribution.low


def ask(study: optuna.Study, distributions: dict[str, BaseDistribution], seed: int | None) -> optuna.Trial:
    """A new trial of the study with a value of each distribution, sampled by TPE seeded with (seed, the trial's
    number): the same seed gives the same trials, a continued study or a second sweep on the same storage new ones
    (a sampler seeded once a process would draw the first trials again)."""
    trial = study.ask()
    if seed is not None:
        study.sampler = optuna.samplers.TPESampler(
            seed=int(np.random.SeedSequence([seed, trial.number]).generate_state(1)[0])
        )
    for key, distribution in distributions.items():
        _suggest(trial, key, distribution)
    return trial


def _suggest(trial: optuna.Trial, key: str, distribution: BaseDistribution):
    if isinstance(distribution, CategoricalDistribution):
        return trial.suggest_categorical(key, distribution.choices)
    suggest = trial.suggest_int if isinstance(distribution, IntDistribution) else trial.suggest_float
    return suggest(key, distribution.low, distribution.high, step=distribution.step, log=distribution.log)


def checked_params(trial, search: Space) -> dict:
    """A trial's values, where each is a key of the search space with a value of its distribution: a stored study
    is received data, and its trials become overrides (a key of its own, or a value outside the space, could name
    a function for Hydra to call). Anything else is refused in one line."""
    params = trial.params
    if set(params) != set(search.distributions):
        odd = sorted(set(params) ^ set(search.distributions))
        raise ConfigError(
            f"trial {trial.number} of the stored study is refused: its keys differ from the search space's "
            f"({', '.join(map(repr, odd))[:200]}); only the space's keys come back from a storage"
        )
    for key, value in params.items():
        if not _contains(search.distributions[key], value):
            raise ConfigError(
                f"trial {trial.number} of the stored study is refused: {key}={value!r}"[:300]
                + f" is not a value of its distribution ({search.distributions[key]})"
            )
    return params


def _contains(distribution: BaseDistribution, value) -> bool:
    if isinstance(distribution, CategoricalDistribution):
        return any(type(value) is type(choice) and value == choice for choice in distribution.choices)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    if isinstance(distribution, IntDistribution):
        return (
            isinstance(value, int)
            and distribution.low <= value <= distribution.high
            and ((value - distribution.low) % distribution.step == 0)
        )
    return distribution.low <= value <= distribution.high


@dataclass
class Trials:
    """The study's trials as jobs: asked n_jobs at a time, each batch launched as jobs numbered as its trials
    (trials another process asked in between: one launch each), each told its job's objective."""

    study: optuna.Study
    search: Space
    objective: str  # sweep.objective: what each job returns
    storage: str | None
    pruner: str
    seed: int | None  # TPE's, with each trial's number

    def run(self, launch, n_trials: int, n_jobs: int, resume: bool) -> list:
        """Until the study holds n_trials trials; with resume, the trials a killed sweep left running first, each
        in its own directory with sweep.resume=true (its job continues from its last.ckpt)."""
        returns = []
        if resume:
            running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            returns += [self._launch(launch, [t], "sweep.resume=true") for t in running]
        while len(self.study.trials) < n_trials:
            asks = min(n_jobs, n_trials - len(self.study.trials))
            batch = [ask(self.study, self.search.distributions, self.seed) for _ in range(asks)]
            if [t.number for t in batch] == list(range(batch[0].number, batch[0].number + len(batch))):
                returns.append(self._launch(launch, batch))
            else:
                returns += [self._launch(launch, [t]) for t in batch]
        return returns

    def _launch(self, launch, trials: list, *more: str) -> list:
        """Consecutive trials as jobs numbered as they are; each told its job's objective and said."""
        jobs = [self._overrides(trial) + list(more) for trial in trials]
        done = launch(jobs, initial_job_idx=trials[0].number)
        for trial, ret in zip(trials, done, strict=True):
            tell(self.study, trial.number, float(ret.return_value))
            log.info(said(self.study, trial.number, self.objective))
        return done

    def _overrides(self, trial) -> list[str]:
        """A trial's job: the fixed overrides, the trial's values (choices as the override wrote them, numbers as
        sampled), and its pruning callback where the study prunes."""
        values = checked_params(trial, self.search)
        jobs = [*self.search.fixed, *(f"{key}={value}" for key, value in values.items())]
        if self.pruner != "none":
            jobs.append(pruning(self.study, self.storage, self.pruner, trial, self.objective))
        return jobs


def tell(study: optuna.Study, number: int, value: float) -> None:
    """A trial's end: its job's objective, or failed where that is not a number (a failed run). A trial that its
    job pruned is told already."""
    if study.get_trials(deepcopy=False)[number].state != TrialState.RUNNING:
        return
    if math.isfinite(value):
        study.tell(number, value)
    else:
        study.tell(number, state=TrialState.FAIL)


def said(study: optuna.Study, number: int, objective: str) -> str:
    """One line on a trial that ended, and the best so far."""
    trial = study.get_trials(deepcopy=False)[number]
    what = f"{objective} {trial.value:.4f}" if trial.state == TrialState.COMPLETE else trial.state.name.lower()
    if trial.state == TrialState.PRUNED and trial.intermediate_values:
        what += f" after epoch {max(trial.intermediate_values)}"
    done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    best = f"; best so far {study.best_value:.4f} (trial {study.best_trial.number})" if done else ""
    return f"search: trial {trial.number}: {what}{best}"


def write_results(path: Path, study: optuna.Study, objective: str) -> None:
    """optimization_results.yaml, whole or not at all."""
    write_text_atomic(path, OmegaConf.to_yaml(OmegaConf.create(results(study, objective))))


def results(study: optuna.Study, objective: str) -> dict:
    """optimization_results.yaml: the best trial and every trial's state, value and values searched."""
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    best = {"best_params": study.best_params, "best_value": study.best_value} if done else {}
    trials = [
        {"number": t.number, "state": t.state.name.lower(), objective: t.value, "params": t.params}
        for t in study.trials
    ]
    return {"name": "headlab-search", "study": study.study_name, "direction": study.direction.name.lower(),
            **best, "trials": trials}  # fmt: skip


def pruning(study: optuna.Study, storage: str, pruner: str, trial, objective: str) -> str:
    """The override that gives a trial's job its pruning callback (headlab.training.pruning.TrialPruning), which
    reports each epoch's value of what the objective is the best of (val/acc for val/acc_best)."""
    monitor = objective.removesuffix("_best")
    settings = {
        "_target_": "headlab.training.pruning.TrialPruning",
        "storage": storage,
        "study_name": study.study_name,
        "trial_id": trial._trial_id,
        "trial": trial.number,
        "pruner": pruner,
        "monitor": monitor,
    }  # fmt: skip  (Optuna has no public way to a trial's id from its number in another process)
    return "+callbacks.pruning={" + ",".join(f"{k}:{_value(v)}" for k, v in settings.items()) + "}"


def _value(value) -> str:
    """A value as a Hydra override writes it: quoted unless it is a plain name or number."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    text = str(value)
    return text if re.fullmatch(r"[\w.+-]+", text) else "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
