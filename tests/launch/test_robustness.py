"""Interrupts and kills at any moment then resume, a full disk, non-finite losses, and random valid attention
configurations."""

import csv
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import PACKED, TESTS, TINY, as_interrupted, cli_env, cli_here, headlab_train, train_here
from headlab.model.attention import MultiHeadAttention


def last_epoch(run_dir) -> int:
    path = run_dir / "checkpoints" / "last.ckpt"
    try:
        return torch.load(path, weights_only=True)["epoch"] if path.exists() else -1
    except Exception:  # being written right now
        return -1


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
    """The run every interrupted one is compared with, with the faulted runs' callback (a run's own: faults.SignalAt)
    never due."""
    where = tmp_path_factory.mktemp("alone")
    never = signal_at(where, "train_batch", epoch=99)
    alone = train_here(*FAULTED, *never, "hydra.run.dir=run", cwd=where, env=FAULTS_ENV)
    assert alone.returncode == 0, alone.stderr[-2000:]
    return where / "run"


def metric_rows(run_dir) -> list[tuple]:
    """metrics.csv without the timing columns (perf/...), which no two runs share, and the training metrics
    averaged over an epoch (train/*_epoch, train/acc), which a resumed epoch averages over its steps after the
    resume only."""
    epoch_means = ("perf/", "train/loss_epoch", "train/acc")
    with open(run_dir / "metrics.csv", newline="") as f:
        return [tuple((k, v) for k, v in row.items() if not k.startswith(epoch_means)) for row in csv.DictReader(f)]


def signal_at(tmp_path, moment: str, epoch: int = 0, batch: int = 0, signum: int = signal.SIGTERM) -> list[str]:
    """Overrides that make a run signal itself once at that moment (faults.SignalAt)."""
    return [
        "+callbacks.fault._target_=faults.SignalAt",
        f"+callbacks.fault.moment={moment}",
        f"+callbacks.fault.epoch={epoch}",
        f"+callbacks.fault.batch={batch}",
        f"+callbacks.fault.signum={int(signum)}",
        f"+callbacks.fault.once_file={tmp_path / 'signalled'}",
    ]


FAULTS_ENV = cli_env() | {"PYTHONPATH": str(TESTS)}  # faults.py importable by the CLI


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("moment", "epoch", "batch", "signum", "status", "last_step"),
    [
        ("train_batch", 1, 10, signal.SIGTERM, "interrupted", 32 + 11),  # saved between two training steps
        ("train_batch", 1, 10, signal.SIGKILL, "running", 32),  # nothing saved: the last validation's last.ckpt
        ("validation_batch", 1, 2, signal.SIGTERM, "interrupted", 32),  # mid-validation: the previous last.ckpt
        ("train_end", 0, 0, signal.SIGTERM, "interrupted", 96),  # in the head analysis, after training
        ("test_batch", 0, 0, signal.SIGTERM, "interrupted", 96),  # in the test
    ],
)
def test_a_signal_at_any_moment_then_resume_ends_like_the_run_left_alone(
    left_alone, tmp_path, moment, epoch, batch, signum, status, last_step
):
    fault = signal_at(tmp_path, moment, epoch, batch, signum)
    killed = headlab_train(*FAULTED, *fault, "hydra.run.dir=run", cwd=tmp_path, env=FAULTS_ENV)
    run = tmp_path / "run"
    assert killed.returncode in (128 + signum, -signum), killed.stderr[-2000:]
    assert json.loads((run / "results.json").read_text())["status"] == status
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == last_step

    # its saved config, fault included: a class of the tests, which a run directory is not trusted to name (a
    # resume without it on the command line is refused), so named again here
    refused = train_here(f"resume={run}", cwd=tmp_path, env=FAULTS_ENV)
    assert refused.returncode == 2 and "callbacks.fault._target_='faults.SignalAt' is invalid" in refused.stderr
    resumed = train_here(f"resume={run}", "callbacks.fault._target_=faults.SignalAt", cwd=tmp_path, env=FAULTS_ENV)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    got, expected = (json.loads((d / "results.json").read_text()) for d in (run, left_alone))
    assert got["status"] == "completed" and got["global_step"] == expected["global_step"] == 96
    (signalled,) = got["attempts"]  # the attempt the signal stopped counts in the run's time (killed: to its last word)
    assert signalled["status"] == {"interrupted": "interrupted", "running": "ended without a word"}[status]
    assert signalled["duration_s"] >= 0
    total = got["duration_s"] + signalled["duration_s"]
    assert f"{run}: completed in {total:.0f} s over 2 attempts" in resumed.stdout
    # the real training tokens each validation had seen: counted on across the signal, none twice
    assert [(p["step"], p["tokens"]) for p in got["curve"]] == [(p["step"], p["tokens"]) for p in expected["curve"]]
    # train/acc and train/loss_epoch of a resumed epoch average over the steps after the resume only, and a run
    # resumed after its training ended has none
    held_out = {k: v for k, v in got["metrics"].items() if not k.startswith("train/")}
    assert set(held_out) == {k for k in expected["metrics"] if not k.startswith("train/")}
    assert set(held_out) >= {"val/acc", "val/acc_best", "test/acc"}
    assert held_out == pytest.approx({k: expected["metrics"][k] for k in held_out}, abs=1e-6)
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
    as_interrupted(tmp_path / "run")
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
    assert (
        missing.returncode == 2
        and "expected a run directory of headlab-train (with .hydra/config.yaml or checkpoints/last.ckpt)"
        in missing.stderr
    )


