"""A scoring function from outside headlab: a package that names it in the entry-point group headlab.scoring is
trained by single runs and packs, with no change to headlab (the package here is written into a temporary folder
on PYTHONPATH, with the dist-info an installed package would have)."""

import json

import pytest
import torch

from conftest import PACKED, TINY, cli_env, headlab_train

PLUGIN = '''
import torch
import torch.nn.functional as F
from torch import nn

from headlab.model.scoring import Scoring


class Cosine(Scoring):
    """tau_h cos(q_i, k_j): cosine similarity with a learned temperature per head."""

    @staticmethod
    def add_parameters(attn):
        attn.temperature = nn.Parameter(torch.full((attn.n_heads,), 4.0))  # (H,)

    @staticmethod
    def scores(attn, q, k):
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        return (q @ k.transpose(-2, -1)) * attn.temperature[:, None, None]  # (B, H, n, m)
'''


def installed(tmp_path, package: str, group: str, entry: str, source: str) -> dict:
    """The environment of a process in which `package` (its module's source) is installed, naming `entry`
    (NAME = module:Class) in the entry-point group `group`, with the dist-info an installed package would have."""
    where, module = tmp_path / "site", package.replace("-", "_")
    (where / f"{module}-0.1.dist-info").mkdir(parents=True)
    (where / f"{module}.py").write_text(source)
    (where / f"{module}-0.1.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n"
    )
    (where / f"{module}-0.1.dist-info" / "entry_points.txt").write_text(f"[{group}]\n{entry}\n")
    return cli_env() | {"PYTHONPATH": str(where)}


@pytest.fixture
def plugin_env(tmp_path) -> dict:
    """The environment of a process in which the package headlab-cosine is installed."""
    return installed(tmp_path, "headlab-cosine", "headlab.scoring", "cosine = headlab_cosine:Cosine", PLUGIN)


@pytest.mark.e2e
def test_a_scoring_function_from_a_package_trains_alone_and_in_a_pack(tmp_path, plugin_env):
    common = [*TINY, "logger=csv", "model.attention.scoring=cosine", "trainer.max_epochs=1"]
    alone = headlab_train(*common, "hydra.run.dir=alone", cwd=tmp_path, env=plugin_env)
    assert alone.returncode == 0, alone.stderr[-3000:]
    record = json.loads((tmp_path / "alone" / "results.json").read_text())
    assert record["status"] == "completed" and record["config"]["model.attention.scoring"] == "cosine"
    state = torch.load(record["checkpoints"]["best"], weights_only=True)["state_dict"]
    assert state["model.blocks.0.attn.temperature"].shape == (4,)  # its parameter, trained and checkpointed

    packed = headlab_train("-m", *PACKED, "seed=0,1", *common, "hydra.sweep.dir=sweep", cwd=tmp_path, env=plugin_env)
    assert packed.returncode == 0, packed.stderr[-3000:]
    members = [json.loads((tmp_path / "sweep" / str(i) / "results.json").read_text()) for i in (0, 1)]
    assert [m["status"] for m in members] == ["completed"] * 2 and members[0]["pack"]["size"] == 2
    # the pack's member of seed 0 is the single run of seed 0 (float32 on a CPU: equal to rounding)
    assert members[0]["metrics"]["test/loss"] == pytest.approx(record["metrics"]["test/loss"], abs=1e-4)


def test_the_config_check_knows_the_installed_scorings(tmp_path, plugin_env):
    refused = headlab_train("model.attention.scoring=bogus", cwd=tmp_path, env=plugin_env)
    assert refused.returncode == 2
    expected = "model.attention.scoring='bogus' is invalid: expected one of additive, cosine, dot"
    assert refused.stderr.strip().endswith(expected)


NORMALIZER = '''
import torch

from headlab.model.normalizers import Normalizer


class Relu(Normalizer):
    """ReLU attention: relu(s_ij) / m, m the real keys (no parameters, no fused path)."""

    @staticmethod
    def weights(attn, scores, key_padding_mask):
        weights = torch.relu(scores) / scores.shape[-1]
        if key_padding_mask is None:
            return weights
        return weights.masked_fill(key_padding_mask[:, None, None, :], 0.0)
'''


@pytest.mark.e2e
def test_a_normalizer_from_a_package_is_a_stage_like_a_scoring_function(tmp_path):
    """The same for another stage: a package naming a normaliser in the group headlab.normalizer trains it alone
    and in a pack, and the config check lists it."""
    env = installed(tmp_path, "headlab-relu", "headlab.normalizer", "relu = headlab_relu:Relu", NORMALIZER)
    common = [*TINY, "logger=csv", "model.attention.normalizer=relu", "trainer.max_epochs=1"]
    alone = headlab_train(*common, "hydra.run.dir=alone", cwd=tmp_path, env=env)
    assert alone.returncode == 0, alone.stderr[-3000:]
    record = json.loads((tmp_path / "alone" / "results.json").read_text())
    assert record["status"] == "completed" and record["config"]["model.attention.normalizer"] == "relu"
    packed = headlab_train("-m", *PACKED, "seed=0,1", *common, "hydra.sweep.dir=sweep", cwd=tmp_path, env=env)
    assert packed.returncode == 0, packed.stderr[-3000:]
    member = json.loads((tmp_path / "sweep" / "0" / "results.json").read_text())
    assert member["metrics"]["test/loss"] == pytest.approx(record["metrics"]["test/loss"], abs=1e-4)
    refused = headlab_train("model.attention.normalizer=bogus", cwd=tmp_path, env=env)
    assert refused.returncode == 2
    assert refused.stderr.strip().endswith("expected one of relu, sigmoid, sink, softmax, softmax1, softpick, ssmax")
