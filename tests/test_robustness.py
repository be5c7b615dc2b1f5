"""Resume after SIGKILL, interrupts, non-finite losses, and random valid attention configurations."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import TINY, cli_env, headlab_train
from headlab.model.attention import MultiHeadAttention

SLOW_ENOUGH = [  # epochs of a few seconds, so that a kill lands in the middle of one
    *TINY,
    "data.n_train=6000",
    "model.d_model=32",
    "model.dropout=0.1",
    "trainer.max_epochs=4",
    "trainer.deterministic=true",
    "logger=csv",
    "callbacks.attention.importance=false",
]


def start_in_background(run_dir) -> subprocess.Popen:
    """The real CLI on SLOW_ENOUGH, writing into run_dir (its stderr into <run_dir>.stderr), left running."""
    command = [sys.executable, "-m", "headlab.cli.train", *SLOW_ENOUGH, f"hydra.run.dir={run_dir}"]
    stderr = (run_dir.parent / f"{run_dir.name}.stderr").open("w")
    return subprocess.Popen(
        command, cwd=run_dir.parent, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr
    )


def last_epoch(run_dir) -> int:
    path = run_dir / "checkpoints" / "last.ckpt"
    try:
        return torch.load(path, weights_only=True)["epoch"] if path.exists() else -1
    except Exception:  # being written right now
        return -1


@pytest.mark.e2e
def test_a_run_killed_mid_epoch_and_resumed_ends_like_the_run_left_alone(run_cli, tmp_path):
    alone = run_cli(*SLOW_ENOUGH, "hydra.run.dir=alone")
    assert alone.returncode == 0, alone.stderr[-2000:]

    killed = tmp_path / "killed"
    process = start_in_background(killed)
    saves, seen, deadline = 0, None, time.time() + 240
    while saves < 2 and process.poll() is None and time.time() < deadline:  # last.ckpt written after epochs 1, 2
        stamp = (
            (killed / "checkpoints" / "last.ckpt").stat().st_mtime_ns
            if (killed / "checkpoints" / "last.ckpt").exists()
            else None
        )
        saves, seen = saves + (stamp is not None and stamp != seen), stamp
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)  # in the third epoch, after the checkpoint of the second
    process.wait()
    assert last_epoch(killed) == 1
    assert json.loads((killed / "results.json").read_text())["status"] == "running"

    resumed = run_cli(*SLOW_ENOUGH, f"resume={killed}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    expected = json.loads((tmp_path / "alone" / "results.json").read_text())["metrics"]
    got = json.loads((killed / "results.json").read_text())
    assert got["status"] == "completed" and got["global_step"] == 4 * 188
    assert got["metrics"] == pytest.approx(expected, abs=1e-6)


FAULTED = [  # 32 training, 8 validation and 2 test batches an epoch, dropout on: a resume must continue exactly
    *TINY,
    "data.n_train=1024",
    "data.n_val=256",
    "model.dropout=0.1",
    "trainer.max_epochs=3",
    "trainer.deterministic=true",
    "logger=csv",
    "callbacks.attention.analysis_batches=4",
]


@pytest.fixture(scope="module")
def left_alone(tmp_path_factory) -> Path:
    """The run every interrupted one is compared with."""
    where = tmp_path_factory.mktemp("alone")
    alone = headlab_train(*FAULTED, "hydra.run.dir=run", cwd=where)
    assert alone.returncode == 0, alone.stderr[-2000:]
    return where / "run"


def metric_rows(run_dir) -> list[tuple]:
    """metrics.csv without the timing columns (perf/...), which no two runs share, and the training metrics
    averaged over an epoch (train/*_epoch, train/acc), which a resumed epoch averages over its steps after the
    resume only."""
    epoch_means = ("perf/", "train/loss_epoch", "train/acc")
    with open(run_dir / "metrics.csv", newline="") as f:
        return [tuple((k, v) for k, v in row.items() if not k.startswith(epoch_means)) for row in csv.DictReader(f)]


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("moment", "epoch", "batch", "last_step"),
    [
        ("train_batch", 1, 10, 32 + 11),  # saved where training stopped, between two steps
        ("validation_batch", 1, 2, 32),  # mid-validation: last.ckpt stays the one after epoch 0's validation
        ("train_end", 0, 0, 96),  # in the head analysis, after training
        ("test_batch", 0, 0, 96),  # in the test
    ],
)
def test_sigterm_at_any_moment_then_resume_ends_like_the_run_left_alone(
    left_alone, tmp_path, moment, epoch, batch, last_step
):
    fault = [
        "+callbacks.fault._target_=faults.SignalAt",
        f"+callbacks.fault.moment={moment}",
        f"+callbacks.fault.epoch={epoch}",
        f"+callbacks.fault.batch={batch}",
        f"+callbacks.fault.once_file={tmp_path / 'signalled'}",
    ]
    env = cli_env() | {"PYTHONPATH": str(Path(__file__).parent)}
    killed = headlab_train(*FAULTED, *fault, "hydra.run.dir=run", cwd=tmp_path, env=env)
    run = tmp_path / "run"
    assert killed.returncode == 128 + signal.SIGTERM, killed.stderr[-2000:]
    assert json.loads((run / "results.json").read_text())["status"] == "interrupted"
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == last_step

    resumed = headlab_train(f"resume={run}", cwd=tmp_path, env=env)  # the saved config, fault callback included
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    got, expected = (json.loads((d / "results.json").read_text()) for d in (run, left_alone))
    assert got["status"] == "completed" and got["global_step"] == expected["global_step"] == 96
    assert set(got["metrics"]) == set(expected["metrics"]) >= {"val/acc", "val/acc_best", "test/acc"}
    assert got["metrics"] == pytest.approx(expected["metrics"], abs=1e-6)
    assert Path(got["checkpoints"]["best"]).name == Path(expected["checkpoints"]["best"]).name
    heads, heads_alone = (json.loads((d / "heads.json").read_text()) for d in (run, left_alone))
    curve, curve_alone = heads["pruning_curve"], heads_alone["pruning_curve"]
    assert [p["pruned"] for p in curve] == [p["pruned"] for p in curve_alone]
    assert [p["metric"] for p in curve] == pytest.approx([p["metric"] for p in curve_alone], abs=1e-6)
    if moment in ("train_batch", "validation_batch"):  # the rows logged before the signal are kept, none twice
        assert metric_rows(run) == metric_rows(left_alone)


def test_last_checkpoint_follows_every_epoch_even_without_improvement(run_cli, tmp_path):
    """lr 1e-12: val/acc never improves after the first epoch, and last.ckpt must still hold the last epoch."""
    quiet = ["logger=csv", "callbacks.attention=null"]
    run = run_cli(*TINY, *quiet, "trainer.max_epochs=3", "optim.lr=1e-12", "hydra.run.dir=r")
    assert run.returncode == 0, run.stderr[-2000:]
    checkpoints = tmp_path / "r" / "checkpoints"
    assert last_epoch(tmp_path / "r") == 2
    assert [p.name for p in checkpoints.glob("best-*.ckpt")] == ["best-epoch0-step8.ckpt"]


def test_resume_with_a_different_config_is_refused(run_cli, tmp_path):
    first = run_cli(*TINY, "trainer.max_epochs=1", "logger=csv", "callbacks.attention=null", "hydra.run.dir=run")
    assert first.returncode == 0
    changed = run_cli(
        *TINY,
        "trainer.max_epochs=1",
        "logger=csv",
        "callbacks.attention=null",
        "model.attention.n_heads=2",
        f"resume={tmp_path / 'run'}",
    )
    assert changed.returncode == 2
    assert changed.stderr.strip() == (
        f"headlab-train: invalid config: model.attention.n_heads=2 is invalid: expected 4 as in the run being "
        f"resumed ({tmp_path / 'run'})"
    )
    missing = run_cli(*TINY, f"resume={tmp_path / 'nothing'}")
    assert missing.returncode == 2 and "expected a run directory with checkpoints/last.ckpt" in missing.stderr


@pytest.mark.e2e
def test_sigterm_saves_a_checkpoint_and_the_requeued_slurm_job_resumes_from_it(tmp_path):
    run = tmp_path / "run"
    process = start_in_background(run)
    deadline = time.time() + 240
    while last_epoch(run) < 0 and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)  # how SLURM preempts
    process.wait(timeout=120)
    stderr = (tmp_path / "run.stderr").read_text()
    assert process.returncode == 128 + signal.SIGTERM
    record = json.loads((run / "results.json").read_text())
    assert record["status"] == "interrupted", stderr[-2000:]
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] % 188 != 0  # saved where training stopped, in the middle of an epoch

    # SLURM requeues the preempted job: the same command in the same directory, SLURM_RESTART_COUNT=1
    env = cli_env() | {"SLURM_RESTART_COUNT": "1"}
    requeued = headlab_train(*SLOW_ENOUGH, f"hydra.run.dir={run}", cwd=tmp_path, env=env)
    assert requeued.returncode == 0, requeued.stderr[-2000:]
    record = json.loads((run / "results.json").read_text())
    assert record["status"] == "completed" and record["config"]["resume"] == str(run)
    assert record["global_step"] == 4 * 188  # went on from the saved step instead of starting again
    assert f"requeued by SLURM: resuming {run}" in requeued.stdout


@pytest.mark.e2e
def test_a_finished_run_reproduces_exactly_from_its_saved_config_with_dataloader_workers(run_cli, tmp_path):
    first = run_cli(
        *TINY, "data.num_workers=2", "model.dropout=0.1", "trainer.deterministic=true", "logger=csv", "hydra.run.dir=a"
    )
    assert first.returncode == 0, first.stderr[-2000:]
    again = run_cli("--config-dir", str(tmp_path / "a" / ".hydra"), "--config-name", "config", "hydra.run.dir=b")
    assert again.returncode == 0, again.stderr[-2000:]
    a, b = (json.loads((tmp_path / d / "results.json").read_text()) for d in "ab")
    assert b["status"] == "completed" and b["global_step"] == a["global_step"]
    assert b["metrics"] == a["metrics"]  # bit for bit: same data, initialisation, worker shuffles and dropout


def test_a_non_finite_loss_stops_the_run_with_one_true_line(run_cli, tmp_path):
    result = run_cli(*TINY, "logger=csv", "optim.lr=1e30", "trainer.gradient_clip_val=null", "hydra.run.dir=run")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("headlab-train")]
    assert (
        lines
        == [
            "headlab-train: training stopped: non-finite training loss at step 1; lower optim.lr or keep "
            "trainer.gradient_clip_val; no checkpoint was written before it"
        ]
        and "Traceback" not in result.stderr
    )
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert record["status"] == "failed" and record["error"].startswith("TrainingError: non-finite training loss")


@settings(max_examples=40, deadline=None)
@given(
    n_heads=st.integers(1, 8),
    d_k=st.one_of(st.none(), st.integers(1, 24)),
    d_v=st.one_of(st.none(), st.integers(1, 24)),
    kv_divisor=st.integers(1, 8),
    scoring=st.sampled_from(["dot", "additive"]),
    scale=st.booleans(),
    need_weights=st.booleans(),
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4),
)
def test_random_valid_attention_configurations_run_forward_and_backward(
    n_heads, d_k, d_v, kv_divisor, scoring, scale, need_weights, lengths
):
    d_model = 8 * n_heads  # divisible by n_heads, so d_k = null is valid
    n_kv_heads = n_heads // kv_divisor if n_heads % kv_divisor == 0 else None
    mha = MultiHeadAttention(d_model, n_heads, d_k, d_v, n_kv_heads, scoring, scale, dropout=0.1)
    n = max(lengths)
    x = torch.randn(len(lengths), n, d_model, requires_grad=True)
    mask = torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]
    out, weights = mha(x, key_padding_mask=mask, need_weights=need_weights)
    out.square().mean().backward()
    assert out.shape == x.shape and torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    if need_weights:
        assert torch.isfinite(weights).all() and torch.all(weights.masked_select(mask[:, None, None, :]) == 0)


@pytest.mark.e2e
def test_resume_alone_continues_and_a_refused_resume_leaves_the_run_as_it_was(run_cli, tmp_path):
    first = run_cli(*TINY, "logger=csv", "model.attention.n_heads=2", "seed=3", "hydra.run.dir=run")
    assert first.returncode == 0, first.stderr[-2000:]
    run = tmp_path / "run"
    record = (run / "results.json").read_bytes()

    differs = run_cli(f"resume={run}", "model.attention.n_heads=4")  # not the run's configuration
    assert differs.returncode == 2 and "model.attention.n_heads=4 is invalid: expected 2" in differs.stderr
    assert (run / "results.json").read_bytes() == record

    last = run / "checkpoints" / "last.ckpt"
    whole = last.read_bytes()
    last.write_bytes(whole[: len(whole) // 2])  # a checkpoint cut short (a full disk, say)
    truncated = run_cli(f"resume={run}")
    assert truncated.returncode == 2 and "resume=" in truncated.stderr and "Traceback" not in truncated.stderr
    assert (run / "results.json").read_bytes() == record
    last.write_bytes(whole)

    alone = run_cli(f"resume={run}")  # no overrides: the configuration the run saved
    assert alone.returncode == 0, alone.stderr[-2000:]
    after = json.loads((run / "results.json").read_text())
    before = json.loads(record)
    assert after["status"] == "completed" and after["config"] == {**before["config"], "resume": str(run)}
    assert after["metrics"]["test/acc"] == before["metrics"]["test/acc"]


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MB tmpfs (skipped where this process cannot mount one)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.e2e
def test_a_full_disk_stops_the_run_in_one_line_and_leaves_whole_checkpoints(run_cli, tmp_path, small_disk):
    quiet = [*TINY, "logger=csv", "callbacks.attention=null", "trainer.max_epochs=3", "optim.lr=1e-2"]
    sized = run_cli(*quiet, "trainer.max_epochs=1", "hydra.run.dir=sized")
    assert sized.returncode == 0, sized.stderr[-2000:]
    size = (tmp_path / "sized" / "checkpoints" / "last.ckpt").stat().st_size
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    (small_disk / "filler").write_bytes(b"\0" * (free - int(2.5 * size) - 64 * 1024))  # room for epoch 0's two

    full = run_cli(*quiet, f"hydra.run.dir={small_disk / 'run'}")
    run = small_disk / "run"
    errors = [line for line in full.stderr.splitlines() if line.startswith("headlab-train")]
    assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr[-2000:]
    assert len(errors) == 1 and errors[0].startswith("headlab-train: training stopped: no space left on the device")
    assert json.loads((run / "results.json").read_text())["status"] == "failed"
    assert not list(run.rglob("*.tmp"))  # no half-written temporary file left behind
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["epoch"] == 0  # whole, loadable

    (small_disk / "filler").unlink()  # space again: the run resumes from its last whole checkpoint
    resumed = run_cli(f"resume={run}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((run / "results.json").read_text())["status"] == "completed"
