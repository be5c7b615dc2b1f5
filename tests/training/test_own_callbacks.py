"""A run with a callback of its own trains as every run of headlab-train does, as a pack of one, and its callback
sees what it would see in a single run's Trainer: the model's weights and gradients, the run's metrics and loggers,
its own logging, and its state kept in the run's checkpoints across a kill."""

import csv
import json
import signal

import pytest
import torch

from conftest import TESTS, TINY, cli_env, headlab_train, train_here

pytestmark = pytest.mark.e2e
ENV = cli_env() | {"PYTHONPATH": str(TESTS)}  # own_callback.py and faults.py importable by the CLI
RUN = [*TINY, "logger=csv", "+trainer.precision=64-true", "trainer.max_epochs=3", "callbacks.attention=null"]
RUN.append("trainer.log_every_n_steps=1")


def test_a_callback_of_the_runs_own_sees_the_run_and_keeps_its_state_across_a_kill(tmp_path):
    watched = tmp_path / "watched.json"
    watch = ["+callbacks.watch._target_=own_callback.Watch", f"+callbacks.watch.out={watched}"]
    watch.append("+callbacks.lr._target_=lightning.pytorch.callbacks.LearningRateMonitor")  # one of Lightning's
    kill = ["+callbacks.fault._target_=faults.SignalAt", "+callbacks.fault.moment=train_batch"]
    kill += ["+callbacks.fault.epoch=2", "+callbacks.fault.batch=1", f"+callbacks.fault.signum={int(signal.SIGKILL)}"]
    kill.append(f"+callbacks.fault.once_file={tmp_path / 'killed'}")
    killed = headlab_train(*RUN, *watch, *kill, "hydra.run.dir=run", cwd=tmp_path, env=ENV)
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
