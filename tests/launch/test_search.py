"""hydra/sweeper=search: an Optuna study whose trials are the sweep's jobs, on today's optuna (TPE seeded, SQLite
storage that continues, a median pruner, a killed sweep's running trials finished with sweep.resume=true)."""

import json
from pathlib import Path

import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from conftest import TINY

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
        study = search.open_study("s", None, "maximize", seed=7, pruner="none")
        asked.append([study.ask(space.distributions).params for _ in range(4)])
    other = search.open_study("s", None, "maximize", seed=8, pruner="none")
    assert asked[0] == asked[1] != [other.ask(space.distributions).params for _ in range(4)]


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
    study = search.open_study("headlab", f"sqlite:///{tmp_path}/optuna.db", "maximize", seed=0, pruner="none")
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
    study = search.open_study("headlab", storage, "maximize", seed=0, pruner="median")
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
        (["hydra.sweeper.pruner=median"], "hydra.sweeper.pruner='median' is invalid without hydra.sweeper.storage"),
        (["hydra.sweeper.pruner=hyper", "hydra.sweeper.storage=sqlite:///s.db"],
         "hydra.sweeper.pruner='hyper' is invalid: expected one of none, median"),
        (["hydra.sweeper.direction=up"], "hydra.sweeper.direction='up' is invalid: expected maximize or minimize"),
        (["hydra.sweeper.n_trials=0"], "hydra.sweeper.n_trials=0 is invalid: expected an int >= 1"),
        (["hydra/launcher=packed", "hydra.sweeper.pruner=median", "hydra.sweeper.storage=sqlite:///s.db"],
         "hydra.sweeper.pruner='median' is invalid: expected none with a packed launcher"),
        (["optim.lr=tag(log, interval(0, 1e-2))"], "hydra.sweeper.params.optim.lr: "),
    ],
)  # fmt: skip
def test_a_search_that_cannot_run_is_one_line_before_any_trial(run_cli, tmp_path, overrides, said):
    done = run_cli("-m", *QUICK, "hydra/sweeper=search", "hydra.sweep.dir=sweep", *overrides)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert said in done.stderr.strip().splitlines()[-1], done.stderr[-2000:]
    assert not list(tmp_path.glob("sweep/*/results.json"))
