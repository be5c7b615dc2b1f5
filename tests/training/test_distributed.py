"""DDP for real on CPU (2 processes, gloo), a pack of one on two devices: one run directory, results written once,
the ranks' metrics over the whole split, and inside sweeps."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module

from conftest import NO_FIGURES, TESTS, TINY, cli_env, cli_here, headlab_train, said
from headlab.launch.wandb_offline import read_run

DDP = [*TINY, "trainer=ddp_cpu", "trainer.max_epochs=1"]


@pytest.mark.e2e
def test_ddp_cpu_run_writes_one_directory_and_complete_results(tmp_path):
    """Two CPU ranks: one directory, one record and one W&B run, from rank 0; the ranks' metrics over the whole
    split; and a callback of the run's own (tests/own_callback.py) in the ranks reads the run's weights and metrics
    and keeps its state in the run's checkpoint, as on one device."""
    watched = tmp_path / "watched.json"
    watch = ["+callbacks.watch._target_=own_callback.Watch", f"+callbacks.watch.out={watched}"]
    env = cli_env() | {"PYTHONPATH": str(TESTS)}  # own_callback.py importable by the CLI and its ranks
    drawn = [o for o in DDP if o != NO_FIGURES]  # rank 0's figures too
    result = headlab_train(*drawn, "logger=[csv,wandb]", *watch, "hydra.run.dir=run", cwd=tmp_path, env=env)
    assert result.returncode == 0, said(result.stderr)
    assert sorted(p.name for p in tmp_path.iterdir() if p != watched) == ["run"]  # none from another rank
    run = tmp_path / "run"
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "completed" and results["resources"]["devices"] == 2
    assert {"val/acc", "val/acc_best", "test/acc"} <= results["metrics"].keys()
    assert results["throughput"]["train_tokens_per_s"] > 0
    state = torch.load(results["checkpoints"]["best"], weights_only=True)["state_dict"]
    assert "model.blocks.0.attn.q_proj.weight" in state
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    rows = [
        dict(zip(header, line.split(","), strict=True)) for line in (run / "metrics.csv").read_text().splitlines()[1:]
    ]
    assert {float(r["data/global_batch_size"]) for r in rows if r.get("data/global_batch_size")} == {64.0}  # 32 x 2
    assert len(list(run.glob("wandb/offline-run-*"))) == 1  # one W&B run, from rank 0
    keys = set().union(*read_run(run)["history"])
    assert {"val/acc", "test/acc", "attention/layer_0/_type"} <= keys
    assert json.loads((run / "heads.json").read_text())["rows"]
    # the ranks trained in forked processes: epochs, steps and the curve come from them, not this process's trainer
    assert (results["epochs"], results["global_step"]) == (1, 4)  # 256 examples / (32 x 2 ranks)
    assert [(p["epoch"], p["step"]) for p in results["curve"]] == [(0, 4)]
    assert results["curve"][0]["val/acc"] == pytest.approx(results["metrics"]["val/acc"])
    assert results["curve"][0]["tokens"] == 256 * 32  # every training token, over both ranks' shares
    tested = [r for r in rows if r.get("test/acc")]
    assert [(r["epoch"], r["step"]) for r in tested] == [("1", "4")]  # where training ended, as a single run's
    seen, last = json.loads(watched.read_text()), torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert [(s["epoch"], s["step"]) for s in seen["seen"]] == [(0, 4)] and seen["first_gradient"] > 0
    assert seen["seen"][0]["val/acc"] == results["curve"][0]["val/acc"]  # the run's metrics over both ranks' shares
    trained = float(last["state_dict"]["model.tok_emb.weight"].norm())
    assert seen["seen"][0]["norm"] == pytest.approx(trained, rel=1e-12)  # the weights that train, not a copy
    assert last["callbacks"]["Watch"]["seen"] == seen["seen"]
    logged = [float(r["own/embedding_norm"]) for r in rows if r.get("own/embedding_norm")]
    assert logged == pytest.approx([seen["seen"][0]["norm"]], rel=1e-7)  # in the run's metrics.csv, once
    # the ranks' sums are the whole split's: the best checkpoint evaluated again in one process gives the same numbers
    for split, key in (("test", "test/acc"), ("val", "val/acc_best")):
        again = cli_here("eval", str(run), split, cwd=tmp_path)
        assert again.returncode == 0, said(again.stderr)
        written = json.loads((run / "eval" / f"{split}-{Path(results['checkpoints']['best']).stem}.json").read_text())
        assert written["metrics"][f"{split}/acc"] == pytest.approx(results["metrics"][key], abs=1e-6)


@pytest.mark.e2e
def test_three_cpu_ranks_started_as_subprocesses_write_one_record_from_rank_0(tmp_path):
    """trainer.devices=3 on the plain CPU trainer: Lightning starts ranks 1 and 2 by running the command again;
    they train, only rank 0 writes results.json and metrics.csv, and each rank's process ends with its process
    group destroyed (own_callback.Collector looks in each)."""
    seen = tmp_path / "collector"
    collector = ["+callbacks.gc._target_=own_callback.Collector", f"+callbacks.gc.out={seen}"]
    env = cli_env() | {"PYTHONPATH": str(TESTS)}  # own_callback.py importable by the CLI and its ranks
    overrides = [*TINY, "trainer.max_epochs=1", "trainer.devices=3", "logger=csv", *collector, "hydra.run.dir=run"]
    result = headlab_train(*overrides, cwd=tmp_path, env=env)
    assert result.returncode == 0 and "Traceback" not in result.stderr, said(result.stderr)
    run = tmp_path / "run"
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "completed" and results["resources"]["devices"] == 3
    assert {"val/acc", "val/acc_best", "test/acc"} <= results["metrics"].keys()
    assert "test/acc" in (run / "metrics.csv").read_text().splitlines()[0]
    exits = {p.name: json.loads(p.read_text()) for p in seen.glob("rank*_exit.json")}
    ends = [f"rank{rank}_{stage}_exit.json" for stage in ("fit", "test") for rank in (0, 1, 2)]  # one process each
    assert exits == dict.fromkeys(ends, {"process_group": False, "ddp_wrappers": 0}), exits


