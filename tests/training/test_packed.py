"""Packed sweeps through the real CLI: every member is a run, trains like its single run, and survives faults."""

import contextlib
import csv
import json
import math
import os
import signal
import subprocess
import sys
import tarfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from conftest import (
    PACKED,
    TESTS,
    TINY,
    as_interrupted,
    cli_env,
    cli_here,
    headlab_train,
    session_processes,
    train_here,
)
from headlab.config import memory
from headlab.errors import ConfigError
from headlab.launch import plan
from headlab.launch.plan import pack_key
from headlab.launch.workers import gpu_for_slot
from headlab.training import signals_held
from headlab.training.cores import usable_cores
from lightning_reference import lightning_run

pytestmark = pytest.mark.e2e
FLOAT64 = [*TINY, "logger=csv", "+trainer.precision=64-true", "trainer.log_every_n_steps=1"]
DROPOUT = ["model.dropout=0.1", "model.attention.dropout=0.1"]  # each member draws from its own stream


def records(sweep) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(sweep.glob("*/results.json"), key=lambda p: int(p.parent.name))]


def step_losses(run_dir) -> list[float]:
    with (run_dir / "metrics.csv").open() as f:
        return [float(row["train/loss_step"]) for row in csv.DictReader(f) if row.get("train/loss_step")]


def test_pack_key_ignores_what_members_may_differ_in():
    base = {"seed": 0, "optim.lr": 1e-3, "model.attention.n_heads": 4, "logger.csv.save_dir": "/a"}
    assert pack_key(base) == pack_key({**base, "seed": 5, "optim.lr": 1e-2, "logger.csv.save_dir": "/b"})
    assert pack_key(base) != pack_key({**base, "model.attention.n_heads": 2})


def test_a_packed_member_trains_step_for_step_like_its_single_run(run_cli, tmp_path):
    """float64 on the CPU, dropout 0.1: the member with seed 1 and lr 1e-2 of a 2 x 2 pack against that job trained
    on Lightning's own loop (lightning_reference: it draws its dropout masks from its own stream, as the member
    does), and so does headlab-train's run of it (a pack of one). The losses agree to rounding (1e-15 at the first
    step; AdamW's different order of rounding grows to ~1e-9 over 16 steps of this size). Then the member is its
    run of headlab-train: the same record, curve, head analysis and checkpoints."""
    sweep = tmp_path / "sweep"
    packed = run_cli("-m", *PACKED, "seed=0,1", "optim.lr=3e-3,1e-2", *FLOAT64, *DROPOUT, f"hydra.sweep.dir={sweep}")
    assert packed.returncode == 0, packed.stderr[-3000:]
    reference = lightning_run(["seed=1", "optim.lr=1e-2", *FLOAT64, *DROPOUT], tmp_path / "alone")
    one = run_cli("seed=1", "optim.lr=1e-2", *FLOAT64, *DROPOUT, "hydra.run.dir=one")
    assert one.returncode == 0, one.stderr[-3000:]
    solo, lightning = step_losses(tmp_path / "one"), step_losses(tmp_path / "alone")
    assert len(solo) == 16 and max(abs(a - b) for a, b in zip(solo, lightning, strict=True)) < 1e-7

    runs = records(sweep)
    assert [r["status"] for r in runs] == ["completed"] * 4
    assert [r["pack"]["compute"] for r in runs] == ["each"] * 4  # pack.compute=auto with dropout: each, untimed
    assert not any("compute_step_s" in r["pack"] for r in runs)
    assert {r["pack"]["id"] for r in runs} == {f"{sweep.name}-pack0"} and [r["pack"]["index"] for r in runs] == [
        0,
        1,
        2,
        3,
    ]
    member = next(i for i, r in enumerate(runs) if r["seed"] == 1 and r["config"]["optim.lr"] == 1e-2)
    ours, theirs = step_losses(sweep / str(member)), step_losses(tmp_path / "alone")
    assert len(ours) == len(theirs) == 16
    assert abs(ours[0] - theirs[0]) < 1e-12
    assert max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) < 1e-7
    for key in ("val/acc_best", "test/acc", "test/loss"):
        assert runs[member]["metrics"][key] == pytest.approx(reference["metrics"][key], abs=1e-7), key
    single = json.loads((tmp_path / "one" / "results.json").read_text())
    for key in ("val/acc_best", "test/acc", "train/acc", "train/loss_epoch"):
        assert runs[member]["metrics"][key] == pytest.approx(single["metrics"][key], abs=1e-9)
    assert set(single) - set(runs[member]) == set()  # the single run's schema, plus "pack"
    assert [(p["epoch"], p["step"], p["tokens"]) for p in runs[member]["curve"]] == [
        (p["epoch"], p["step"], p["tokens"]) for p in single["curve"]
    ]
    for ours_point, theirs_point in zip(runs[member]["curve"], single["curve"], strict=True):
        assert ours_point["val/acc"] == pytest.approx(theirs_point["val/acc"], abs=1e-9)
    assert single["curve"][-1]["val/acc"] == pytest.approx(single["metrics"]["val/acc"])

    # its head analysis (measured for all members at once) is its single run's
    ours_heads, theirs_heads = (
        json.loads((d / "heads.json").read_text()) for d in (sweep / str(member), tmp_path / "one")
    )
    assert [r["importance"] for r in ours_heads["rows"]] == pytest.approx(
        [r["importance"] for r in theirs_heads["rows"]], abs=1e-9
    )
    for order in ("importance", *theirs_heads["pruning_baselines"]):
        ours_curve, theirs_curve = (
            h["pruning_curve"] if order == "importance" else h["pruning_baselines"][order]
            for h in (ours_heads, theirs_heads)
        )
        assert [p["pruned"] for p in ours_curve] == [p["pruned"] for p in theirs_curve]
        assert [p["metric"] for p in ours_curve] == pytest.approx([p["metric"] for p in theirs_curve], abs=1e-9)
    assert ours_heads["analysis_examples"] == theirs_heads["analysis_examples"]

    # each member is an ordinary run: its files, its checkpoint for headlab-heads, its last.ckpt for resume=
    run = sweep / str(member)
    assert (run / ".hydra" / "config.yaml").is_file() and (run / "heads.json").is_file()
    assert len(list((run / "checkpoints").glob("best-*.ckpt"))) == 1 and (run / "checkpoints" / "last.ckpt").is_file()
    ours_state, theirs_state = (
        torch.load(d / "checkpoints" / "last.ckpt", weights_only=True)["random_state"]["torch"]
        for d in (run, tmp_path / "one")
    )
    assert torch.equal(ours_state, theirs_state)  # its own dropout stream, where its single run's stands: resumable
    ours_design, theirs_design = (
        torch.load(d / "checkpoints" / "last.ckpt", weights_only=True)["hyper_parameters"]["design"]
        for d in (run, tmp_path / "one")
    )
    assert ours_design == theirs_design and ours_design["attention"]["n_heads"] == 4  # what a resume checks
    heads = cli_here("heads", str(run), cwd=tmp_path)
    assert heads.returncode == 0, heads.stderr[-2000:]
    # a member killed in its test (its record still "running") resumes as a single run: it tests its best again
    record = json.loads((run / "results.json").read_text())
    (run / "results.json").write_text(json.dumps({**record, "status": "running"}))
    resumed = run_cli("seed=1", "optim.lr=1e-2", *FLOAT64, *DROPOUT, f"resume={run}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = json.loads((run / "results.json").read_text())
    assert again["metrics"]["test/acc"] == pytest.approx(runs[member]["metrics"]["test/acc"], abs=1e-9)
    assert again["global_step"] == runs[member]["global_step"]
    assert [p["step"] for p in again["curve"]] == [p["step"] for p in runs[member]["curve"]]  # kept by the resume


@pytest.mark.parametrize("option", ["optim.sam_rho=0.05", "optim.rdrop=1.0"])
def test_a_two_pass_member_trains_step_for_step_like_its_single_run(run_cli, tmp_path, option):
    """With optim.sam_rho each member ascends along its own gradient, scaled by its own norm; with optim.rdrop each
    member's two passes draw its own dropout masks (float64, dropout): the member with seed 1 of a pack of two
    against that job alone, and a pack never mixes values."""
    sweep = tmp_path / "sweep"
    two_pass = [option, *FLOAT64, *DROPOUT]
    packed = run_cli("-m", *PACKED, "seed=0,1", *two_pass, f"hydra.sweep.dir={sweep}")
    assert packed.returncode == 0, packed.stderr[-3000:]
    alone = run_cli("seed=1", *two_pass, "hydra.run.dir=alone")
    assert alone.returncode == 0, alone.stderr[-3000:]
    plain = run_cli("seed=1", *FLOAT64, *DROPOUT, "hydra.run.dir=plain")
    assert plain.returncode == 0, plain.stderr[-3000:]
    ours, theirs, without = (step_losses(d) for d in (sweep / "1", tmp_path / "alone", tmp_path / "plain"))
    assert len(ours) == len(theirs) == 16
    assert max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) < 1e-7
    assert max(abs(a - b) for a, b in zip(theirs, without, strict=True)) > 1e-4  # the option changes training
    key, _, value = option.partition("=")
    base = {"seed": 0, key: 0.0}
    assert pack_key(base) != pack_key({**base, key: float(value)})


