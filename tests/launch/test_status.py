"""headlab-status and progress.json: where runs in training stand, read from their directories alone."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import PACKED, TINY, cli_env, cli_here, session_processes, train_here
from headlab.launch.rundir import earlier_attempts
from headlab.launch.summary import job_ranges, table
from headlab.printing import duration
from headlab.record import total_seconds


def progress(run_dir) -> dict:
    return json.loads((run_dir / "progress.json").read_text())


def test_job_folders_read_as_ranges_and_durations_in_words():
    assert job_ranges([str(n) for n in [*range(30), 45, *range(60, 90)]]) == "0-29, 45, 60-89"
    assert job_ranges(["3", "1", "2", "5"]) == "1-3, 5"
    assert job_ranges([str(n) for n in range(0, 20, 2)], shown=3) == "0, 2, 4 and 7 more"
    assert [duration(s) for s in (12, 600, 7380, 7199)] == ["12 s", "10 min", "2 h 3 min", "2 h 0 min"]


def test_a_sweeps_table_says_what_its_replicates_are(tmp_path):
    """Runs of a cross-validated sweep replicate over folds, not seeds: the summary's last line says which."""
    for cv in (False, True):
        for i, (heads, k) in enumerate((h, k) for h in (1, 4) for k in range(2)):
            config = {"model.attention.n_heads": heads, "seed": 0 if cv else k, "data.cv.fold": k if cv else None}
            record = {"status": "completed", "config": config, "metrics": {"val/acc_best": 0.5, "test/acc": 0.5}}
            (tmp_path / str(cv) / str(i)).mkdir(parents=True)
            (tmp_path / str(cv) / str(i) / "results.json").write_text(json.dumps(record))
        over = "folds" if cv else "seeds"
        assert table(tmp_path / str(cv)).splitlines()[-1].startswith(f"(mean +- sd over {over}; intervals")


def test_a_continued_runs_time_counts_its_earlier_attempts_and_status_says_so(tmp_path):
    """A run continued twice: killed without a word after 299.75 s (to its last word in progress.json), then stopped
    by SIGTERM after 200 s, then 100 s to its end. A member still queued when its sweep stopped never trained."""
    run = tmp_path / "sweep" / "0"
    run.mkdir(parents=True)
    (run / "progress.json").write_text(json.dumps({"updated_at": "2026-01-01T10:05:00+00:00"}))
    killed = {"status": "running", "started_at": "2026-01-01T10:00:00.250000+00:00"}
    first = earlier_attempts(run, killed)
    assert first == [{"started_at": killed["started_at"], "status": "ended without a word", "duration_s": 299.75}]
    stopped = {"status": "interrupted", "started_at": "2026-01-01T11:00:00+00:00", "duration_s": 200.0}
    both = earlier_attempts(run, {**stopped, "attempts": first})
    assert [a["duration_s"] for a in both] == [299.75, 200.0]
    assert earlier_attempts(run, {"status": "queued", "started_at": "2026-01-01T12:00:00+00:00"}) == []
    record = {"status": "completed", "started_at": "2026-01-01T12:00:00+00:00", "duration_s": 100.0, "attempts": both}
    (run / "results.json").write_text(json.dumps(record))
    assert total_seconds(record) == 599.75
    status = cli_here("status", "sweep", cwd=tmp_path)
    assert status.returncode == 0 and status.stdout.splitlines()[1] == "  completed: 1 (0), each in 10 min"


