"""What headlab trusts in a run directory that it reads back (resume=, headlab-eval, headlab-heads), which may come
from someone else: a config there may only name classes that headlab's own configs name (an allow-list of
`_target_`s), and a resumed run writes only inside its own directory. Anything else given on the command line is
the user's own, and trusted.

omegaconf and the standard library only: it runs before anything is built.
"""

from functools import cache
from importlib.resources import files
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from headlab.conventions import PATH_SUFFIXES
from headlab.errors import ConfigError


@cache
def headlab_targets() -> frozenset[str]:
    """Every `_target_` that a config of headlab's own conf/ names (experiments included)."""
    found: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, DictConfig):
            for key, value in node.items_ex(resolve=False):
                if key == "_target_" and isinstance(value, str):
                    found.add(value)
                else:
                    walk(value)
        elif isinstance(node, ListConfig):
            for value in node:
                walk(value)

    def folder(where) -> None:
        for entry in where.iterdir():
            if entry.is_dir():
                folder(entry)
            elif entry.name.endswith(".yaml"):
                walk(OmegaConf.create(entry.read_text()))

    folder(files("headlab.conf"))
    return frozenset(found)


def targets(node, prefix: str = "") -> list[tuple[str, str]]:
    """(key, target) of every `_target_` in a config."""
    out = []
    if isinstance(node, DictConfig):
        for key, value in node.items_ex(resolve=False):
            name = f"{prefix}.{key}" if prefix else str(key)
            if key == "_target_":
                out.append((name, str(value)))
            else:
                out += targets(value, name)
    elif isinstance(node, ListConfig):
        for i, value in enumerate(node):
            out += targets(value, f"{prefix}[{i}]")
    return out


def check_targets(cfg: DictConfig, source: str, given: set[str] = frozenset()) -> None:
    """Refuse a `_target_` that headlab's configs do not name, unless its key was given on the command line
    (`given`, e.g. {"callbacks.fault._target_"}). source: where the config comes from, for the message."""
    allowed = headlab_targets()
    for key, target in targets(cfg):
        if target not in allowed and key not in given:
            raise ConfigError(
                f"{key}={target!r} is invalid: expected a class that headlab's own configs name ({source} is not "
                "trusted to name others; give the key on the command line to run it)"
            )


NAMED_IN_PATHS = ("name", "version", "filename", "sub_dir", "prefix")  # joined to a logger's or callback's folder


def check_paths(cfg: DictConfig, run_dir: Path) -> None:
    """Every key that says where a run writes (PATH_SUFFIXES) points inside run_dir, and no name a logger or a
    callback joins to its folder (logger.csv.name, callbacks.model_checkpoint.filename) leaves it (.., absolute)."""
    root = Path(run_dir).resolve()
    for key, value in _leaves(OmegaConf.to_container(cfg, resolve=True)):
        if key.endswith(PATH_SUFFIXES) and isinstance(value, str) and value:
            path = Path(value).resolve()
            if path != root and root not in path.parents:
                raise ConfigError(f"{key}={value!r} is invalid: expected a path inside the run directory {run_dir}")
        named = key.startswith(("logger.", "callbacks.")) and key.rsplit(".", 1)[-1] in NAMED_IN_PATHS
        if named and isinstance(value, str) and (Path(value).is_absolute() or ".." in Path(value).parts):
            raise ConfigError(f"{key}={value!r} is invalid: expected a name inside its folder (no .., not absolute)")


def _leaves(tree, prefix: str = ""):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, tree
