"""Invalid configurations fail before training: exit code 2, one line naming key, value and rule, no traceback."""

import json
import time

import pytest
from hydra import compose, initialize_config_module

from headlab.config_check import check_config

CASES = [
    ("model.attention.n_heads=0", "model.attention.n_heads=0 is invalid: expected an int >= 1"),
    ("model.attention.n_heads=abc", "model.attention.n_heads='abc' is invalid: expected an int >= 1"),
    ("model.d_model=30", "model.attention.n_heads=4 is invalid: expected a divisor of model.d_model=30"),
    ("model.d_model=-8", "model.d_model=-8 is invalid: expected an int >= 1"),
    ("model.attention.d_k=0", "model.attention.d_k=0 is invalid: expected an int >= 1 or null"),
    ("model.attention.n_kv_heads=3", "model.attention.n_kv_heads=3 is invalid: expected a divisor of"),
    ("model.attention.scoring=cosine", "model.attention.scoring='cosine' is invalid: expected one of dot, additive"),
    ("model.attention.scale=maybe", "model.attention.scale='maybe' is invalid: expected true or false"),
    ("model.readout=max", "model.readout='max' is invalid: expected one of null, cls, mean, token"),
    ("model.dropout=1.0", "model.dropout=1.0 is invalid: expected a number in [0, 1)"),
    ("model.attention.dropout=-0.1", "model.attention.dropout=-0.1 is invalid: expected a number in [0, 1)"),
    ("model.norm=middle", "model.norm='middle' is invalid: expected one of post, pre"),
    ("data.task.n_queries=0", "data.task.n_queries=0 is invalid: expected an int >= 1"),
    ("optim.lr=-1", "optim.lr=-1 is invalid: expected a number > 0"),
    ("trainer.max_epochs=0", "trainer.max_epochs=0 is invalid: expected an int >= 1"),
]


@pytest.mark.parametrize(("override", "message"), CASES, ids=[c[0] for c in CASES])
def test_invalid_value_exits_with_one_line(run_cli, tmp_path, override, message):
    started = time.time()
    result = run_cli(override, "hydra.run.dir=run")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"headlab-train: invalid config: {message}" + lines[0].split(message, 1)[1]]
    assert "Traceback" not in result.stderr + result.stdout
    assert json.loads((tmp_path / "run" / "results.json").read_text())["status"] == "failed"
    assert time.time() - started < 30  # nothing heavy ran


def test_sequence_length_below_one_is_rejected(run_cli):
    result = run_cli("data=listops", "data.task.max_length=0", "hydra.run.dir=run")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "headlab-train: invalid config: data.task.max_length=0 is invalid: expected an int >= 1"
    )


def test_readout_that_contradicts_the_task_is_rejected(run_cli):
    result = run_cli("model.readout=cls", "hydra.run.dir=run")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "headlab-train: invalid config: model.readout='cls' is invalid: "
        "expected token (or null) for this token-level task"
    )


@pytest.mark.parametrize("data", ["pair_recall", "mqar", "listops"])
def test_every_shipped_data_config_composes_and_validates(data):
    with initialize_config_module("headlab.conf", version_base="1.3"):
        check_config(compose("train", overrides=[f"data={data}"]))
