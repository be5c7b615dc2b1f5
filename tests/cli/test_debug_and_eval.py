"""The conveniences of lightning-hydra-template: the debug config group, early stopping as a callback config, and
headlab-eval (any checkpoint of a run on any split)."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import TINY, cli_here, train_here

pytestmark = pytest.mark.e2e


def results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())


def test_debug_fast_runs_one_batch_of_everything_without_checkpoints_or_loggers(run_cli, tmp_path):
    result = run_cli(*TINY, "debug=fast", "logger=wandb", "hydra.run.dir=run")
    assert result.returncode == 0, result.stderr[-3000:]
    record = results(tmp_path / "run")
    assert record["status"] == "completed" and record["global_step"] == 1
    assert {"val/acc", "test/acc"} <= set(record["metrics"]) and record["checkpoints"]["best"] is None
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "wandb").exists()
    assert json.loads((tmp_path / "run" / "heads.json").read_text())["checkpoint"] is None  # the weights trained


def test_debug_overfit_memorises_one_batch(run_cli, tmp_path):
    result = run_cli("debug=overfit", "callbacks.progress_bar=null", "hydra.run.dir=run")
    assert result.returncode == 0, result.stderr[-3000:]
    record = results(tmp_path / "run")
    assert record["global_step"] == 100 and record["metrics"]["train/acc"] == 1.0


def test_debug_profile_writes_the_profilers_report(run_cli, tmp_path):
    result = run_cli(*[o for o in TINY if "max_epochs" not in o], "debug=profile", "hydra.run.dir=run")
    assert result.returncode == 0, result.stderr[-3000:]
    report = (tmp_path / "run" / "fit-profile.txt").read_text()
    assert "run_training_batch" in report and "[LightningModule]PackedModule.optimizer_step" in report
    assert results(tmp_path / "run")["epochs"] == 1


def test_early_stopping_ends_training_once_validation_stops_improving(run_cli, tmp_path):
    overrides = ["callbacks=early_stopping", "callbacks.early_stopping.patience=1", "trainer.max_epochs=30"]
    result = run_cli(*TINY, *overrides, "logger=csv", "hydra.run.dir=run")
    assert result.returncode == 0, result.stderr[-3000:]
    record = results(tmp_path / "run")
    assert record["status"] == "completed" and record["epochs"] < 30
    rows = [r.split(",") for r in (tmp_path / "run" / "metrics.csv").read_text().splitlines()]
    column = rows[0].index("val/acc")
    accs = [float(r[column]) for r in rows[1:] if r[column]]
    assert len(accs) == record["epochs"] and accs[-1] <= max(accs[:-1])  # the last validation did not improve
    assert record["metrics"]["val/acc_best"] == pytest.approx(max(accs))


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("eval")
    result = train_here(*TINY, "logger=none", "hydra.run.dir=run", cwd=where)
    assert result.returncode == 0, result.stderr[-3000:]
    return where / "run"


def headlab_eval(*args: str) -> subprocess.CompletedProcess:
    return cli_here("eval", *args, cwd=Path.cwd())


def test_eval_of_the_best_checkpoint_repeats_the_runs_own_numbers(finished):
    for split, key in (("test", "test/acc"), ("val", "val/acc_best")):
        result = headlab_eval(str(finished), split)
        assert result.returncode == 0, result.stderr[-3000:]
        best = Path(results(finished)["checkpoints"]["best"])
        written = json.loads((finished / "eval" / f"{split}-{best.stem}.json").read_text())
        assert written["metrics"][f"{split}/acc"] == pytest.approx(results(finished)["metrics"][key], abs=1e-7)
        assert written["checkpoint"] == str(best) and f"{split}/acc\t" in result.stdout


def test_eval_of_any_checkpoint_on_the_training_split(finished):
    result = headlab_eval(str(finished), "train", "--checkpoint", "last")
    assert result.returncode == 0, result.stderr[-3000:]
    written = json.loads((finished / "eval" / "train-last.json").read_text())
    assert written["examples"] == 256 and 0 <= written["metrics"]["train/acc"] <= 1
    last = torch.load(finished / "checkpoints" / "last.ckpt", weights_only=True)
    assert written["checkpoint"].endswith("last.ckpt") and last["global_step"] == results(finished)["global_step"]


def test_a_checkpoint_from_elsewhere_never_takes_the_place_of_the_runs_own_evaluation(finished, tmp_path):
    assert headlab_eval(str(finished), "--checkpoint", "last").returncode == 0
    own = json.loads((finished / "eval" / "test-last.json").read_text())
    shutil.copy(finished / "checkpoints" / "last.ckpt", tmp_path / "last.ckpt")  # another run's, named the same
    assert headlab_eval(str(finished), "--checkpoint", str(tmp_path / "last.ckpt")).returncode == 0
    assert json.loads((finished / "eval" / "test-last.json").read_text()) == own
    other = json.loads((finished / "eval" / "test-other-last.json").read_text())
    assert other["checkpoint"] == str(tmp_path / "last.ckpt")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{run}", "--checkpoint", "nowhere.ckpt"], "headlab-eval: no nowhere.ckpt checkpoint"),
        (["{tmp}"], "is not a headlab run directory (no .hydra/config.yaml)"),
        (["{run}", "dev"], "invalid choice: 'dev' (choose from 'train', 'val', 'test')"),
    ],
)
def test_eval_refuses_bad_input_in_one_line(finished, tmp_path, args, message):
    result = headlab_eval(*(a.format(run=finished, tmp=tmp_path) for a in args))
    assert result.returncode != 0 and message in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr
