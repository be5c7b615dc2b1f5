"""Hydra's own errors (unknown group option or key, unparsable override, unwritable output directory) as one line
that names the key, the value and what is allowed, like headlab's ConfigError."""

import difflib
import errno
import sys
from importlib.resources import files
from pathlib import Path

from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import ConfigTypeError, OmegaConfBaseException

from headlab.config.check import RULES, section_rule
from headlab.config.run_config import RUN_DIRECTORY
from headlab.errors import ConfigError, DataError, as_written


def _flat(text: str) -> str:
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _group_options(group: str) -> list[str]:
    """The configs of a group as Hydra lists them (Hydra's own and its plugins' too: hydra/launcher=basic), where
    Hydra's error does not say (an entry of a list; a value that is no name: refused_override)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_automatic_config_search_path

    path = create_automatic_config_search_path(None, None, "pkg://headlab.conf")
    return ConfigLoaderImpl(config_search_path=path).get_group_options(group)


def _unknown_option(error: MissingConfigException) -> str:
    group, _, name = (error.missing_cfg_file or "").rpartition("/")
    options = sorted(o for o in (error.options or _group_options(group)) if not o.startswith("_"))  # _text: a base
    if not group or not options:
        return f"invalid config: {_flat(error)}"
    return f"invalid config: {group}={name} is unknown: expected one of {', '.join(options)}"


MERGING = "Error merging override "  # Hydra's words for an override whose value cannot replace the key's


def _unknown_key(error: ConfigCompositionException) -> str:
    """An override Hydra could not apply: a key the config has not, one below a single value (model.d_model.x=1), or
    a list in place of a section's keys (sweep.plan=[1,2]) or keys in place of a list (optim.betas={a:1})."""
    cause = error.__cause__
    key = getattr(cause, "full_key", None)
    parent = getattr(cause, "parent_node", None)
    if not isinstance(cause, OmegaConfBaseException) or not key or parent is None:
        return f"invalid config: {_flat(error)}"
    if isinstance(cause, ConfigTypeError) and str(error).startswith(MERGING):
        given = str(error).removeprefix(MERGING).partition("=")[2]
        allowed = section_rule(key) if isinstance(parent, DictConfig) else RULES.get(key, (None, "a list: [a, b]"))[1]
        return f"invalid config: {key}={given} is invalid: expected {allowed}"
    prefix = str(key).rpartition(".")[0]
    if hasattr(parent, "keys") and not len(parent):  # Hydra's empty stand-in for a key that holds one value
        return f"invalid config: {key} is not a key of the config: {prefix} is one value, with no keys of its own"
    known = [str(k) for k in parent if not str(k).startswith("_")] if hasattr(parent, "keys") else []
    near = difflib.get_close_matches(str(key).rsplit(".", 1)[-1], known, n=1)
    meant = f"did you mean {prefix + '.' if prefix else ''}{near[0]}? " if near else ""
    added = "" if str(key).startswith("model.") else f" (or +{key}=... to add one)"  # the model takes no other
    expected = f"expected one of {', '.join(known)}" if known else f"{prefix} has none to set"  # the basic launcher
    return f"invalid config: {key} is not a key of the config: {meant}{expected}{added}"


def config_groups() -> set[str]:
    """The names of headlab's config groups (model, data, ...; Hydra's own are hydra/...)."""
    return {p.name for p in files("headlab.conf").iterdir() if p.is_dir()}


NEEDED_GROUPS = ("model", "trainer", "data")  # a run has a config of each (logger=[] or ~logger: no logger)


def refused_override(argv: list[str]) -> str | None:
    """The line refusing an override Hydra fails on without naming it: a config group given what names none of its
    configs (trainer=5, data=[1,2], a sweep's trainer=cpu,5), a group a run needs removed (~model, trainer=[]), resume
    given a list or keys (the run's directory is named from it); None where there is none (an unknown name of a
    group: Hydra's error, _unknown_option)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, groups = OverridesParser.create(), config_groups()
    for given in [a for a in argv if ("=" in a or a.startswith("~")) and not a.startswith("-")]:
        try:
            (override,) = parser.parse_overrides([given])
        except OverrideParseException:  # Hydra says what it cannot parse
            continue
        group = override.key_or_group
        if group == "resume" and not isinstance(override.value(), str | None):
            return f"invalid config: {given} is invalid: expected {RUN_DIRECTORY}"
        if "/" not in group and group not in groups:  # a key, not a group
            continue
        try:
            values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
        except HydraException:  # glob(...) and interval(...): Hydra expands (or refuses) them as it composes
            continue
        names = [name for v in values for name in (v if isinstance(v, list) else [v])]
        bad = [n for n in names if not isinstance(n, str | dict) and not (override.is_delete() and n is None)]  # a
        # dict sets keys of the group's config (model={attention: {n_heads: 4}})
        removed = group in NEEDED_GROUPS and (override.is_delete() or [] in values)
        options = ", ".join(sorted(o for o in _group_options(group) if not o.startswith("_"))) if bad or removed else ""
        if options and bad:
            return f"invalid config: {group}={as_written(bad[0])} is unknown: expected one of {options}"
        if options:
            return f"invalid config: {given} is invalid: expected a {group} config (a run needs one): {options}"
    return None


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
