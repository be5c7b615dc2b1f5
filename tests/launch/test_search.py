"""hydra/sweeper=search: an Optuna study whose trials are the sweep's jobs, on today's optuna (TPE seeded, SQLite
storage that continues, a median pruner, a killed sweep's running trials finished with sweep.resume=true)."""

import json
from pathlib import Path

import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from conftest import PACKED, TINY

optuna = pytest.importorskip("optuna")

from headlab.launch import search  # noqa: E402  (optuna first: it is an extra)

QUICK = [*TINY, "trainer.max_epochs=1", "callbacks.attention=null", "logger=csv"]
SPACE = ["model.attention.n_heads=choice(1,2,4)", "optim.lr=tag(log, interval(1e-3, 3e-2))"]
NO_DEFAULT_SPACE = "hydra.sweeper.params=null"  # the tests' own space only


def record(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def test_the_space_is_hydras_grammar_as_optuna_distributions():
    overrides = OverridesParser.create().parse_overrides(
        ["a=choice(1,2,x)", "b=range(1,9,2)", "c=tag(log,interval(1e-4,1e-2))", "d=tag(int,interval(2,8))", "e=3",
         "f=range(0.5,2,0.5)"]
    )  # fmt: skip
    space = search.space(overrides)
    assert space.fixed == ["e=3"]
    d = space.distributions
    assert d["a"] == optuna.distributions.CategoricalDistribution(["1", "2", "x"])
    assert d["b"] == optuna.distributions.IntDistribution(1, 7, step=2)  # range's stop is excluded
    assert d["c"] == optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)
    assert d["d"] == optuna.distributions.IntDistribution(2, 8)
    assert d["f"] == optuna.distributions.FloatDistribution(0.5, 1.5, step=0.5)


def test_the_same_seed_samples_the_same_trials():
    space = search.space(OverridesParser.create().parse_overrides(SPACE))
    asked = []
    for _ in range(2):
        study = search.open_study("s", None, "maximize", pruner="none")
        asked.append([search.ask(study, space.distributions, seed=7).params for _ in range(4)])
    other = search.open_study("s", None, "maximize", pruner="none")
    assert asked[0] == asked[1] != [search.ask(other, space.distributions, seed=8).params for _ in range(4)]


def test_a_continued_study_and_a_second_sweep_on_its_storage_draw_new_trials(tmp_path):
    """The sampler is seeded with the seed and each trial's number: a study continued by a new process (the same
    command with a larger n_trials) and two sweeps asking of one storage at once never repeat each other's draws."""
    space = search.space(OverridesParser.create().parse_overrides(["optim.lr=tag(log, interval(1e-4, 1e-1))"]))
    storage = f"sqlite:///{tmp_path}/optuna.db"
    first = [search.ask(search.open_study("s", storage, "maximize", "none"), space.distributions, 0) for _ in "ab"]
    for trial in first:  # told, as their jobs would have been
        search.open_study("s", storage, "maximize", "none").tell(trial.number, 0.5)
    continued = search.open_study("s", storage, "maximize", "none")  # a new process: the same seed
    later = [search.ask(continued, space.distributions, 0).params["optim.lr"] for _ in "ab"]
    one, two = (search.open_study("s", storage, "maximize", "none") for _ in "12")  # two sweeps at once
    side_by_side = [search.ask(study, space.distributions, 0).params["optim.lr"] for study in (one, two)]
    drawn = [t.params["optim.lr"] for t in first] + later + side_by_side
    assert len(set(drawn)) == 6, drawn


