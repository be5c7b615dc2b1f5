"""The real CLI end to end: what a run writes (docs/runs.md)."""

import json
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_module

from conftest import PACKED, TINY, cli_env, headlab_train

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["data=listops", "model.attention.scoring=additive", "model.n_layers=2", "model.norm=pre"],
        ["data=mqar", "model.attention.n_kv_heads=1", "model.positional=learned"],
    ],
    ids=["default", "listops-additive", "mqar-multiquery"],
)
def test_run_writes_results_config_and_checkpoints(run_cli, tmp_path, overrides):
    result = run_cli(*TINY, "logger=csv", *overrides, "hydra.run.dir=run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "it/s" not in result.stdout + result.stderr  # callbacks.progress_bar=null: no bar (not Lightning's own)
    run = tmp_path / "run"
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "completed"
    assert {"val/acc", "val/loss", "val/acc_best", "test/acc", "test/loss"} <= results["metrics"].keys()
    assert all(0 <= results["metrics"][k] <= 1 for k in ("val/acc", "test/acc"))
    assert results["config"]["model.d_model"] == 16 and results["config"]["data"] in ("pair_recall", "listops", "mqar")
    assert results["params"]["total"] > results["params"]["attention"] > 0
    assert results["flops_per_token"] > 6 * results["params"]["attention"]
    assert results["throughput"]["train_tokens_per_s"] > 0
    assert results["seed"] == 0 and results["duration_s"] > 0 and results["wandb"] == {"id": None, "url": None}
    assert {"torch", "lightning", "hydra-core"} <= results["versions"].keys()
    assert (run / ".hydra" / "config.yaml").exists() and (run / "metrics.csv").exists()
    assert (run / "checkpoints" / "last.ckpt").exists()
    best = results["checkpoints"]["best"]
    checkpoint = torch.load(best, weights_only=True)  # loads without executing code
    assert any(k.startswith("model.blocks.0.attn.q_proj") for k in checkpoint["state_dict"])


def test_results_mark_a_crashed_run_failed(run_cli, tmp_path):
    result = run_cli(*TINY, "trainer.accelerator=tpu", "hydra.run.dir=run")
    assert result.returncode != 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "failed" and "torch_xla" in results["error"]


def test_console_script_help_answers():
    script = subprocess.run(
        [sys.executable, "-c", "from headlab.cli.train import cli; cli()", "--help"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert (
        script.returncode == 0
        and "model" in script.stdout
        and "listops, mpqa, mqar, mr, pair_recall, sst2, sst5, subj, trec" in script.stdout
    )


def test_experiment_sweeps_compose():
    with initialize_config_module("headlab.conf", version_base="1.3"):
        cfg = compose("train", overrides=["experiment=heads_vs_depth"], return_hydra_config=True)
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert cfg.hydra.sweeper.params["model.attention.n_heads"] == "1,4"


def test_text_data_brings_its_own_model_defaults_and_what_is_given_still_wins():
    with initialize_config_module("headlab.conf", version_base="1.3"):
        files = compose("train", overrides=["data=files", "data.files.train=train.tsv"])
        hub = compose("train", overrides=["data=trec"])
        generated = compose("train", overrides=["data=listops"])
        given = compose("train", overrides=["data=sst2", "model.d_model=32", "trainer.max_epochs=2"])
        recipe = compose("train", overrides=["experiment=sst2_recipe"])

    def defaults(cfg) -> tuple:
        model = cfg.model
        return (
            model.d_model,
            model.attention.n_heads,
            model.dropout,
            model.readout,
            cfg.optim.weight_decay,
            cfg.optim.rdrop,
            cfg.trainer.max_epochs,
        )

    assert defaults(files) == defaults(hub) == (128, 16, 0.3, "mean", 0.1, 3.0, "auto")
    assert defaults(generated) == (64, 4, 0.0, None, 0.01, 0.0, 5)
    assert defaults(given) == (32, 16, 0.3, "mean", 0.1, 3.0, 2)
    assert defaults(recipe) == (256, 4, 0.3, "mean", 0.1, 0.0, 4)


def test_multirun_writes_one_directory_per_job(run_cli, tmp_path):
    result = run_cli("-m", *TINY, "trainer.max_epochs=1", "model.attention.n_heads=1,2", "hydra.sweep.dir=sweep")
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(p.parent.name for p in (tmp_path / "sweep").glob("*/results.json"))
    assert jobs == ["0", "1"]
    heads = {
        json.loads((tmp_path / "sweep" / j / "results.json").read_text())["config"]["model.attention.n_heads"]
        for j in jobs
    }
    assert heads == {1, 2}


def test_hydra_mode_makes_a_sweep_without_m_and_m_makes_one_whatever_it_says(run_cli, tmp_path):
    """Without -m the config's hydra.mode decides (an experiment's MULTIRUN makes it a sweep); with -m the command is
    a sweep even where hydra.mode says RUN. model.d_model=-1: each job is refused before anything trains."""
    for mode, flag in (("MULTIRUN", []), ("RUN", ["-m"])):
        done = run_cli(*flag, f"hydra.mode={mode}", "seed=0,1", "model.d_model=-1", f"hydra.sweep.dir={mode}")
        assert done.returncode == 1 and "2 of 2 jobs did not complete" in done.stderr, done.stderr[-2000:]
        assert sorted(p.name for p in (tmp_path / mode).iterdir() if p.name.isdigit()) == ["0", "1"]


def test_several_loggers_at_once(run_cli, tmp_path):
    result = run_cli(*TINY, "trainer.max_epochs=1", "logger=[csv,tensorboard,wandb]", "hydra.run.dir=run")
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    assert {"epoch", "val/acc", "test/acc"} <= set((run / "metrics.csv").read_text().splitlines()[0].split(","))
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert list(run.glob("wandb/offline-run-*/run-*.wandb"))


def test_a_compiled_mixed_precision_pack_compiles_once_per_loop_for_all_members_and_writes_eager_checkpoints(
    tmp_path,
):
    """bf16-mixed on the CPU, compiled, two seeds packed: one graph of the members' forward for validation, one for
    training, one for test (inference tensors), each serving both members; the head analysis (outside autocast,
    weights returned, heads masked) runs eagerly and adds none. (A run alone is a pack of one: the same code.)"""
    env = {**cli_env(), "TORCH_LOGS": "recompiles"}
    overrides = [*TINY, "model.compile=true", "+trainer.precision=bf16-mixed", "logger=csv", "seed=0,1"]
    result = headlab_train("-m", *PACKED, *overrides, "hydra.sweep.dir=sweep", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    # the launcher's estimate times the compiled step of a pack of one first (cost.measure), in the run's precision:
    # the training graph, which the pack's members then run; validation's and test's are compiled again, once each
    assert result.stderr.count("Recompiling function member_forward") == 2, result.stderr[-3000:]
    assert "not supported by the model summary" not in result.stderr  # mixed precision keeps float32 weights
    for job in ("0", "1"):
        record = json.loads((tmp_path / "sweep" / job / "results.json").read_text())
        assert record["status"] == "completed" and record["config"]["model.compile"] is True
        assert record["pack"]["size"] == 2
        assert record["pack"]["compute"] == "each" and "compute_step_s" not in record["pack"]  # compiled: untimed
        assert json.loads((tmp_path / "sweep" / job / "heads.json").read_text())["rows"]
        saved = torch.load(record["checkpoints"]["best"], weights_only=True)["state_dict"]
        assert "model.tok_emb.weight" in saved and not any("_orig_mod" in k for k in saved)  # loads uncompiled


def test_the_progress_bar_reads_the_metrics_every_n_steps_not_every_batch(monkeypatch, tmp_path):
    """Each read of the logged metrics is a host-device synchronisation on a GPU: Lightning's rich bar reads
    them after every batch, headlab's every n optimizer steps and at each epoch's and validation's end, so the
    last numbers shown are the final ones."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import RichProgressBar

    from headlab.training.build import build
    from headlab.training.module import HeadLabModule
    from headlab.training.progress import ProgressBar

    reads = []
    original = RichProgressBar.get_metrics
    monkeypatch.setattr(RichProgressBar, "get_metrics", lambda self, *a: reads.append(1) or original(self, *a))
    with initialize_config_module("headlab.conf", version_base="1.3"):
        cfg = compose("train", overrides=[o for o in TINY if not o.startswith(("trainer", "callbacks"))])
    counts = {}
    for bar in (RichProgressBar(), ProgressBar(every_n_steps=4)):
        torch.manual_seed(0)
        datamodule, model = build(cfg)
        trainer = pl.Trainer(
            max_epochs=2, callbacks=[bar], logger=False, enable_checkpointing=False, default_root_dir=tmp_path
        )
        reads.clear()
        trainer.fit(HeadLabModule(model, datamodule.n_classes), datamodule=datamodule)
        counts[type(bar).__name__] = len(reads)
    steps = trainer.global_step  # 8 per epoch
    assert counts["RichProgressBar"] >= steps
    assert counts["ProgressBar"] <= steps // 4 + 3 * 2  # every 4 steps, plus the ends of 2 epochs and validations
    assert "val/acc" in bar._shown and "train/loss_step" in bar._shown


@pytest.mark.parametrize(
    "tool, argv, said",
    [
        ("bench", ["--repeats", "0"], "argument --repeats: '0' is invalid: expected an integer >= 1"),
        ("bench", ["--batch", "-1"], "argument --batch: '-1' is invalid: expected an integer >= 1"),
        ("bench", ["--seq", "x"], "argument --seq: 'x' is invalid: expected an integer >= 1"),
        ("bench", ["--memory-seq", "0"], "argument --memory-seq: '0' is invalid: expected an integer >= 1"),
        ("bench", ["--sweep-jobs", "0"], "argument --sweep-jobs: '0' is invalid: expected an integer >= 1"),
        ("heads", ["RUN", "--n-probe", "-3"], "argument --n-probe: '-3' is invalid: expected an integer >= 0"),
        ("status", ["RUN", "--stale", "nan"], "argument --stale: 'nan' is invalid: expected a finite number > 0"),
        ("status", ["RUN", "--stale", "-1"], "argument --stale: '-1' is invalid: expected a finite number > 0"),
    ],
)
def test_a_bad_option_value_is_one_line_where_it_is_parsed(tool, argv, said, tmp_path, capsys):
    """Every numeric option of the tools is checked by argparse itself: its one line, exit 2, nothing run."""
    import importlib

    main = importlib.import_module(f"headlab.cli.{tool}").main
    with pytest.raises(SystemExit) as stopped:
        main([*argv, *(["--out", str(tmp_path / "B.md")] if tool == "bench" else [])])
    assert stopped.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"headlab-{tool}: error: {said}"
    assert not (tmp_path / "B.md").exists()
