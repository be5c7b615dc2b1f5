"""Each YAML text parsed once a process. Hydra reads every file of a config's defaults tree through OmegaConf.load
at every composition (again for each job of a sweep, and for a sweep's checks and estimates), and PyYAML's
pure-Python parser was a fifth of composing headlab-train's config, and building the config from what it parsed
(OmegaConf.create) a quarter of what was left. `install` makes OmegaConf.load keep the config each text makes and
give a copy of it (copy.deepcopy: half the time of building it again): the same config, from the same loader. Keyed
by the text itself, so a file changed since is parsed anew."""

import copy
import functools
import os

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf._utils import get_yaml_loader

KEPT = 256  # texts kept at most (a config file's are a few hundred bytes); the least recently read goes first


def load(file_) -> DictConfig | ListConfig:
    """OmegaConf.load(file_) (a path or an open file), its text parsed once a process."""
    if isinstance(file_, str | os.PathLike):
        with open(os.path.abspath(file_), encoding="utf-8") as f:
            text = f.read()
    elif getattr(file_, "read", None):
        text = file_.read()  # bytes from a zipped package's file
    else:
        raise TypeError("Unexpected file type")
    return copy.deepcopy(_config(text))


@functools.lru_cache(maxsize=KEPT)
def _config(text: str | bytes) -> DictConfig | ListConfig:
    """The config that PyYAML with OmegaConf's loader makes of a text, as OmegaConf.load builds it (shared: load
    copies it)."""
    obj = yaml.load(text, Loader=get_yaml_loader())
    if obj is not None and not isinstance(obj, list | dict | str):
        raise OSError(f"Invalid loaded object type: {type(obj).__name__}")
    return OmegaConf.create() if obj is None else OmegaConf.create(obj)


def install() -> None:
    """OmegaConf.load is `load` in this process from now on."""
    OmegaConf.load = staticmethod(load)
