"""Hydra's own errors (unknown group option or key, unparsable override, unwritable output directory) as one line
that names the key, the value and what is allowed, like headlab's ConfigError."""

import difflib
import errno
import sys
from importlib.resources import files
from pathlib import Path

from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf.errors import OmegaConfBaseException

from headlab.errors import ConfigError, DataError


def _flat(text: str) -> str:
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _options(group: str) -> list[str]:
    """The configs headlab ships in a group (Hydra does not always say, e.g. for an entry of a list)."""
    folder = files("headlab.conf").joinpath(group)
    if not folder.is_dir():
        return []
    return [f.name.removesuffix(".yaml") for f in folder.iterdir() if f.name.endswith(".yaml")]


def _unknown_option(error: MissingConfigException) -> str:
    group, _, name = (error.missing_cfg_file or "").rpartition("/")
    options = sorted(o for o in (error.options or _options(group)) if not o.startswith("_"))  # _text: a base
    if not group or not options:
        return f"invalid config: {_flat(error)}"
    return f"invalid config: {group}={name} is unknown: expected one of {', '.join(options)}"


def _unknown_key(error: ConfigCompositionException) -> str:
    cause = error.__cause__
    key = getattr(cause, "full_key", None)
    parent = getattr(cause, "parent_node", None)
    if not isinstance(cause, OmegaConfBaseException) or not key or parent is None:
        return f"invalid config: {_flat(error)}"
    known = [str(k) for k in parent if not str(k).startswith("_")] if hasattr(parent, "keys") else []
    near = difflib.get_close_matches(str(key).rsplit(".", 1)[-1], known, n=1)
    prefix = str(key).rpartition(".")[0]
    meant = f"did you mean {prefix + '.' if prefix else ''}{near[0]}? " if near else ""
    added = "" if str(key).startswith("model.") else f" (or +{key}=... to add one)"  # the model takes no other
    return f"invalid config: {key} is not a key of the config: {meant}expected one of {', '.join(known)}{added}"


def _long_key(filename) -> str | None:
    """The key of a command-line override that Hydra took for a config file name too long for the file system."""
    name = Path(str(filename)).name
    keys = [a.split("=", 1)[0].lstrip("+~") for a in sys.argv[1:] if "=" in a]
    return next((k for k in keys if len(k) > 255 and (name.startswith(k) or k.endswith(name))), None)


def _shorten(text: str, keep: int = 40) -> str:
    return text if len(text) <= 2 * keep else f"{text[:keep]}...{text[-keep:]}"


def one_line(error: BaseException) -> str | None:
    """The one-line message for an error Hydra raised before or while composing a job, or headlab's own about a
    sweep's settings (hydra.launcher.*); None for any other."""
    if isinstance(error, ConfigError):
        return f"invalid config: {error}"
    if isinstance(error, DataError):  # data a dry run prepares to time its jobs: missing files, say
        return f"data error: {error}"
    if isinstance(error, MissingConfigException):
        return _unknown_option(error)
    if isinstance(error, OverrideParseException):
        return f"invalid override {error.override!r}: {_flat(error.message)}"
    if isinstance(error, ConfigCompositionException):
        return _unknown_key(error)
    if isinstance(error, OSError) and error.errno == errno.ENAMETOOLONG and (key := _long_key(error.filename)):
        return f"invalid config: {_shorten(key)} is {len(key)} characters long: expected a key of at most 255"
    if isinstance(error, OSError) and error.filename:  # Hydra creating the run or sweep directory
        return (
            f"cannot write the output directory {error.filename}: {error.strerror}; "
            "choose another with hydra.run.dir=... (hydra.sweep.dir=... with -m)"
        )
    return None