@pytest.mark.e2e
def test_a_requeued_slurm_job_resumes_from_the_checkpoint_its_sigterm_saved(tmp_path):
    fault = signal_at(tmp_path, "train_batch", epoch=1, batch=10)  # how SLURM preempts
    first = headlab_train(*FAULTED, *fault, "hydra.run.dir=run", cwd=tmp_path, env=FAULTS_ENV)
    run = tmp_path / "run"
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-2000:]
    assert json.loads((run / "results.json").read_text())["status"] == "interrupted"

    # SLURM requeues the preempted job: the same command in the same directory, SLURM_RESTART_COUNT=1
    env = FAULTS_ENV | {"SLURM_RESTART_COUNT": "1"}
    requeued = train_here(*FAULTED, *fault, f"hydra.run.dir={run}", cwd=tmp_path, env=env)
    assert requeued.returncode == 0, requeued.stderr[-2000:]
    record = json.loads((run / "results.json").read_text())
    assert record["status"] == "completed" and record["config"]["resume"] == str(run)
    assert record["global_step"] == 96  # went on from the saved step 43 instead of starting again
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


@pytest.mark.parametrize(
    ("overrides", "cause"),
    [
        (["optim.lr=1e30", "trainer.gradient_clip_val=null"], "optim.lr=1e+30, trainer.gradient_clip_val=null"),
        (["optim.weight_decay=3000"], "optim.weight_decay=3000 (times optim.lr=0.003: 9 >= 1"),
    ],
)
def test_a_non_finite_loss_stops_the_run_with_one_true_line_naming_its_cause(run_cli, tmp_path, overrides, cause):
    result = run_cli(*TINY, "logger=csv", *overrides, "hydra.run.dir=run")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("headlab-train")]
    assert line.startswith("headlab-train: training stopped: non-finite training objective at step ")
    assert "(its cross-entropy); what can cause it, as set: " + cause in line
    assert line.endswith("no checkpoint was written before it") or "holds the last validated epoch" in line
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert record["status"] == "failed" and record["error"].startswith("TrainingError: non-finite training objective")