AS_MANY_CORES = """import sys
from headlab.training import cores
cores.cpu_threads = lambda: {cores}  # this job's share of the machine, as on a {cores}-core host
from headlab.cli.train import main
from hydra_plugins.headlab_launcher import register
register()  # as headlab-train does before Hydra composes
sys.argv[0] = "headlab-train"
main()
"""


@pytest.mark.e2e
def test_forked_ranks_on_a_many_core_host_do_not_hang_inside_a_multirun(tmp_path):
    """A process forked after torch ran on several OpenMP threads hangs at its first parallel operation (GNU
    libgomp): ddp_fork ranks of a job on 4 cores (2 threads each; OMP_NUM_THREADS keeps Lightning from setting
    them to this 2-core machine's 1) slept forever after the model summary. The job now prepares on one thread;
    after a multi-threaded job in the same process the ranks get one thread, and say so."""
    env = {**cli_env(), "OMP_NUM_THREADS": "4"}
    overrides = [*DDP, "logger=csv", "trainer=ddp_cpu,cpu,ddp_cpu", "hydra.sweep.dir=sweep"]
    result = subprocess.run(
        [sys.executable, "-c", AS_MANY_CORES.format(cores=4), "-m", *overrides],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, said(result.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep"]
    records = [json.loads((tmp_path / "sweep" / job / "results.json").read_text()) for job in "012"]
    assert [r["status"] for r in records] == ["completed"] * 3
    assert [(r["resources"]["devices"], r["resources"]["threads"]) for r in records] == [(2, 2), (1, 4), (2, 1)]
    assert "one torch thread per rank, not 2: an earlier job of this process ran torch on several threads" in (
        result.stderr + result.stdout
    )


@pytest.mark.e2e
def test_spawned_ranks_report_their_epochs_steps_and_curve(tmp_path):
    """Ranks Lightning spawns (ddp_spawn): the run's epochs, steps and curve; each rank imported torch and
    Lightning as a run's process imports them, frozen out of the garbage collector's passes, the collector on as
    training starts; and each ends with its process group destroyed (a callback of the run's own,
    own_callback.Collector, looks in each rank)."""
    seen = tmp_path / "collector"
    collector = ["+callbacks.gc._target_=own_callback.Collector", f"+callbacks.gc.out={seen}"]
    env = cli_env() | {"PYTHONPATH": str(TESTS)}  # own_callback.py importable by the CLI and its ranks
    overrides = [*DDP, "trainer.strategy=ddp_spawn", "logger=csv", *collector, "hydra.run.dir=run"]
    result = headlab_train(*overrides, cwd=tmp_path, env=env)
    assert result.returncode == 0, said(result.stderr)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "completed" and {"val/acc_best", "test/acc"} <= results["metrics"].keys()
    assert (results["epochs"], results["global_step"]) == (1, 4)
    assert [(p["epoch"], p["step"]) for p in results["curve"]] == [(0, 4)]
    ranks = [json.loads((seen / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert all(state["frozen"] > 100_000 and state["enabled"] is True for state in ranks), ranks
    # each rank's process destroys its gloo group before it exits (one alive at exit aborts a rank now and then)
    exits = {p.name: json.loads(p.read_text()) for p in seen.glob("rank*_exit.json")}
    ends = [f"rank{rank}_{stage}_exit.json" for stage in ("fit", "test") for rank in (0, 1)]  # the fit's, the test's
    assert exits == dict.fromkeys(ends, {"process_group": False, "ddp_wrappers": 0}), exits


def test_relaunching_ddp_is_refused_inside_a_local_sweep(run_cli, tmp_path):
    result = run_cli("-m", *TINY, "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "hydra.sweep.dir=s")
    assert result.returncode == 1
    record = json.loads((tmp_path / "s" / "0" / "results.json").read_text())
    assert record["status"] == "failed" and "trainer.strategy='ddp' is invalid: expected ddp_spawn" in record["error"]


def compose_job(*overrides):
    from headlab.launch import runtime

    runtime.configure()  # the resolvers the launcher configs use

    with initialize_config_module("headlab.conf", version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def test_gpu_and_ddp_trainer_configs_compose():
    gpu = compose_job("trainer=gpu").trainer
    assert (gpu.accelerator, gpu.devices, gpu.precision) == ("gpu", 1, "bf16-mixed")
    ddp = compose_job("trainer=ddp").trainer
    assert (ddp.accelerator, ddp.devices, ddp.strategy, ddp.num_nodes) == ("gpu", -1, "ddp", 1)
    cluster = compose_job("trainer=ddp", "trainer.devices=8", "trainer.num_nodes=4", "hydra/launcher=slurm")
    launcher = cluster.hydra.launcher
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (4, 8, 8)