def test_early_stopping_stops_each_member_where_its_single_run_stops(run_cli, tmp_path):
    """callbacks=early_stopping in a pack: each member stops after its own validations stop improving, at the epoch
    and step where Lightning's own loop stops its run (lightning_reference), with the same numbers (float64) and the
    same metrics.csv; the pack ends when every member has stopped."""
    stopping = [o for o in FLOAT64 if o != "callbacks.progress_bar=null"]  # plain lines: output is not a terminal
    stopping += ["callbacks=early_stopping", "callbacks.early_stopping.patience=1", "trainer.max_epochs=30"]
    stopping.append("callbacks.attention=null")  # the head analysis, measured otherwise in a pack: test_pack_analysis
    packed = run_cli("-m", *PACKED, "seed=0,1,2", *stopping, "hydra.sweep.dir=sweep")
    assert packed.returncode == 0, packed.stderr[-3000:]
    members = records(tmp_path / "sweep")
    assert [m["pack"]["size"] for m in members] == [3] * 3
    said = [line.split("] ", 1)[1] for line in packed.stdout.splitlines() if "] pack sweep-pack0: " in line]
    validated = [line for line in said if " validated" in line]  # the last: where the last member stops
    assert len(validated) == max(m["epochs"] for m in members) and all("validated: val/acc " in v for v in validated)
    tested = [line for line in said if ": tested: " in line]  # every member, those stopped early too
    assert len(tested) == 1 and "test/acc " in tested[0] and " over 3)" in tested[0], tested
    for seed, member in enumerate(members):
        own = lightning_run([f"seed={seed}", *stopping], tmp_path / f"alone{seed}")
        assert (member["epochs"], member["global_step"]) == (own["epochs"], own["global_step"]) and own["epochs"] < 30
        assert member["metrics"] == pytest.approx(own["metrics"], rel=1e-9)
        rows, twin = csv_rows(tmp_path / "sweep" / str(seed)), csv_rows(tmp_path / f"alone{seed}")
        assert [(r.get("epoch"), r["step"], sorted(r)) for r in rows] == [
            (r.get("epoch"), r["step"], sorted(r)) for r in twin
        ]
        numbers = lambda rows: [float(v) for r in rows for k, v in sorted(r.items()) if k not in ("epoch", "step")]  # noqa: E731
        assert numbers(rows) == pytest.approx(numbers(twin), rel=1e-7)  # Lightning logs its lr in float32
    assert len({m["epochs"] for m in members}) > 1  # members stopped at different epochs: each its own decision