@pytest.mark.e2e
def test_a_stored_study_is_continued_to_n_trials_each_trial_in_its_job_directory(run_cli, tmp_path):
    args = ["-m", *QUICK, "hydra/sweeper=search", NO_DEFAULT_SPACE, *SPACE, "hydra.sweep.dir=sweep",
            "hydra.sweeper.storage=sqlite:///optuna.db"]  # fmt: skip
    assert run_cli(*args, "hydra.sweeper.n_trials=2").returncode == 0
    sweep = tmp_path / "sweep"
    first = {j: (sweep / j / "results.json").stat().st_mtime_ns for j in "01"}
    done = run_cli(*args, "hydra.sweeper.n_trials=3")  # the same command, a larger budget: one trial more
    assert done.returncode == 0, done.stderr[-2000:]
    assert {j: (sweep / j / "results.json").stat().st_mtime_ns for j in "01"} == first  # earlier trials kept
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    objectives = [record(sweep / str(j))["metrics"]["val/acc_best"] for j in range(3)]
    assert [t["number"] for t in results["trials"]] == [0, 1, 2] and {t["state"] for t in results["trials"]} == {
        "complete"
    }
    assert [t["val/acc_best"] for t in results["trials"]] == pytest.approx(objectives)
    assert results["best_value"] == pytest.approx(max(objectives))
    for trial in results["trials"]:  # each trial's values are its job's configuration
        config = record(sweep / str(trial["number"]))["config"]
        assert str(config["model.attention.n_heads"]) == trial["params"]["model.attention.n_heads"]
        assert config["optim.lr"] == pytest.approx(trial["params"]["optim.lr"])
    assert "search: trial 2: val/acc_best " in done.stdout + done.stderr
    again = run_cli(*args, "hydra.sweeper.n_trials=3")  # the study holds its 3 trials: nothing more trains
    assert again.returncode == 0 and not (sweep / "3").exists()


@pytest.mark.e2e
def test_a_trial_a_killed_sweep_left_running_is_finished_in_its_directory_on_resume(run_cli, tmp_path):
    space = search.space(OverridesParser.create().parse_overrides(SPACE))
    study = search.open_study("headlab", f"sqlite:///{tmp_path}/optuna.db", "maximize", pruner="none")
    left = study.ask(space.distributions)  # asked, launched, never told: the sweep was killed
    args = ["-m", *QUICK, "hydra/sweeper=search", NO_DEFAULT_SPACE, *SPACE, "hydra.sweep.dir=sweep",
            "hydra.sweeper.storage=sqlite:///optuna.db", "hydra.sweeper.n_trials=2", "sweep.resume=true"]  # fmt: skip
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr[-2000:]
    trials = optuna.load_study(study_name="headlab", storage=f"sqlite:///{tmp_path}/optuna.db").trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    resumed = record(tmp_path / "sweep" / "0")
    assert resumed["config"]["optim.lr"] == pytest.approx(left.params["optim.lr"])
    assert trials[0].value == pytest.approx(resumed["metrics"]["val/acc_best"])


@pytest.mark.e2e
def test_a_trial_behind_the_median_is_pruned_and_its_run_stops_there(run_cli, tmp_path):
    """Five earlier trials reached 1.0 at every epoch: the median pruner stops the new trial after its second epoch
    (the first is never pruned), and the study records it as pruned."""
    storage = f"sqlite:///{tmp_path}/optuna.db"
    space = search.space(OverridesParser.create().parse_overrides(SPACE))
    study = search.open_study("headlab", storage, "maximize", pruner="median")
    for lr in (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2):
        study.add_trial(
            optuna.trial.create_trial(
                params={"model.attention.n_heads": "2", "optim.lr": lr}, distributions=space.distributions, value=1.0,
                intermediate_values={epoch: 1.0 for epoch in range(4)},
            )
        )  # fmt: skip
    args = ["-m", *QUICK, "trainer.max_epochs=4", "hydra/sweeper=search", NO_DEFAULT_SPACE, *SPACE,
            "hydra.sweep.dir=sweep", "hydra.sweeper.storage=sqlite:///optuna.db", "hydra.sweeper.n_trials=6",
            "hydra.sweeper.pruner=median"]  # fmt: skip
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr[-2000:]
    trial = optuna.load_study(study_name="headlab", storage=storage).trials[5]
    assert trial.state.name == "PRUNED" and sorted(trial.intermediate_values) == [0, 1]
    run = record(tmp_path / "sweep" / "5")
    assert run["status"] == "completed" and run["config"]["callbacks.pruning.trial"] == 5
    assert run["epochs"] == 2 and [point["epoch"] for point in run["curve"]] == [0, 1]  # of 4
    assert "search: trial 5 pruned after epoch 1 (val/acc " in done.stdout + done.stderr
    results = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    assert results["trials"][5]["state"] == "pruned"


