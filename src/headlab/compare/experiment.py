"""The analysis an experiment states before its runs: the `compare` key of its file in headlab's experiments/ (and
`confirm`: the analysis stated after a first reading, for new seeds), read from the file, never from the runs (a
record is data: options and paths never come from it)."""

import re
from importlib.resources import files

from omegaconf import OmegaConf

from headlab.compare import analysis
from headlab.stats.contrasts import CompareError


def name_of(records: list[dict]) -> str | None:
    """The one experiment the runs are of, or None."""
    names = {r["config"].get("experiment") for r in records}
    name = next(iter(names)) if len(names) == 1 else None
    return name if isinstance(name, str) and re.fullmatch(r"\w+", name) else None


def stated(records: list[dict], confirm: bool) -> tuple[dict | None, list[str]]:
    """(the options the runs' experiment states, what to tell the reader): None where the runs are not of one
    experiment that this headlab has."""
    name = name_of(records)
    if name is None:
        return None, []
    path = files("headlab.conf").joinpath("experiment", f"{name}.yaml")
    if not path.is_file():
        return None, [f"the runs are of experiment {name!r}, which this headlab has not"]
    key = "confirm" if confirm else "compare"
    given = OmegaConf.to_container(OmegaConf.create(path.read_text())).get(key)
    if confirm and not given:
        raise CompareError(f"experiments/{name}.yaml states no confirmation analysis (confirm key)")
    values = analysis.options(given or {}, f"{name}.yaml's {key} key")
    said = []
    if {_recorded(r["config"], key) for r in records} != {_frozen(analysis.stated(values))}:
        said.append(f"the runs record another analysis than experiments/{name}.yaml states now; applying the file's")
    return values, said


def _recorded(config: dict, key: str):
    """The analysis a run's config recorded under key: a list of flags (as older files stated it) or the flat keys
    key.<option>; frozen to compare."""
    if key in config:
        try:
            return _frozen(analysis.stated(analysis.options(config[key] or {}, key)))
        except CompareError:
            return None
    given = {k.split(".", 1)[1]: v for k, v in config.items() if k.startswith(f"{key}.")}
    try:
        return _frozen(analysis.stated(analysis.options(given, key)))
    except CompareError:
        return None


def _frozen(values: dict) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in values.items()))