def test_a_run_with_two_early_stoppings_stops_where_the_first_to_say_so_stops_it(run_cli, tmp_path):
    """Two EarlyStopping callbacks (val/acc with patience 3, val/loss with patience 0): each decides on its own
    metric, and the run stops where the first says so, the epoch and step where Lightning's own loop stops it; the
    line says why."""
    stopping = [*FLOAT64, "callbacks=early_stopping", "callbacks.early_stopping.patience=3", "trainer.max_epochs=30"]
    stopping += ["callbacks.attention=null", "+callbacks.by_loss._target_=lightning.pytorch.callbacks.EarlyStopping"]
    stopping += ["+callbacks.by_loss.monitor=val/loss", "+callbacks.by_loss.mode=min", "+callbacks.by_loss.patience=0"]
    done = run_cli(*stopping, "hydra.run.dir=one")
    assert done.returncode == 0, done.stderr[-3000:]
    own = lightning_run(stopping, tmp_path / "alone")
    record = json.loads((tmp_path / "one" / "results.json").read_text())
    assert (record["epochs"], record["global_step"]) == (own["epochs"], own["global_step"]) and own["epochs"] < 30
    assert record["metrics"] == pytest.approx(own["metrics"], rel=1e-9)
    assert "early stopping after epoch" in done.stdout and "Monitored metric val/loss did not improve" in done.stdout


def test_members_computed_batched_train_like_their_single_runs_and_auto_keeps_the_faster_way(
    run_cli, tmp_path, monkeypatch
):
    """pack.compute=batched on the CPU, float64, no dropout: the members as one vmap computation (batched matmuls,
    the explicit attention) train step for step as their single runs (a pack of one, its model alone, the fused
    attention): the losses to rounding, its record says how it computed. pack.compute=auto times both ways (here
    when the launcher's estimate times the pack's step, before the pack starts; else on the pack's first batch),
    keeps the faster and says so, as each member's record shows; the same sweep again computes the same way (kept
    for this machine and these shapes), to the same numbers."""
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))  # no choice kept by another test
    batched = run_cli("-m", *PACKED, "seed=0,1", "pack.compute=batched", *FLOAT64, "hydra.sweep.dir=b")
    assert batched.returncode == 0, batched.stderr[-3000:]
    one = run_cli("seed=1", *FLOAT64, "hydra.run.dir=one")
    assert one.returncode == 0, one.stderr[-3000:]
    runs, single = records(tmp_path / "b"), json.loads((tmp_path / "one" / "results.json").read_text())
    assert [r["pack"]["compute"] for r in runs] == ["batched"] * 2 and "compute_step_s" not in runs[1]["pack"]
    ours, theirs = step_losses(tmp_path / "b" / "1"), step_losses(tmp_path / "one")
    assert len(ours) == len(theirs) == 16 and max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) < 1e-9
    for key in ("val/acc_best", "test/acc", "test/loss", "train/loss_epoch"):
        assert runs[1]["metrics"][key] == pytest.approx(single["metrics"][key], abs=1e-9), key

    auto = run_cli("-m", *PACKED, "seed=0,1", *FLOAT64, "hydra.sweep.dir=a")
    assert auto.returncode == 0, auto.stderr[-3000:]
    packs = [r["pack"] for r in records(tmp_path / "a")]
    seconds = packs[0]["compute_step_s"]
    assert set(seconds) == {"each", "batched"} and all(s > 0 for s in seconds.values())
    (kept,) = (tmp_path / "cache" / "pack_compute").glob("*.json")  # by the launcher's estimate, for the pack
    timed = json.loads(kept.read_text())["step_s"]  # unrounded: two ways a step apart by under a microsecond stay apart
    assert {way: round(s, 6) for way, s in timed.items()} == seconds
    assert packs[0]["compute"] == min(timed, key=timed.get) and packs[1] == {**packs[0], "index": 1}
    said = f"pack a-pack0: its 2 members compute {packs[0]['compute']} (as timed here before ({kept}): "
    assert said in auto.stdout + auto.stderr and packs[0]["compute_kept"] is True

    again = run_cli("-m", *PACKED, "seed=0,1", *FLOAT64, "hydra.sweep.dir=again")
    assert again.returncode == 0, again.stderr[-3000:]
    repeated = records(tmp_path / "again")
    assert [r["pack"] for r in repeated] == [{**p, "id": "again-pack0"} for p in packs]
    assert "(as timed here before (" in again.stdout + again.stderr
    assert [step_losses(tmp_path / "again" / str(i)) for i in (0, 1)] == [
        step_losses(tmp_path / "a" / str(i)) for i in (0, 1)
    ]  # the same way: the same numbers, to the last bit

    # sigmoid attention: the same parameters, another computation (the explicit path, not the fused kernel), timed
    # for itself, not given the plain model's choice (which would then depend on which of the two ran here first)
    other = run_cli("-m", *PACKED, "seed=0,1", *FLOAT64, "+design=sigmoid", "hydra.sweep.dir=other")
    assert other.returncode == 0, other.stderr[-3000:]
    assert len(list((tmp_path / "cache" / "pack_compute").glob("*.json"))) == 2
    assert records(tmp_path / "other")[0]["pack"]["compute_step_s"] != seconds


@pytest.mark.parametrize("debug", ["fast", "overfit"])
def test_a_debug_run_trains_in_a_pack_as_alone(run_cli, tmp_path, debug):
    """Lightning's debug runs in a pack, each member as its run alone: debug=fast one batch of each split and no
    checkpoint; debug=overfit the first batch of its stored order, again and again (2 epochs here)."""
    quick = [*TINY, *(["trainer.max_epochs=2", "trainer.check_val_every_n_epoch=1"] * (debug != "fast"))]
    packed = run_cli("-m", *PACKED, "seed=0,1", f"debug={debug}", *quick, "hydra.sweep.dir=sweep")
    assert packed.returncode == 0, packed.stderr[-3000:]
    alone = run_cli("seed=1", f"debug={debug}", *quick, "hydra.run.dir=alone")
    assert alone.returncode == 0, alone.stderr[-3000:]
    member, own = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("sweep/1", "alone"))
    assert member["pack"]["size"] == 2 and member["global_step"] == own["global_step"] == (1 if debug == "fast" else 2)
    for key in ("val/acc", "test/acc", "test/loss", "train/loss_epoch"):
        assert member["metrics"][key] == pytest.approx(own["metrics"][key], abs=1e-6), key
    fast = debug == "fast"
    assert (member["checkpoints"]["last"] is None) == fast and (own["checkpoints"]["last"] is None) == fast
    assert (tmp_path / "sweep/0/checkpoints").exists() != fast