@pytest.mark.parametrize(
    "launch",
    [
        ["model.attention.normalizer=sigmoid", "hydra.run.dir=run"],
        ["model.attention.differential=true", "seed=0,1", *PACKED, "hydra.sweep.dir=sweep"],
    ],
)
def test_a_run_whose_last_update_makes_its_model_not_finite_never_ends_completed(run_cli, tmp_path, launch):
    """One training step at a learning rate of 1e30: the training loss of that step is finite, the model after it
    is not. A single run and every member of a pack end failed ("diverged", naming the metrics), never completed;
    compare leaves them out; the records are valid JSON (no NaN)."""
    packed = "hydra/launcher=packed" in launch
    one_step = ["trainer.max_epochs=1", "++trainer.limit_train_batches=1", "optim.lr=1e30"]
    result = run_cli(*(["-m"] if packed else []), *TINY, "logger=csv", *one_step, "callbacks.attention=null", *launch)
    runs = [tmp_path / "sweep" / j for j in "01"] if packed else [tmp_path / "run"]
    for run in runs:
        text = (run / "results.json").read_text()
        assert "NaN" not in text
        record = json.loads(text)
        assert record["status"] == "failed", record["status"]
        assert record["error"].startswith("TrainingError: diverged: val/loss nan") and "not finite" in record["error"]
    if not packed:
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith("headlab-train: training stopped: diverged: ")
        evaluated = cli_here("eval", "run", "--checkpoint", "last", cwd=tmp_path)
        assert evaluated.returncode == 1 and "headlab-eval: test/loss not finite" in evaluated.stderr
        assert json.loads((tmp_path / "run" / "eval" / "test-last.json").read_text())["metrics"]["test/loss"] is None
    else:
        assert "0 of 2 jobs completed" in result.stdout + result.stderr


@pytest.mark.parametrize(
    "key, value, said",
    [
        ("normalizer", "sigmoid", "model.attention.normalizer='softmax', and the run's config says 'sigmoid'"),
        ("scale", False, "model.attention.scale=true, and the run's config says false"),
    ],
)
def test_a_resume_under_another_design_than_its_checkpoints_is_refused(run_cli, tmp_path, key, value, said):
    """A received run whose .hydra/config.yaml and results.json both say another design than its checkpoint was
    trained with (one that adds no parameter, so no shape differs): the checkpoint records its design, and the
    resume is refused in one line, the run's files as they were."""
    import yaml

    first = run_cli(*TINY, "logger=csv", "trainer.max_epochs=1", "callbacks.attention=null", "hydra.run.dir=run")
    assert first.returncode == 0, first.stderr[-2000:]
    run = tmp_path / "run"
    record = json.loads((run / "results.json").read_text())
    record["status"] = "interrupted"
    record["config"][f"model.attention.{key}"] = value
    (run / "results.json").write_text(json.dumps(record))
    config = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    config["model"]["attention"][key] = value
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    files = lambda: {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "train.log"}  # noqa: E731
    before = files()
    resumed = run_cli(f"resume={run}")
    assert resumed.returncode == 2 and "Traceback" not in resumed.stderr, resumed.stderr[-2000:]
    line = resumed.stderr.strip().splitlines()[-1]
    assert "is invalid: expected a checkpoint of this design: it trained with " + said in line, line
    assert files() == before  # train.log aside, which says what each attempt did


@settings(max_examples=60, deadline=None)
@given(
    n_heads=st.integers(1, 8),
    d_k=st.one_of(st.none(), st.integers(1, 24)),
    d_v=st.one_of(st.none(), st.integers(1, 24)),
    kv_divisor=st.integers(1, 8),
    scoring=st.sampled_from(["dot", "additive"]),
    scale=st.booleans(),
    need_weights=st.booleans(),
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    design=st.fixed_dictionaries(
        {
            "gate": st.sampled_from(["none", "headwise", "elementwise"]),
            "talking_heads": st.sampled_from(["none", "pre", "post", "both"]),
            "differential": st.booleans(),
            "normalizer": st.sampled_from(["softmax", "sigmoid", "softmax1", "sink"]),
            "qk_norm": st.booleans(),
            "latent_kv": st.one_of(st.none(), st.integers(1, 12)),
        }
    ),
)
def test_random_valid_attention_configurations_run_forward_and_backward(
    n_heads, d_k, d_v, kv_divisor, scoring, scale, need_weights, lengths, design
):
    if design["differential"]:  # a differential head: softmax maps, no talking heads (headlab.model.rules.designs)
        design = {**design, "talking_heads": "none", "normalizer": "softmax"}
    d_model = 8 * n_heads  # divisible by 2 n_heads, so d_k = null is valid
    n_kv_heads = n_heads // kv_divisor if n_heads % kv_divisor == 0 else None
    mha = MultiHeadAttention(d_model, n_heads, d_k, d_v, n_kv_heads, scoring, scale, dropout=0.1, **design)
    n = max(lengths)
    x = torch.randn(len(lengths), n, d_model, requires_grad=True)
    mask = torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]
    out, weights = mha(x, key_padding_mask=mask, need_weights=need_weights)
    out.square().mean().backward()
    assert out.shape == x.shape and torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    if need_weights:
        assert torch.isfinite(weights).all() and torch.all(weights.masked_select(mask[:, None, None, :]) == 0)


