"""Sweeps on a real SLURM cluster (one node, started here: tests/slurm_cluster.py), through the real CLI: jobs and
packs submitted, a job and a pack requeued mid-training (as SLURM warns them before a time limit) ending exactly
as their uninterrupted copies, the shipped time-limit requeue, a cancelled job, a partition SLURM refuses. They
skip where SLURM cannot be started (not root, packages not installed)."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import slurm_cluster
from conftest import SMALL_ANALYSIS, cli_env

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]
QUICK = ["data.n_train=8000", "trainer.max_epochs=3", "model.d_model=16", "logger=csv", "callbacks.progress_bar=null",
         *SMALL_ANALYSIS]  # fmt: skip
SHORT = ["data.n_train=256", "data.n_val=64", "data.n_test=64", "model.d_model=16", "trainer.max_epochs=2",
         "logger=csv", "callbacks.progress_bar=null", *SMALL_ANALYSIS]  # fmt: skip  # a job that needs only to complete
EXACT = ["trainer.deterministic=true", "model.dropout=0.1"]  # the same steps and dropout masks, run to run


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = slurm_cluster.unavailable()
    if why:
        pytest.skip(f"SLURM cannot be started here: {why}")
    cluster = slurm_cluster.Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def start(cluster, cwd: Path, *overrides: str) -> subprocess.Popen:
    """headlab-train -m on the cluster. Its jobs find a slow scontrol first on their PATH (SLURM passes the
    submitter's environment on): it waits 3 s after the real one, as scontrol can on a loaded node, so that the
    SIGTERM by which SLURM carries out a requeue reaches it every time, not only under load."""
    slow = cwd / "slow_scontrol"
    slow.mkdir(exist_ok=True)
    (slow / "scontrol").write_text(f'#!/bin/sh\n{shutil.which("scontrol")} "$@"\ncode=$?\nsleep 3\nexit $code\n')
    (slow / "scontrol").chmod(0o755)
    command = [sys.executable, "-m", "headlab.cli.train", "-m", *overrides]
    env = cli_env() | {"SLURM_CONF": cluster.env["SLURM_CONF"], "PATH": f"{slow}:{os.environ['PATH']}"}
    return subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def signal_once_training(cluster, run_dir: Path, how: list[str], written: str = "checkpoints/last.ckpt") -> None:
    """Once run_dir holds `written` (by default its first validation's last.ckpt; progress.json: training began),
    signal the SLURM job that trains it (scancel ...)."""
    deadline = time.time() + 240
    while not (run_dir / written).exists():
        assert time.time() < deadline, "the job did not start training"
        time.sleep(0.2)
    # array task 0 of this sweep's array trains run_dir (its job or its pack): named by its submitit folder, not by
    # the queue's first line, which can be an earlier test's job still requeued or completing on a busy machine
    job = next(p.name for p in (run_dir.parent / ".submitit").iterdir() if p.name.endswith("_0"))
    done = cluster.run("scancel", *how, job)
    assert done.returncode == 0, done.stderr


def records(sweep: Path, n: int) -> list[dict]:
    return [json.loads((sweep / str(i) / "results.json").read_text()) for i in range(n)]


def task_log(sweep: Path, task: int = 0) -> str:
    """What array task `task` wrote, over every attempt (submitit's .out and .err files)."""
    return "".join(f.read_text() for f in sorted((sweep / ".submitit").glob(f"*_{task}/*_log.*")))


def assert_same_training(a: dict, b: dict) -> None:
    assert a["status"] == b["status"] == "completed" and a["global_step"] == b["global_step"]
    for key in ("val/acc", "val/acc_best", "test/acc", "test/loss"):
        assert a["metrics"][key] == b["metrics"][key], key


def test_a_job_sweep_on_slurm_requeues_a_job_warned_of_its_time_limit_and_it_ends_as_if_uninterrupted(
    cluster, tmp_path
):
    """Two copies of one run, one CPU each (their torch threads follow SLURM_CPUS_PER_TASK, SLURM not confining
    them); copy a is sent USR2 mid-training, as SLURM warns a job before its time limit: with the shipped
    max_num_timeout it is requeued, continues from its last.ckpt, and ends as copy b."""
    slurm = ["hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.cpus_per_task=1"]
    slurm += ["hydra.launcher.mem_gb=2", "hydra.launcher.timeout_min=5"]
    process = start(cluster, tmp_path, *slurm, "+copy=a,b", *QUICK, *EXACT, "hydra.sweep.dir=sweep")
    signal_once_training(cluster, tmp_path / "sweep" / "0", ["--signal=USR2"])
    _, stderr = process.communicate(timeout=400)
    assert process.returncode == 0, stderr[-3000:]
    a, b = records(tmp_path / "sweep", 2)
    assert_same_training(a, b)
    assert a["resources"]["threads"] == b["resources"]["threads"] == 1
    log = task_log(tmp_path / "sweep")
    assert "this job is timed-out" in log and "requeued by SLURM: resuming" in log


def test_a_run_whose_strategy_starts_its_ranks_is_one_slurm_task_that_numbers_them_itself(cluster, tmp_path):
    """trainer=ddp_cpu (the job forks its two ranks) on SLURM: one task, not one per device (each would fork both
    again), and its ranks numbered by Lightning's own environment, not SLURM's (each forked rank would read the
    task's rank, 0, and claim the rendezvous port: EADDRINUSE); the run completes as on two devices here."""
    slurm = ["hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.cpus_per_task=1"]
    slurm += ["hydra.launcher.mem_gb=2", "hydra.launcher.timeout_min=5"]
    process = start(cluster, tmp_path, *slurm, "trainer=ddp_cpu", *SHORT, "hydra.sweep.dir=sweep")
    _, stderr = process.communicate(timeout=400)
    assert process.returncode == 0, stderr[-3000:]
    (record,) = records(tmp_path / "sweep", 1)
    assert record["status"] == "completed" and record["resources"]["devices"] == 2
    assert record["global_step"] == 2 * 256 // 64 // 2  # 2 epochs of 4 batches of 64, each rank one batch in two
    script = next((tmp_path / "sweep" / ".submitit").rglob("*_submission.sh")).read_text()
    assert "#SBATCH --ntasks-per-node=1\n" in script


def test_packs_on_slurm_each_a_job_and_a_requeued_pack_ends_as_if_uninterrupted(cluster, tmp_path):
    """Two packs (two copies of seeds 0 and 1) as a SLURM job array; pack a is warned mid-training, requeued,
    continues every member from its own last.ckpt, and its members end as pack b's."""
    slurm = ["hydra/launcher=packed_slurm", "hydra.launcher.slurm.partition=debug"]
    slurm += ["hydra.launcher.slurm.cpus_per_task=1", "hydra.launcher.slurm.timeout_min=5"]
    process = start(cluster, tmp_path, *slurm, "+copy=a,b", "seed=0,1", *QUICK, *EXACT, "hydra.sweep.dir=sweep")
    signal_once_training(cluster, tmp_path / "sweep" / "0", ["--signal=USR2"])
    stdout, stderr = process.communicate(timeout=400)
    assert process.returncode == 0, stderr[-3000:]
    assert "submitted 2 pack(s) as SLURM job array" in stdout + stderr
    runs = records(tmp_path / "sweep", 4)
    assert [r["pack"]["size"] for r in runs] == [2] * 4
    for a, b in zip(runs[:2], runs[2:], strict=True):  # copy a of seed s, copy b of seed s
        assert a["seed"] == b["seed"] and a["pack"]["id"] != b["pack"]["id"]
        assert_same_training(a, b)
    log = task_log(tmp_path / "sweep")
    assert "this job is timed-out" in log and "continuing" in log


@pytest.mark.parametrize("launcher", ["slurm", "packed_slurm"])
def test_a_job_warned_in_an_epoch_longer_than_the_warning_continues_from_the_step_it_stopped_at(
    cluster, tmp_path, launcher
):
    """SLURM warns (USR2) in the first epoch, before any validation wrote a last.ckpt: the run stops at its next
    step and saves it there, and only then is requeued, so that it continues from that step (where submitit alone
    requeued at once and the run started again from step 0, at every requeue of an epoch longer than the
    warning's lead) and ends as its copy left alone."""
    key = "hydra.launcher.slurm" if launcher == "packed_slurm" else "hydra.launcher"
    slurm = [f"hydra/launcher={launcher}", f"{key}.partition=debug", f"{key}.cpus_per_task=1", f"{key}.timeout_min=5"]
    slurm += [f"{key}.mem_gb=2"]  # both copies at once (the launcher's 16 GB would queue the second behind the first)
    # an epoch of 12-18 s here (313 steps alone, 157 in a pack of two members), of which the warning takes 2
    n_train, seeds = ("data.n_train=10000", ["seed=0,1"]) if launcher == "packed_slurm" else ("data.n_train=20000", [])
    long_epoch = [n_train, "trainer.max_epochs=1", "logger=csv"]
    overrides = [*slurm, "+copy=a,b", *seeds, *long_epoch, "callbacks.progress_bar=null", *EXACT]
    process = start(cluster, tmp_path, *overrides, "hydra.sweep.dir=sweep")
    progress = tmp_path / "sweep" / "0" / "progress.json"
    deadline = time.time() + 240
    while not progress.is_file():  # written when training starts
        assert time.time() < deadline and process.poll() is None, "the job did not start training"
        time.sleep(0.2)
    time.sleep(2)  # steps taken: the requeued attempt starts after step 0
    assert not (tmp_path / "sweep" / "0" / "checkpoints" / "last.ckpt").exists()  # no validation yet
    job = next(p.name for p in (tmp_path / "sweep" / ".submitit").iterdir() if p.name.endswith("_0"))
    assert cluster.run("scancel", "--signal=USR2", job).returncode == 0
    stdout, stderr = process.communicate(timeout=400)
    assert process.returncode == 0, stderr[-3000:]
    n = 4 if launcher == "packed_slurm" else 2
    runs = records(tmp_path / "sweep", n)
    for a, b in zip(runs[: n // 2], runs[n // 2 :], strict=True):
        assert_same_training(a, b)
    continued = json.loads(progress.read_text())["attempt"]["step"]  # where the requeued attempt started
    assert 0 < continued < runs[0]["global_step"], continued
    assert "warned by SLURM (USR2): stopping at the next step, then requeued" in task_log(tmp_path / "sweep")


def test_a_cancelled_job_is_recorded_and_the_sweep_summarised_without_accounting(cluster, tmp_path):
    slurm = ["hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.cpus_per_task=1"]
    slurm += ["hydra.launcher.mem_gb=2"]
    longer = [*QUICK, "data.n_train=20000,2000"]  # job 0 trains long enough to be cancelled; job 1 completes soon
    process = start(cluster, tmp_path, *slurm, *longer, "hydra.sweep.dir=sweep")
    signal_once_training(cluster, tmp_path / "sweep" / "0", [], written="progress.json")  # cancelled in training
    _, stderr = process.communicate(timeout=400)
    assert process.returncode == 1 and "Traceback" not in stderr
    cancelled, done = records(tmp_path / "sweep", 2)
    assert cancelled["status"] == "cancelled" and "ended as CANCELLED without a result (scancel)" in cancelled["error"]
    assert done["status"] == "completed"
    assert "not completed: sweep/0 (cancelled: SLURM job " in stderr
    assert "1 of 2 jobs did not complete" in stderr


@pytest.mark.parametrize("launcher", ["slurm", "packed_slurm"])
def test_a_sweep_waits_while_its_array_is_queued_behind_a_busy_node(cluster, tmp_path, launcher):
    """Another job holds every CPU of the node, so the sweep's array waits in the queue (PENDING, listed by squeue
    as 5_[0-1] until it starts), seen there before the other job is cancelled: the sweep waits for it, and every
    job completes."""
    hold = ["sbatch", "--parsable", "-p", "debug", "-c", str(os.cpu_count()), "-o", "/dev/null", "--wrap", "sleep 300"]
    busy = cluster.run(*hold)
    assert busy.returncode == 0, busy.stderr
    busy_id = int(busy.stdout.strip().split(";")[0])
    prefix = "hydra.launcher" if launcher == "slurm" else "hydra.launcher.slurm"
    slurm = [f"hydra/launcher={launcher}", f"{prefix}.partition=debug", f"{prefix}.cpus_per_task=1"]
    process = start(cluster, tmp_path, *slurm, f"{prefix}.mem_gb=2", "seed=0,1", *SHORT, "hydra.sweep.dir=sweep")
    deadline = time.time() + 240
    while not any(  # the sweep's array, queued after the busy job: 7_[0-1] (a job array of one pack: 7_0)
        int(job.split("_")[0]) > busy_id for job in cluster.run("squeue", "-h", "-t", "PD", "-o", "%i").stdout.split()
    ):
        assert time.time() < deadline and process.poll() is None, "the sweep's array was never seen queued"
        time.sleep(0.5)
    assert cluster.run("scancel", str(busy_id)).returncode == 0
    _, stderr = process.communicate(timeout=400)
    assert process.returncode == 0, stderr[-3000:]
    assert [r["status"] for r in records(tmp_path / "sweep", 2)] == ["completed", "completed"]


@pytest.mark.parametrize("launcher", ["slurm", "packed_slurm"])
def test_a_partition_slurm_refuses_is_one_line(cluster, tmp_path, launcher):
    key = "hydra.launcher.partition" if launcher == "slurm" else "hydra.launcher.slurm.partition"
    process = start(cluster, tmp_path, f"hydra/launcher={launcher}", f"{key}=nope", "seed=0,1", "hydra.sweep.dir=s")
    _, stderr = process.communicate(timeout=120)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert process.returncode == 2 and len(lines) == 1, stderr
    assert lines[0] == (
        f"headlab-train: invalid config: {key}='nope' is invalid: SLURM refused it (sbatch: "
        "invalid partition specified: nope)"
    )