def test_architectures_go_to_separate_packs_and_a_diverging_member_fails_alone(run_cli, tmp_path):
    sweep = tmp_path / "sweep"
    plain = [o for o in TINY if not o.startswith("callbacks.progress_bar")]  # output to a file: a pack's lines
    done = run_cli(
        "-m", *PACKED, "model.attention.n_heads=1,2", "optim.lr=1e-3,1e30", *plain, "logger=csv",
        "trainer.max_epochs=1", f"hydra.sweep.dir={sweep}",
    )  # fmt: skip
    assert done.returncode == 1  # some jobs failed: the sweep says so
    validated = [line for line in done.stdout.splitlines() if " validated: val/acc " in line]
    assert len(validated) == 2 and all("over 1)" in line for line in validated)  # the frozen member left out
    runs = records(sweep)
    packs = {r["config"]["model.attention.n_heads"]: r["pack"]["id"] for r in runs if "pack" in r}
    assert len(set(packs.values())) == 2
    for r in runs:
        if r["config"]["optim.lr"] == 1e30:
            assert r["status"] == "failed" and "non-finite training objective" in r["error"]
        else:
            assert r["status"] == "completed" and r["pack"]["size"] == 2
    assert "did not complete" in done.stderr and "Traceback" not in done.stderr
    diverged = [json.loads((sweep / str(i) / "progress.json").read_text()).get("diverged", False) for i in range(4)]
    assert diverged == [r["config"]["optim.lr"] == 1e30 for r in runs]  # its numbers stopped where it diverged
    status = cli_here("status", str(sweep), cwd=tmp_path).stdout.splitlines()
    assert status[0] == f"{sweep}: 4 jobs: 2 completed, 2 failed"
    assert status[1].startswith("  completed: 2 (0, 2), each in ")
    assert all(line.startswith("  failed: ") and "non-finite training objective" in line for line in status[2:])