@pytest.mark.parametrize(
    "overrides, said",
    [
        (["hydra.sweeper.pruner=median"],
         "hydra.sweeper.pruner='median' is invalid without a storage the jobs share (hydra.sweeper.storage=null)"),
        (["hydra.sweeper.pruner=median", "hydra.sweeper.storage=sqlite://"],
         "hydra.sweeper.pruner='median' is invalid without a storage the jobs share "
         "(hydra.sweeper.storage='sqlite://')"),
        (["hydra.sweeper.storage='postgresql://u@localhost/db'"],
         "hydra.sweeper.storage='postgresql://u@localhost/db' cannot be opened: its database driver is not "
         "installed (No module named 'psycopg"),
        (["hydra.sweeper.storage='mysql://u@localhost/db'"],
         "hydra.sweeper.storage='mysql://u@localhost/db' cannot be opened: its database driver is not installed "
         "(No module named 'MySQLdb"),
        (["sweep.objective=val/acc_bset"], "sweep.objective='val/acc_bset' is invalid: expected a metric of every "),
        (["hydra.sweeper.pruner=hyper", "hydra.sweeper.storage=sqlite:///s.db"],
         "hydra.sweeper.pruner='hyper' is invalid: expected one of none, median"),
        (["hydra.sweeper.direction=up"], "hydra.sweeper.direction='up' is invalid: expected maximize or minimize"),
        (["hydra.sweeper.n_trials=0"], "hydra.sweeper.n_trials=0 is invalid: expected an int >= 1"),
        ([*PACKED, "hydra.sweeper.pruner=median", "hydra.sweeper.storage=sqlite:///s.db"],
         "hydra.sweeper.pruner='median' is invalid: expected none with a packed launcher"),
        (["optim.lr=tag(log, interval(0, 1e-2))"], "hydra.sweeper.params.optim.lr: "),
    ],
)  # fmt: skip
def test_a_search_that_cannot_run_is_one_line_before_any_trial(run_cli, tmp_path, overrides, said):
    done = run_cli("-m", *QUICK, "hydra/sweeper=search", "hydra.sweep.dir=sweep", *overrides)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert said in done.stderr.strip().splitlines()[-1], done.stderr[-2000:]
    assert not list(tmp_path.glob("sweep/*/results.json"))


def hostile_running_trial(storage: str, params: dict, distributions: dict) -> None:
    """A received study that holds a trial left running with these values, as a hostile sender would write it."""
    study = optuna.create_study(study_name="headlab", storage=storage, direction="maximize", load_if_exists=True)
    trial_id = study.ask()._trial_id  # its values set by the storage directly
    for key, value in params.items():
        study._storage.set_trial_param(trial_id, key, distributions[key].to_internal_repr(value), distributions[key])