@pytest.mark.e2e
def test_a_finished_run_and_pack_leave_progress_that_agrees_with_their_records(tmp_path):
    """progress.json's last word is the run's end: its step, its steps, its last validation (the curve's last point)
    and best val/acc, for a single run and for each member of a pack."""
    single = train_here(*TINY, "logger=csv", "hydra.run.dir=single", cwd=tmp_path)
    packed = train_here("-m", *PACKED, *TINY, "logger=csv", "seed=0,1", "hydra.sweep.dir=packed", cwd=tmp_path)
    assert single.returncode == 0 and packed.returncode == 0, single.stderr + packed.stderr
    runs = [tmp_path / "single", tmp_path / "packed" / "0", tmp_path / "packed" / "1"]
    for run_dir in runs:
        record, last = json.loads((run_dir / "results.json").read_text()), progress(run_dir)
        assert last["step"] == last["steps"] == record["global_step"] == 2 * 256 // 32
        assert (last["epoch"], last["epochs"], last["phase"]) == (2, 2, "tested")
        assert last["val"] == record["curve"][-1]
        assert last["val/acc_best"] == pytest.approx(record["metrics"]["val/acc_best"], abs=1e-7)
        assert last["attempt"]["step"] == 0 and last["updated_at"] >= last["attempt"]["started_at"]
    assert progress(runs[1])["pack"] == progress(runs[2])["pack"] == "packed-pack0"
    assert "pack" not in progress(runs[0])
    status = cli_here("status", "single", "packed", cwd=tmp_path)
    lines = status.stdout.splitlines()
    assert status.returncode == 0 and lines[:2] == ["single: completed", "packed: 2 jobs: 2 completed"]
    took = json.loads((runs[1] / "results.json").read_text())["duration_s"]  # the pack's: both members alike
    assert lines[2:] == [f"  completed: 2 (0-1), each in {duration(took)}"]
    missing = cli_here("status", "nowhere", cwd=tmp_path)
    assert (
        missing.returncode == 2 and missing.stderr.strip() == "headlab-status: no run records (results.json) in nowhere"
    )
    read, write = os.pipe()
    os.close(read)  # a reader gone before the lines come (`headlab-status DIR | head` once head has its lines)
    command = [sys.executable, "-m", "headlab.cli.status", "single", "packed"]
    closed = subprocess.run(command, cwd=tmp_path, env=cli_env(), stdout=write, stderr=subprocess.PIPE, text=True)
    os.close(write)
    assert (closed.returncode, closed.stderr) == (141, "")  # the shell's code for a closed pipe, no traceback


@pytest.mark.e2e
def test_packs_in_training_say_where_they_stand_and_a_killed_sweep_reads_as_stopped(tmp_path):
    """While two packs train side by side (a third waiting), each is one line: its jobs, step of steps, epoch, the
    mean and range of its members' last val/acc, the time left and the last word. SIGKILL to the launcher, as a
    scheduler ends a job past its time, stops its workers too, where they were; its records still say running,
    and the same lines say that its processes may have ended, and that the waiting jobs did not start."""
    slow = [*TINY, "data.n_train=4000", "trainer.max_epochs=4", "logger=csv"]
    command = [sys.executable, "-m", "headlab.cli.train", "-m", "hydra/launcher=packed", "hydra.launcher.n_jobs=2"]
    sweep = tmp_path / "sweep"
    process = subprocess.Popen(
        [*command, *slow, "model.attention.n_heads=1,2,4", "seed=0,1", f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path, env=cli_env(), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 240  # every member validated once: its progress has a val/acc
        while time.time() < deadline:
            assert process.poll() is None, process.stderr.read().decode()
            files = list(sweep.glob("*/progress.json"))
            if len(files) == 4 and all(json.loads(f.read_text())["val"] for f in files):
                break
            time.sleep(0.2)
        for _ in range(10):  # what the status read: the members' files unchanged while it ran
            members = {n: progress(sweep / str(n)) for n in range(4)}
            status = cli_here("status", str(sweep), cwd=tmp_path)
            if members == {n: progress(sweep / str(n)) for n in range(4)}:
                break
    finally:
        process.send_signal(signal.SIGKILL)  # the launcher, then its workers (they end with it)
        process.wait(timeout=60)
    lines = status.stdout.splitlines()
    assert lines[0] == f"{sweep}: 6 jobs: 4 running, 2 queued"  # the third pack waits for a worker
    assert lines[3:] == ["  queued: 2 (4-5): waiting for their turn"]
    for line, jobs in zip(lines[1:3], ((0, 1), (2, 3)), strict=True):  # one line per pack (a head count)
        pack = members[jobs[0]]["pack"]
        assert line.startswith(f"  pack {pack} (2 jobs: {jobs[0]}-{jobs[1]}): step ") and " of 500 (" in line
        accuracies = [members[j]["val"]["val/acc"] for j in jobs]
        spread = f"val/acc {math.fsum(accuracies) / 2:.4f} [{min(accuracies):.4f}, {max(accuracies):.4f}] after epoch"
        assert spread in line and "left at its pace" in line and "last word" in line and "may have ended" not in line
    deadline = time.time() + 120
    while session_processes(process.pid) and time.time() < deadline:
        time.sleep(0.5)
    assert session_processes(process.pid) == []
    steps = [progress(sweep / str(n))["step"] for n in range(4)]  # left alone, each would have reached 500
    assert all(0 < step < 500 for step in steps)
    time.sleep(1.5)
    stopped = cli_here("status", str(sweep), "--stale", "0.02", cwd=tmp_path).stdout.splitlines()  # 1.2 s
    assert stopped[0] == f"{sweep}: 6 jobs: 4 running, 2 queued"  # what the records say: no process closed them
    assert all("its process may have ended without a word (sweep.resume=true continues it)" in s for s in stopped[1:3])
    assert stopped[3].startswith("  queued: 2 (4-5): not started (if the sweep has stopped")