def test_a_pack_stopped_by_sigterm_records_every_member_and_continues_like_the_pack_left_alone(tmp_path):
    """SIGTERM mid-training: every member saves its last.ckpt where training stopped and is recorded interrupted;
    the same command with sweep.resume=true continues each member from its own last.ckpt, and the pack ends as the
    same pack left alone ends (dropout on: each member's stream continues too)."""
    slow = [*TINY, "data.n_train=4000", "trainer.max_epochs=2", "logger=csv", "trainer.deterministic=true"]
    slow += ["model.dropout=0.1", "callbacks.attention.analysis_batches=2"]
    alone = train_here("-m", *PACKED, "seed=0,1,2", *slow, "hydra.sweep.dir=alone", cwd=tmp_path)
    assert alone.returncode == 0, alone.stderr[-3000:]
    sweep = tmp_path / "sweep"
    command = [sys.executable, "-m", "headlab.cli.train", "-m", *PACKED, "seed=0,1,2", *slow]
    command.append(f"hydra.sweep.dir={sweep}")
    process = subprocess.Popen(command, cwd=tmp_path, env=cli_env(), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while len(list(sweep.glob("*/checkpoints/last.ckpt"))) < 3 and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)  # the first validation wrote every member's checkpoints: training goes on
    time.sleep(1)  # into the second epoch
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM
    assert [(r["status"], r["error"]) for r in records(sweep)] == [("interrupted", "stopped by SIGTERM")] * 3
    steps = {
        torch.load(sweep / str(i) / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] for i in range(3)
    }
    assert len(steps) == 1 and 125 < steps.pop() < 250  # all where training stopped, inside the second epoch

    resume = ["sweep.resume=true", f"hydra.sweep.dir={sweep}"]
    again = train_here("-m", *PACKED, "seed=0,1,2", *slow, *resume, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "continuing" in again.stdout + again.stderr
    for ours, theirs in zip(records(sweep), records(tmp_path / "alone"), strict=True):
        assert ours["status"] == "completed" and ours["epochs"] == theirs["epochs"] == 2
        for key in ("val/acc", "val/acc_best", "test/acc", "test/loss"):
            assert ours["metrics"][key] == pytest.approx(theirs["metrics"][key], abs=1e-6), key
        assert [(p["step"], p["tokens"]) for p in ours["curve"]] == [(p["step"], p["tokens"]) for p in theirs["curve"]]


def test_a_signal_while_a_packs_checkpoints_are_written_is_handled_after_the_last_one():
    """A pack writes its members' last.ckpt one after another (signals_held.held): a requeue's signal (USR2, on
    which submitit exits at once) arriving between two of them is handled once all are written, so that the
    requeued pack continues its members from one step, as one pack. Signals without a Python handler stay so."""
    written, handled = [], []

    def requeue(signum, frame):  # as submitit's: note it, then leave
        handled.append((signum, list(written)))
        raise SystemExit(-1)

    previous = signal.signal(signal.SIGUSR2, requeue)
    ignored = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        with pytest.raises(SystemExit), signals_held.held():
            for member in range(3):
                written.append(member)
                if member == 0:
                    os.kill(os.getpid(), signal.SIGUSR2)
                    os.kill(os.getpid(), signal.SIGUSR1)
                    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
                    time.sleep(0.1)  # time for the handler to run, had it not been held
        assert handled == [(signal.SIGUSR2, [0, 1, 2])]
        assert signal.getsignal(signal.SIGUSR2) is requeue  # the handler is back
    finally:
        signal.signal(signal.SIGUSR2, previous)
        signal.signal(signal.SIGUSR1, ignored)


def test_packs_refuse_what_they_cannot_do(run_cli):
    for overrides, message in (
        (["trainer=ddp_cpu"], "trainer.devices=2 is invalid: expected 1 with hydra/launcher=packed"),
        (["resume=somewhere"], "resume='somewhere' is invalid"),
    ):
        done = run_cli("-m", *PACKED, "seed=0,1", *TINY, "logger=none", *overrides)
        assert message in done.stderr and "Traceback" not in done.stderr
        assert done.returncode != 0


def test_a_packed_sweep_on_text_files_prepares_the_data_once(run_cli, tmp_path):
    words = ["good", "bad", "film", "plot", "dull", "great", "story", "actor"]
    for split, n in (("train", 120), ("val", 30), ("test", 30)):
        rows = [
            f"{words[i % 8]} {words[(i * 3) % 8]} {words[(i * 5) % 8]},{int(words[i % 8] in ('good', 'great'))}"
            for i in range(n)
        ]
        (tmp_path / f"{split}.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    data = ["data=files", *(f"data.files.{s}={tmp_path / s}.csv" for s in ("train", "val", "test")), "data.n_classes=2"]
    sweep = tmp_path / "sweep"
    done = run_cli(
        "-m", *PACKED, "seed=0,1,2", *data, "data.batch_size=16", "model.d_model=16",
        "trainer.max_epochs=2", "logger=csv", "callbacks.progress_bar=null", f"data.cache_dir={tmp_path / 'cache'}",
        f"hydra.sweep.dir={sweep}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    runs = records(sweep)
    assert [r["status"] for r in runs] == ["completed"] * 3 and {r["pack"]["size"] for r in runs} == {3}
    assert len({r["data"]["cache"] for r in runs}) == 1 and len(list((tmp_path / "cache").iterdir())) == 1
    # the text model's dropout (0.3) is off where the pack evaluates: its test is the best checkpoint's, as the
    # member's own run measures it again on resume (training done: it tests the best checkpoint)
    resumed = run_cli(f"resume={as_interrupted(sweep / '1')}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = json.loads((sweep / "1" / "results.json").read_text())["metrics"]
    assert again["test/loss"] == pytest.approx(runs[1]["metrics"]["test/loss"], rel=1e-5)


def pack_workers(launcher: int) -> list[int]:
    """The launcher's worker processes that train packs: the children of its forkserver (on a CPU)."""
    children = {}  # pid -> (ppid, command line)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children[int(stat.parent.name)] = (ppid, (stat.parent / "cmdline").read_bytes())
    servers = {pid for pid, (ppid, command) in children.items() if ppid == launcher and b"forkserver" in command}
    return [pid for pid, (ppid, _) in children.items() if ppid in servers]


def test_packs_side_by_side_train_as_one_at_a_time_each_in_its_own_process(run_cli, tmp_path):
    """hydra.launcher.n_jobs=2: the two packs (two head counts) train at once, in two processes with half of the
    cores each, and every member's numbers are those of the packs trained one after another (float64)."""
    results = {}
    for n_jobs in (1, 2):
        sweep = tmp_path / f"sweep{n_jobs}"
        done = run_cli(
            "-m", "hydra/launcher=packed", f"hydra.launcher.n_jobs={n_jobs}", "model.attention.n_heads=1,2",
            "seed=0,1", *FLOAT64, "trainer.max_epochs=1", f"hydra.sweep.dir={sweep}",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"2 pack(s) of at most 64, {n_jobs} at a time" in done.stdout
        assert "it/s" not in done.stdout + done.stderr  # callbacks.progress_bar=null: no bar, not Lightning's own
        results[n_jobs] = records(sweep)
    assert [r["status"] for r in results[2]] == ["completed"] * 4
    assert {r["resources"]["threads"] for r in results[2]} == {max(1, usable_cores() // 2)}
    for alone, side_by_side in zip(results[1], results[2], strict=True):
        assert alone["pack"]["id"][-6:] == side_by_side["pack"]["id"][-6:] and alone["seed"] == side_by_side["seed"]
        for key in ("val/acc_best", "test/acc", "test/loss", "train/loss_epoch"):
            assert side_by_side["metrics"][key] == pytest.approx(alone["metrics"][key], abs=1e-9)


def test_jobs_are_split_into_packs_of_at_most_max_pack_and_further_to_fill_the_packs_at_once():
    """plan.split: each group of jobs in as few packs of at most max_pack as it takes, of sizes as equal as they can
    be; with fewer packs than train at once, the group of the largest packs split again, down to packs of one."""
    sizes = lambda groups, max_pack, at_least=1: [len(p) for p in plan.split(groups, max_pack, at_least)]  # noqa: E731
    assert sizes([list(range(16))], 64, 2) == [8, 8]
    assert sizes([list(range(65))], 64) == [33, 32]  # not 64 and 1
    assert sizes([list(range(5))], 2) == [2, 2, 1]
    assert sizes([list(range(4)), list(range(12))], 64, 4) == [4, 4, 4, 4]  # the largest packs split first
    assert sizes([list(range(2)), list(range(3))], 64, 8) == [1, 1, 1, 1, 1]  # no pack of none
    assert sizes([list(range(16))], 64, 1) == [16]
    groups = [list(range(7)), list(range(7, 10))]
    assert [job for pack in plan.split(groups, 2, 6) for job in pack] == list(range(10))  # every job once, in order


def test_packs_at_once_are_one_a_usable_core_on_a_cpu_as_many_as_given_and_one_where_packs_train_elsewhere():
    with initialize_config_module("headlab.conf", version_base="1.3"):

        def at(*overrides: str) -> int:
            return plan.at_once(compose("train", ["hydra/launcher=packed", *overrides], return_hydra_config=True))

        assert at() == usable_cores()  # n_jobs=auto, trainer=cpu
        assert at("hydra.launcher.n_jobs=3") == 3
        assert at("trainer=gpu") == 1
        assert at("hydra/launcher=packed_slurm") == 1  # each pack a SLURM job
        with pytest.raises(
            ConfigError, match=r"^hydra.launcher.n_jobs='all' is invalid: expected an int >= 1 or auto$"
        ):
            at("hydra.launcher.n_jobs=all")


def test_packs_train_at_once_only_as_many_as_the_hosts_free_memory_holds():
    """plan.trained_at_once on a CPU: n_jobs packs at once where the largest n_jobs of them fit together in
    memory.SHARE of the free memory (pack_gb each), fewer where they do not, never none."""
    free_gb = memory.free_bytes("cpu") / 2**30
    cpu = OmegaConf.create({"trainer": {"accelerator": "cpu"}})
    assert plan.trained_at_once(cpu, [1, 1, 1], 2) == 2
    assert plan.trained_at_once(cpu, [1], 2) == 1  # no more than there are packs
    half = math.ceil(memory.SHARE * free_gb / 2) + 1  # two of them do not fit
    assert plan.trained_at_once(cpu, [1, half, half], 3) == 1
    assert plan.trained_at_once(cpu, [1, half], 2) == 2  # one of them fits beside a small one
    assert plan.trained_at_once(cpu, [half, half], 2) == 1
    assert plan.trained_at_once(cpu, [1, 1, math.ceil(memory.SHARE * free_gb) + 1], 3) == 1
    gpu = OmegaConf.create({"trainer": {"accelerator": "gpu"}})
    assert plan.trained_at_once(gpu, [half, half], 2) == 2  # each on a GPU of its own: not the host's memory


def test_a_packed_sweep_trains_a_pack_on_each_core_and_its_dry_run_prices_the_same_packs(run_cli, tmp_path):
    """hydra.launcher.n_jobs=auto (the default) on a CPU: four seeds of one arm train as one pack a usable core, each
    with one core's threads, as the dry run says before."""
    cores = usable_cores()
    k = min(cores, 4)
    expected = sorted(4 // k + (i < 4 % k) for i in range(k))
    sweep = ["-m", "hydra/launcher=packed", "seed=0,1,2,3", *TINY, "logger=csv"]
    dry = run_cli(*sweep, "hydra.sweep.dir=dry", "--dry-run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert f"4 jobs in {k} pack(s) of at most 64; nothing is started" in dry.stdout
    done = run_cli(*sweep, "hydra.sweep.dir=sweep")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"4 jobs to train in {k} pack(s) of at most 64, {k} at a time" in done.stdout
    members = records(tmp_path / "sweep")
    assert [m["status"] for m in members] == ["completed"] * 4
    packs = {m["pack"]["id"]: m["pack"]["size"] for m in members}
    assert sorted(packs.values()) == expected and len(packs) == k
    assert {m["resources"]["threads"] for m in members} == {max(1, cores // k)}


def test_packs_side_by_side_survive_a_dead_worker_and_stop_together_on_sigterm(tmp_path):
    """A worker killed outright fails its own pack's members only and the next pack takes its place; a worker
    stopped by SIGTERM interrupts its own pack's members only; SIGTERM to the launcher stops every worker
    (each member's last.ckpt saved, every record interrupted) and leaves no process behind (a launcher killed
    outright: tests/launch/test_status.py)."""
    slow = [*TINY, "data.n_train=4000", "trainer.max_epochs=4", "logger=csv", "callbacks.progress_bar=null"]
    packed = [sys.executable, "-m", "headlab.cli.train", "-m", "hydra/launcher=packed", "hydra.launcher.n_jobs=2"]

    def start(sweep, *overrides):
        command = [*packed, *overrides, *slow, f"hydra.sweep.dir={sweep}"]
        return subprocess.Popen(
            command, cwd=tmp_path, env=cli_env(), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip

    def training(process, sweep, members):  # both packs past their first of 4 epochs: both workers training
        deadline = time.time() + 240
        while len(list(sweep.glob("*/checkpoints/last.ckpt"))) < members and time.time() < deadline:
            assert process.poll() is None
            time.sleep(0.2)

    sweep = tmp_path / "killed"  # three packs, two at a time: one worker killed, the next pack's worker stopped
    process = start(sweep, "model.attention.n_heads=1,2,4", "seed=0")
    training(process, sweep, 2)
    assert [r["status"] for r in records(sweep)] == ["running", "running", "queued"]  # the third waits its turn
    first = pack_workers(process.pid)
    assert len(first) == 2
    os.kill(first[0], signal.SIGKILL)
    training(process, sweep, 3)  # the third pack took the killed worker's place
    third_began = datetime.fromisoformat(records(sweep)[2]["started_at"])  # when it started, not when queued
    assert third_began > datetime.fromisoformat(records(sweep)[0]["started_at"]) + timedelta(seconds=1)
    (third,) = set(pack_workers(process.pid)) - set(first)
    os.kill(third, signal.SIGTERM)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 1 and b"Traceback" not in stderr  # two jobs did not complete: the sweep says so
    assert sorted(r["status"] for r in records(sweep)) == ["completed", "failed", "interrupted"]
    failed = next(r for r in records(sweep) if r["status"] == "failed")
    assert "ended with exit code -9 before reporting" in failed["error"]
    assert next(r for r in records(sweep) if r["status"] == "completed")["epochs"] == 4  # the other pack trained on

    sweep = tmp_path / "stopped"  # three packs, the third never started: it stays queued (a resume trains it)
    process = start(sweep, "model.attention.n_heads=1,2,4", "seed=0,1")
    training(process, sweep, 4)
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=300)
    assert process.returncode == 128 + signal.SIGTERM
    assert [r["status"] for r in records(sweep)] == ["interrupted"] * 4 + ["queued"] * 2
    status = cli_here("status", str(sweep), cwd=tmp_path).stdout.splitlines()  # what a person reads of it
    assert status[:2] == [f"{sweep}: 6 jobs: 2 queued, 4 interrupted", "  queued: 2 (4-5): not started (if the "
                          "sweep has stopped, not waiting for a slot: sweep.resume=true trains them)"]  # fmt: skip
    assert status[2:] == ["  interrupted: 4 (0-3): stopped by SIGTERM; sweep.resume=true continues them"]
    assert all((sweep / str(i) / "checkpoints" / "last.ckpt").is_file() for i in range(4))
    deadline = time.time() + 60  # the forkserver ends once the launcher has: its interpreter's exit takes a second
    while session_processes(process.pid) and time.time() < deadline:
        time.sleep(0.5)
    assert session_processes(process.pid) == []


@pytest.mark.e2e
def test_a_stopped_sweep_of_large_packs_records_every_member_at_once(tmp_path):
    """SIGTERM to the launcher of two packs of 40 members side by side: each worker's results are more than a pipe
    holds, and are read as the workers stop (a worker blocked in its send would hold the launcher for its 300 s
    patience and lose its members' records): the sweep ends in seconds, every member recorded interrupted."""
    slow = [*TINY, "data.n_train=500", "trainer.max_epochs=12", "logger=csv", "callbacks.progress_bar=null"]
    sweep = tmp_path / "sweep"
    command = [sys.executable, "-m", "headlab.cli.train", "-m", "hydra/launcher=packed", "hydra.launcher.n_jobs=2",
               "model.attention.n_heads=1,2", "seed=range(40)", *slow, f"hydra.sweep.dir={sweep}"]  # fmt: skip
    process = subprocess.Popen(command, cwd=tmp_path, env=cli_env(), stdin=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    deadline = time.time() + 240
    while len(list(sweep.glob("*/progress.json"))) < 80 and time.time() < deadline:  # every member training
        assert process.poll() is None
        time.sleep(0.2)
    stopped = time.time()
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=300)
    assert time.time() - stopped < 120 and process.returncode == 128 + signal.SIGTERM
    assert [r["status"] for r in records(sweep)] == ["interrupted"] * 80


def test_a_pack_worker_gets_its_gpu_by_slot():
    assert [gpu_for_slot(k, 2, None) for k in range(3)] == ["0", "1", "0"]
    assert gpu_for_slot(1, 2, "3,5") == "5"  # among the GPUs the launcher may see


def test_a_packed_sweep_composes_every_job_before_it_touches_one_and_a_finished_one_resumes_without_torch(tmp_path):
    """Each job's config is composed once (not also by the sweeper): one that cannot compose refuses the sweep
    before any job directory exists; a sweep whose jobs all completed resumes without importing torch."""
    refused = headlab_train("-m", *PACKED, "model=encoder,nope", *TINY, "hydra.sweep.dir=bad", cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip() == "headlab-train: invalid config: model=nope is unknown: expected one of encoder"
    assert not [p for p in (tmp_path / "bad").iterdir() if p.is_dir()]

    sweep = ["-m", *PACKED, "seed=0,1", *TINY, "logger=csv", "hydra.sweep.dir=sweep"]
    assert train_here(*sweep, cwd=tmp_path).returncode == 0  # trained here: the resume's process is the point
    again = headlab_train(*sweep, "sweep.resume=true", cwd=tmp_path, env={**cli_env(), "PYTHONPROFILEIMPORTTIME": "1"})
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in again.stderr.splitlines() if line.startswith("import time:")
    }
    assert again.returncode == 0 and (again.stdout + again.stderr).count("completed before with the same config") == 2
    assert "headlab.launch.packs" in imported and not {"torch", "lightning"} & imported


def csv_rows(run_dir) -> list[dict]:
    """metrics.csv's filled cells without its timing columns and the training means of an epoch (a resumed epoch
    averages over its steps after the resume only): the columns a later row adds leave earlier rows as they were."""
    with open(run_dir / "metrics.csv", newline="") as f:
        return [
            {k: v for k, v in row.items() if v and not k.startswith(("perf/", "train/loss_epoch", "train/acc"))}
            for row in csv.DictReader(f)
        ]


def stopped_pack(moment: str) -> list[str]:
    """The packed sweep test_a_pack_stopped_and_resumed_... stops at `moment`: two float64 members of 3 epochs."""
    # stopped in the head analysis: seconds of it even on an idle CPU (32 batches of activation patching too)
    after = ["callbacks.attention.analysis_batches=64", "callbacks.attention.causal_batches=32"]
    analysis = after if moment == "after_training" else ["callbacks.attention=null"]
    slow = [*FLOAT64, "data.n_train=2048", "trainer.max_epochs=3", *analysis, "seed=0,1"]
    return ["-m", *PACKED, *slow]


@pytest.fixture(scope="module")
def left_alone(tmp_path_factory):
    """moment -> the sweep of stopped_pack(moment) trained without a stop (its twin), trained once a module for the
    moments whose sweeps are one."""
    done: dict[tuple, Path] = {}

    def twin(moment: str) -> Path:
        command = tuple(stopped_pack(moment))
        if command not in done:
            where = tmp_path_factory.mktemp("alone")
            alone = train_here(*command, "hydra.sweep.dir=alone", cwd=where)
            assert alone.returncode == 0, alone.stderr[-2000:]
            done[command] = where / "alone"
        return done[command]

    return twin


@pytest.mark.e2e
@pytest.mark.parametrize("moment", ["mid_epoch", "after_training", "killed_mid_epoch"])
def test_a_pack_stopped_and_resumed_keeps_every_row_and_point_its_members_logged(tmp_path, moment, left_alone):
    """SIGTERM to a packed sweep in its second epoch saves every member's last.ckpt at the next step, or after its
    last validation (in the head analysis) leaves the last epoch's; SIGKILL in its second epoch leaves the first
    epoch's last.ckpt, its training row written with it. Resumed with sweep.resume=true, each member's metrics.csv
    holds the rows logged before the stop, none twice, and equals its twin left alone, and so does its learning
    curve."""
    command = stopped_pack(moment)
    alone = left_alone(moment)
    sweep = tmp_path / "stopped"
    process = subprocess.Popen(
        [sys.executable, "-m", "headlab.cli.train", *command, f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path, env=cli_env(), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 240  # the members are in their second epoch: a validation's rows are logged
        while time.time() < deadline and process.poll() is None:
            files = [sweep / str(n) / "progress.json" for n in range(2)]
            read = [json.loads(f.read_text()) if f.is_file() else {"step": 0, "steps": 1} for f in files]
            if all(r["step"] > 80 if moment != "after_training" else r.get("phase") == "tested" for r in read):
                break
            time.sleep(0.1)
        if moment == "killed_mid_epoch":
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    expected = -signal.SIGKILL if moment == "killed_mid_epoch" else 128 + signal.SIGTERM
    assert process.returncode == expected, process.stderr.read().decode()[-2000:]
    before = [csv_rows(sweep / str(n)) for n in range(2)]
    assert all(len(rows) >= 2 for rows in before)  # the first epoch's validation at least
    resumed = train_here(*command, f"hydra.sweep.dir={sweep}", "sweep.resume=true", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    for n in range(2):
        rows, twin = csv_rows(sweep / str(n)), csv_rows(alone / str(n))
        assert rows[: len(before[n]) - 1] == before[n][: len(before[n]) - 1]  # what was logged before is kept
        assert [(r.get("epoch"), r["step"], sorted(r)) for r in rows] == [
            (r.get("epoch"), r["step"], sorted(r)) for r in twin
        ]  # every row once, in its place, with the same columns filled
        numbers = lambda rows: [float(v) for r in rows for k, v in r.items() if v and k not in ("epoch", "step")]  # noqa: E731
        assert numbers(rows) == pytest.approx(numbers(twin), rel=1e-8)  # float64: summation order aside
        curve, curve_alone = (json.loads((d / str(n) / "results.json").read_text())["curve"] for d in (sweep, alone))
        assert [(p["epoch"], p["step"], p["tokens"]) for p in curve] == [
            (p["epoch"], p["step"], p["tokens"]) for p in curve_alone
        ]


def kill_in_second_epoch(argv: list[str], run: Path, ranks: int, cwd: Path) -> None:
    """headlab-train with argv in a process of its own, killed (SIGKILL, with its forked ranks) in its second epoch
    of 64 steps (32 for each of two ranks)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "headlab.cli.train", *argv],
        cwd=cwd, env=cli_env(), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 240
        while time.time() < deadline and process.poll() is None:
            progress = run / "progress.json"
            if progress.is_file() and json.loads(progress.read_text())["step"] > 80 // ranks:  # its second epoch
                break
            time.sleep(0.1)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGKILL, process.stderr.read().decode()[-2000:]


@pytest.mark.e2e
@pytest.mark.parametrize("first_attempt", ["pack of one", "lightning", "two devices"])
def test_a_run_of_headlab_train_killed_and_resumed_equals_its_twin_left_alone(tmp_path, first_attempt):
    """headlab-train's run is a pack of one: SIGKILL in its second epoch leaves the first epoch's last.ckpt, its
    training row written with it; resumed with resume=, its metrics.csv holds every row once, as its twin left alone,
    and so do its learning curve and its numbers. A run killed in its second epoch on Lightning's single path (how
    an older headlab trained every run: tests/fixtures/lightning_run_killed.tar.xz, this command's run, killed by a
    callback taken out of its records) continues as a pack of one. So does a run on two devices (DDP, its ranks
    forked), killed with its ranks."""
    ranks = 2 if first_attempt == "two devices" else 1
    devices = ["trainer=ddp_cpu"] if ranks == 2 else []
    command = [*FLOAT64, *devices, "data.n_train=2048", "trainer.max_epochs=3", "callbacks.attention=null"]
    alone = train_here(*command, "hydra.run.dir=alone", cwd=tmp_path)
    assert alone.returncode == 0, alone.stderr[-2000:]
    run = tmp_path / "killed"
    if first_attempt == "lightning":
        with tarfile.open(TESTS / "fixtures" / "lightning_run_killed.tar.xz") as archive:
            archive.extractall(tmp_path, filter="data")
        (tmp_path / "headlab-lightning-run").rename(run)
    else:
        kill_in_second_epoch([*command, f"hydra.run.dir={run}"], run, ranks, tmp_path)
    checkpointed = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    before = [r for r in csv_rows(run) if int(r["step"]) < checkpointed]  # the rows a resume keeps as they were
    assert len(before) >= 2  # the first epoch's validation and training rows
    resumed = train_here(f"resume={run}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    rows, twin = csv_rows(run), csv_rows(tmp_path / "alone")
    assert rows[: len(before)] == before and [(r.get("epoch"), r["step"], sorted(r)) for r in rows] == [
        (r.get("epoch"), r["step"], sorted(r)) for r in twin
    ]
    numbers = lambda rows: [float(v) for r in rows for k, v in r.items() if v and k not in ("epoch", "step")]  # noqa: E731
    # float64; Lightning's path logs its learning rate through float32 (0.001 as 0.0010000000298)
    assert numbers(rows) == pytest.approx(numbers(twin), rel=1e-8 if first_attempt != "lightning" else 1e-7)
    got, expected = (json.loads((d / "results.json").read_text()) for d in (run, tmp_path / "alone"))
    assert "pack" not in got and got["metrics"] == pytest.approx(expected["metrics"], rel=1e-8)
    assert [(p["step"], p["tokens"]) for p in got["curve"]] == [(p["step"], p["tokens"]) for p in expected["curve"]]


def test_a_packs_rich_bar_shows_its_run_or_the_mean_of_the_members_still_training():
    from types import SimpleNamespace

    from headlab.training.pack.member import Member
    from headlab.training.pack.progress import PackBar

    members = [Member(cfg=None, run_dir=Path(str(e)), flat_config={}) for e in range(3)]
    for member, acc in zip(members, (0.5, 0.7, 0.0), strict=True):
        member.metrics = {"val/acc": acc, "val/loss": 1.0 - acc, "test/acc": 1.0}
    module = SimpleNamespace(alive=torch.tensor([True, True, False]), last_losses=torch.tensor([0.25, 0.75, 9.0]))
    shown = PackBar(members, every_n_steps=1).read_metrics(None, module)  # the frozen third member left out
    assert shown == pytest.approx({"train/loss": 0.5, "val/acc": 0.6, "val/loss": 0.4})
    one = SimpleNamespace(alive=torch.tensor([True]), last_losses=torch.tensor([0.25]))
    assert PackBar(members[:1], every_n_steps=1).read_metrics(None, one) == {
        "train/loss": 0.25,
        "val/acc": 0.5,
        "val/loss": 0.5,
    }