@pytest.mark.parametrize(
    "params, said",
    [
        ({"+callbacks.x._target_": "builtins.open", "model.attention.n_heads": "2", "optim.lr": 3e-3},
         "its keys differ from the search space's ('+callbacks.x._target_')"),
        ({"model.attention.n_heads": "2,+callbacks.x._target_=builtins.open", "optim.lr": 3e-3},
         "model.attention.n_heads='2,+callbacks.x._target_=builtins.open' is not a value of its distribution"),
        ({"model.attention.n_heads": "2", "optim.lr": 5.0}, "optim.lr=5.0 is not a value of its distribution"),
    ],
)  # fmt: skip
def test_a_received_study_gives_back_only_values_of_the_search_space(run_cli, tmp_path, params, said):
    """A running trial of a received storage becomes overrides on resume: a key outside the space (a callback
    whose _target_ opens a file for writing) or a value outside a key's distribution is refused in one line, and
    nothing runs."""
    victim = tmp_path / "precious.txt"
    victim.write_text("kept")
    space = search.space(OverridesParser.create().parse_overrides(SPACE)).distributions
    distributions = {
        key: space.get(key, optuna.distributions.CategoricalDistribution([v])) for key, v in params.items()
    }
    distributions["model.attention.n_heads"] = optuna.distributions.CategoricalDistribution(
        sorted({"1", "2", "4", params["model.attention.n_heads"]})
    )  # the sender's own distributions
    distributions["optim.lr"] = optuna.distributions.FloatDistribution(1e-3, 10.0)
    hostile_running_trial(f"sqlite:///{tmp_path}/optuna.db", params, distributions)
    args = ["-m", *QUICK, "hydra/sweeper=search", NO_DEFAULT_SPACE, *SPACE, "hydra.sweep.dir=sweep",
            "hydra.sweeper.storage=sqlite:///optuna.db", "hydra.sweeper.n_trials=3", "sweep.resume=true",
            f"+callbacks.x._args_=['{victim}','w']"]  # fmt: skip
    done = run_cli(*args)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert said in done.stderr.strip().splitlines()[-1], done.stderr[-2000:]
    assert victim.read_text() == "kept" and not list(tmp_path.glob("sweep/*/results.json"))


@pytest.mark.parametrize(
    "again, said",
    [
        (["hydra.sweeper.direction=minimize", "sweep.objective=test/loss"],
         "hydra.sweeper.direction='minimize' is invalid: the stored study 'headlab' maximises val/acc_best"),
        (["sweep.objective=test/acc"],
         "sweep.objective='test/acc' is invalid: the stored study 'headlab' maximises val/acc_best"),
    ],
)  # fmt: skip
def test_a_stored_study_continues_only_under_its_direction_and_objective(run_cli, tmp_path, again, said):
    storage = f"sqlite:///{tmp_path}/optuna.db"
    search.open_study("headlab", storage, "maximize", "none", "val/acc_best")  # as a first sweep left it
    done = run_cli("-m", *QUICK, "hydra/sweeper=search", "hydra.sweep.dir=sweep",
                   "hydra.sweeper.storage=sqlite:///optuna.db", *again)  # fmt: skip
    assert done.returncode == 2 and said in done.stderr.strip().splitlines()[-1], done.stderr[-2000:]
    assert not list(tmp_path.glob("sweep/*/results.json"))
    assert optuna.load_study(study_name="headlab", storage=storage).trials == []


def test_a_dry_run_of_a_search_prices_its_trials_and_asks_stores_and_trains_nothing(run_cli, tmp_path):
    done = run_cli("--dry-run", *QUICK, "hydra/sweeper=search", NO_DEFAULT_SPACE, *SPACE,
                   "hydra.sweeper.n_trials=3", "hydra.sweeper.storage=sqlite:///optuna.db")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    said = done.stdout + done.stderr
    assert "search: 3 trial(s) to ask of study 'headlab', 1 at a time; priced at model.attention.n_heads=1 " in said
    assert "headlab-train --dry-run: 3 trials; nothing is started" in said
    assert " on this machine (" in said
    assert not (tmp_path / "optuna.db").exists() and not list(tmp_path.rglob("results.json"))


def test_the_search_without_optuna_is_one_line_that_names_the_extra(tmp_path):
    """A process where optuna cannot be imported (the extra not installed): one line naming what to install."""
    from conftest import cli_env, headlab_train

    blocked = tmp_path / "blocked" / "optuna"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'optuna\'", name="optuna")\n')
    env = cli_env() | {"PYTHONPATH": str(blocked.parent)}
    done = headlab_train("-m", *QUICK, "hydra/sweeper=search", cwd=tmp_path, env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "headlab-train: invalid config: hydra/sweeper=search needs Optuna (No module named 'optuna'): "
        "pip install 'headlab[optuna]'"
    )