SHORT_EPOCHS = [*FAULTED, "++trainer.limit_train_batches=10"]  # epochs of 10 of the loader's 32 batches


@pytest.fixture(scope="module")
def short_epochs_alone(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("short")
    alone = train_here(*SHORT_EPOCHS, "hydra.run.dir=run", cwd=where)
    assert alone.returncode == 0, alone.stderr[-2000:]
    return where / "run"


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("moment", "epoch", "batch", "between"),
    [
        ("train_batch", 1, 0, ""),  # the first step after epoch 0's checkpoints (an epoch shorter than its loader)
        ("checkpoint", 0, 0, ""),  # epoch 0's checkpoints being made, none written yet: no last.ckpt at all
        ("checkpoint", 0, 1, ""),  # epoch 1's being made: epoch 0's last.ckpt and best checkpoint
        ("checkpoint", 0, 1, "best"),  # killed after epoch 1's best checkpoint was written, before its last.ckpt
        ("checkpoint", 0, 1, "best, the previous removed"),  # ... and after epoch 0's best was removed
    ],
)
def test_a_kill_at_any_moment_around_a_checkpoint_then_resume_ends_like_the_run_left_alone(
    short_epochs_alone, tmp_path, moment, epoch, batch, between
):
    fault = signal_at(tmp_path, moment, epoch, batch, signal.SIGKILL)
    killed = headlab_train(*SHORT_EPOCHS, *fault, "hydra.run.dir=run", cwd=tmp_path, env=FAULTS_ENV)
    assert killed.returncode == -signal.SIGKILL
    checkpoints = tmp_path / "run" / "checkpoints"
    if between:  # what a kill between a validation's files leaves (each written whole or not at all): a best
        # checkpoint of epoch 1 (its stand-in: epoch 0's weights), which the resume repeats and writes again
        shutil.copy(checkpoints / "last.ckpt", checkpoints / "best-epoch1-step20.ckpt")
        if "removed" in between:
            (checkpoints / "best-epoch0-step10.ckpt").unlink()
    resumed = train_here("resume=run", "callbacks.fault._target_=faults.SignalAt", cwd=tmp_path, env=FAULTS_ENV)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    run = tmp_path / "run"
    ours, theirs = (json.loads((d / "results.json").read_text()) for d in (run, short_epochs_alone))
    for key in ("val/acc", "val/acc_best", "test/acc", "test/loss"):
        assert ours["metrics"][key] == theirs["metrics"][key], key
    assert Path(ours["checkpoints"]["best"]).name == Path(theirs["checkpoints"]["best"]).name
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == sorted(
        p.name for p in (short_epochs_alone / "checkpoints").iterdir()
    )


@pytest.mark.e2e
def test_resume_alone_continues_and_a_refused_resume_leaves_the_run_as_it_was(run_cli, tmp_path):
    first = run_cli(*TINY, "logger=csv", "model.attention.n_heads=2", "seed=3", "hydra.run.dir=run")
    assert first.returncode == 0, first.stderr[-2000:]
    run = as_interrupted(tmp_path / "run")
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
    assert run_cli(f"resume={run}").returncode == 2  # completed now: its records are final
    assert after["metrics"]["test/acc"] == before["metrics"]["test/acc"]


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
