"""A run with a callback of its own trains as every run of headlab-train does, as a pack of one, and its callback
sees what it would see in a single run's Trainer: the model's weights and gradients, the run's metrics and loggers,
its own logging, and its state kept in the run's checkpoints across a kill."""

import csv
import json
import signal

import pytest
import torch

from conftest import TESTS, TINY, cli_env, cli_here, headlab_train, train_here

pytestmark = pytest.mark.e2e
ENV = cli_env() | {"PYTHONPATH": str(TESTS)}  # own_callback.py and faults.py importable by the CLI
RUN = [*TINY, "logger=csv", "+trainer.precision=64-true", "trainer.max_epochs=3", "callbacks.attention=null"]
RUN.append("trainer.log_every_n_steps=1")


def kill_in_third_epoch(tmp_path) -> list[str]:
    """A SIGKILL at the second step of the third epoch, once (faults.SignalAt)."""
    kill = ["+callbacks.fault._target_=faults.SignalAt", "+callbacks.fault.moment=train_batch"]
    kill += ["+callbacks.fault.epoch=2", "+callbacks.fault.batch=1", f"+callbacks.fault.signum={int(signal.SIGKILL)}"]
    return [*kill, f"+callbacks.fault.once_file={tmp_path / 'killed'}"]


def test_a_callback_of_the_runs_own_sees_the_run_and_keeps_its_state_across_a_kill(tmp_path):
    watched = tmp_path / "watched.json"
    watch = ["+callbacks.watch._target_=own_callback.Watch", f"+callbacks.watch.out={watched}"]
    watch.append("+callbacks.lr._target_=lightning.pytorch.callbacks.LearningRateMonitor")  # one of Lightning's
    killed = headlab_train(*RUN, *watch, *kill_in_third_epoch(tmp_path), "hydra.run.dir=run", cwd=tmp_path, env=ENV)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    trusted = ["callbacks.watch._target_=own_callback.Watch", "callbacks.fault._target_=faults.SignalAt"]
    trusted.append("callbacks.lr._target_=lightning.pytorch.callbacks.LearningRateMonitor")  # named again too
    resumed = train_here("resume=run", *trusted, cwd=tmp_path, env=ENV)
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    run = tmp_path / "run"
    record = json.loads((run / "results.json").read_text())
    assert record["status"] == "completed" and record["epochs"] == 3 and "pack" not in record
    seen = json.loads(watched.read_text())
    assert seen["loggers"] == ["CSVLogger"]  # the run's loggers are its Trainer's
    # every validation, the two before the kill kept in the checkpoint, with the run's own metrics at that moment
    assert [(s["epoch"], s["step"]) for s in seen["seen"]] == [(p["epoch"], p["step"]) for p in record["curve"]]
    for at, point in zip(seen["seen"], record["curve"], strict=True):
        assert (at["val/acc"], at["val/loss"]) == (point["val/acc"], point["val/loss"])
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    trained = float(last["state_dict"]["model.tok_emb.weight"].norm())
    assert seen["seen"][-1]["norm"] == pytest.approx(trained, rel=1e-12)  # the weights that train, not a copy
    assert seen["first_gradient"] > 0 and last["callbacks"]["Watch"]["seen"] == seen["seen"]
    with open(run / "metrics.csv", newline="") as f:  # what they logged, in the run's metrics.csv
        rows = list(csv.DictReader(f))
    logged = [float(r["own/embedding_norm"]) for r in rows if r.get("own/embedding_norm")]  # each value once
    assert logged == pytest.approx([s["norm"] for s in seen["seen"]], rel=1e-7)  # Lightning logs a float as float32
    # LearningRateMonitor reads the optimizer's learning rate where torch's optimizers hold it: the run's schedule
    scheduled = {int(r["step"]): float(r["train/lr"]) for r in rows if r.get("train/lr")}
    monitored = [(int(r["step"]), float(r["lr-PackedAdamW"])) for r in rows if r.get("lr-PackedAdamW")]
    assert {step for step, _ in monitored} == set(scheduled)  # every step, 24
    assert all(lr == pytest.approx(scheduled[step], rel=1e-7) for step, lr in monitored)


def test_lightnings_weight_averaging_puts_the_average_in_a_runs_checkpoints_and_resumes_like_its_twin(tmp_path):
    """EMAWeightAveraging, as in a single run: each checkpoint holds the average (the trained weights beside it, as
    current_model_state), so the test and headlab-eval evaluate the average; killed and resumed, the run ends as its
    twin left alone (float64)."""
    ema = "+callbacks.ema._target_=lightning.pytorch.callbacks.EMAWeightAveraging"
    twin = train_here(*RUN, ema, "hydra.run.dir=twin", cwd=tmp_path, env=ENV)
    assert twin.returncode == 0, twin.stderr[-2000:]
    killed = headlab_train(*RUN, ema, *kill_in_third_epoch(tmp_path), "hydra.run.dir=run", cwd=tmp_path, env=ENV)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    trusted = ["callbacks.ema._target_=lightning.pytorch.callbacks.EMAWeightAveraging"]
    resumed = train_here("resume=run", *trusted, "callbacks.fault._target_=faults.SignalAt", cwd=tmp_path, env=ENV)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    got, expected = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("run", "twin"))
    assert got["global_step"] == expected["global_step"] == 24
    held_out = {k: v for k, v in got["metrics"].items() if not k.startswith("train/")}  # a resumed epoch's train
    assert held_out == pytest.approx({k: expected["metrics"][k] for k in held_out}, rel=1e-7)  # means: its steps'
    best = torch.load(got["checkpoints"]["best"], weights_only=True)
    trained = best["current_model_state"]["stack.flat"][0]  # the pack of one's row: the trained weights, flat
    averaged = torch.cat([t.reshape(-1).double() for t in best["state_dict"].values()])  # Lightning averages in float32
    assert averaged.shape == trained.shape and not torch.allclose(averaged, trained)
    evaluated = cli_here("eval", str(tmp_path / "run"), cwd=tmp_path)  # the best checkpoint's state_dict alone
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert f"test/acc\t{got['metrics']['test/acc']:.4f}" in evaluated.stdout
