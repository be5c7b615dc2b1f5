"""YAML files parsed once a process (headlab.launch.yaml_once): OmegaConf.load, as Hydra calls it at every
composition, gives what PyYAML with OmegaConf's loader makes of the file's text now."""

import os

import pytest
import yaml
from omegaconf import OmegaConf
from omegaconf._utils import get_yaml_loader

from conftest import ROOT
from headlab.launch import yaml_once

FILES = sorted([*(ROOT / "conf").rglob("*.yaml"), *(ROOT / "experiments").rglob("*.yaml")])


def parsed(text: str):
    """What OmegaConf.load makes of a text, written out: PyYAML with OmegaConf's loader, then OmegaConf.create."""
    obj = yaml.load(text, Loader=get_yaml_loader())
    return OmegaConf.create() if obj is None else OmegaConf.create(obj)


def test_the_console_scripts_compose_through_it():
    from hydra_plugins.headlab_launcher import register

    register()  # what each console script does first
    assert OmegaConf.load is yaml_once.load


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_every_config_file_loads_as_omegaconf_parses_it_the_first_time_and_after(path):
    expected = OmegaConf.to_yaml(parsed(path.read_text()))
    assert OmegaConf.to_yaml(yaml_once.load(path)) == expected
    with path.open(encoding="utf-8") as f:  # as Hydra's config sources give it: an open file
        assert OmegaConf.to_yaml(yaml_once.load(f)) == expected


def test_a_file_changed_since_is_parsed_anew_and_a_loaded_config_changed_reaches_no_later_load(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\nb: [x, y]\nc: ${a}\nd: 1e-3\n")
    first = yaml_once.load(path)
    assert first.d == 0.001 and first.c == 1  # OmegaConf's loader: 1e-3 a float; interpolations kept
    first.a, first.b[0] = 5, "changed"
    del first["d"]
    OmegaConf.set_struct(first, True)  # as Hydra sets its flags on what it loaded
    again = yaml_once.load(path)
    assert OmegaConf.to_container(again) == {"a": 1, "b": ["x", "y"], "c": "${a}", "d": 0.001}
    again.e = 1  # no flag of the first load's either
    assert not OmegaConf.is_struct(yaml_once.load(path)) and again._get_parent() is None
    stat = path.stat()
    path.write_text("a: 2\nb: [x, z]\nc: ${a}\nd: 1e-4\n")  # the same size, its time put back
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert OmegaConf.to_container(yaml_once.load(path)) == {"a": 2, "b": ["x", "z"], "c": "${a}", "d": 0.0001}
    path.write_text("- 1\n- 2\n")
    assert OmegaConf.to_container(yaml_once.load(path)) == [1, 2]
    path.write_text("")
    assert OmegaConf.to_container(yaml_once.load(path)) == {}
    path.write_text("3\n")
    with pytest.raises(OSError, match="Invalid loaded object type: int"):
        yaml_once.load(path)
