"""pack.compute=auto's rules: which packs time their two ways, and what a kept choice must be to be used."""

import pytest
from omegaconf import DictConfig, OmegaConf

from headlab.training.pack import compute


def config(changes: dict) -> DictConfig:
    """A run's config as far as pack.compute reads it: the default run's, with these keys changed."""
    cfg = OmegaConf.create(
        {
            "trainer": {"accelerator": "cpu"},
            "model": {"dropout": 0.0, "compile": False, "attention": {"dropout": 0.0}},
            "pack": {"compute": "auto"},
        }
    )
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value)
    return cfg


@pytest.mark.parametrize(
    ("changes", "size", "times"),
    [
        ({}, 2, True),
        ({}, 1, False),  # a pack of one: its model alone
        ({"model.dropout": 0.1}, 2, False),  # dropout: each member its single run's masks
        ({"model.attention.dropout": 0.1}, 2, False),
        ({"model.compile": True}, 2, False),
        ({"trainer.accelerator": "gpu"}, 2, False),  # batched
        ({"pack.compute": "each"}, 2, False),
        ({"pack.compute": "batched"}, 2, False),
    ],
)
def test_auto_times_its_ways_only_on_a_cpu_for_members_without_dropout_or_compilation(changes, size, times):
    assert compute.to_measure(config(changes), size) is times


def test_a_config_written_before_the_key_asks_auto():
    cfg = OmegaConf.create({"trainer": {"accelerator": "cpu"}, "model": {"attention": {}}})
    assert compute.asked(cfg) == "auto" and compute.to_measure(cfg, 2)


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ('{"step_s": {"each": 0.2, "batched": 0.1}}', {"each": 0.2, "batched": 0.1}),
        ('{"step_s": {"each": 0.2}}', None),
        ('{"step_s": {"each": 0.2, "batched": -1}}', None),
        ('{"step_s": {"each": NaN, "batched": 0.1}}', None),
        ('{"step_s": {"each": "x", "batched": 0.1}}', None),
        ("[1, 2]", None),
        ("not json", None),
    ],
)
def test_a_kept_choice_is_used_only_when_it_holds_two_positive_times(tmp_path, text, found):
    path = tmp_path / "kept.json"
    path.write_text(text)
    assert compute.kept(path) == found
    assert compute.kept(tmp_path / "absent.json") is None


def test_timed_calls_the_ways_interleaved_and_leaves_the_first_call_of_each_out():
    calls = []
    seconds = compute.timed({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")})
    assert calls == ["a", "b"] * (compute.REPEATS + 1) and set(seconds) == {"a", "b"}
    assert all(s >= 0 for s in seconds.values())
