"""The model's rules on its settings, stated once and torch-free: the model raises with them, and the config check
calls them before torch is imported (a wrong value costs well under a second).

Every rule raises InvalidSetting(key, value, expected). Keys are the model's argument names ("n_heads"); a caller
that knows them by other names passes `name`, which maps one to the other (the config check: "model.attention.n_heads").
"""

from collections.abc import Callable
from functools import cache
from importlib.metadata import EntryPoint, entry_points

from headlab.errors import InvalidSetting

NORMS = ("post", "pre")
POSITIONALS = ("sinusoidal", "learned")
READOUTS = ("cls", "mean", "max", "token")  # null in a config: the task's own (readout_for)
SCORING_GROUP = "headlab.scoring"  # the entry-point group that names scoring functions (pyproject.toml)
_registered: dict[str, object] = {}  # scorings registered in this process (register_scoring)


def same(key: str) -> str:
    return key


def head_sizes(
    d_model: int,
    n_heads: int,
    d_k: int | None,
    d_v: int | None,
    n_kv_heads: int | None,
    name: Callable[[str], str] = same,
) -> tuple[int, int, int]:
    """(d_k, d_v, n_kv_heads) resolved from their defaults (d_k = d_model / n_heads, d_v = d_k, one key/value head
    per query head), or InvalidSetting saying why the combination is impossible."""
    n = name
    if n_heads < 1:
        raise InvalidSetting(n("n_heads"), n_heads, "an int >= 1")
    if d_k is None:
        if d_model % n_heads:
            rule = f"a divisor of {n('d_model')}={d_model} while {n('d_k')} is null (or set d_k)"
            raise InvalidSetting(n("n_heads"), n_heads, rule)
        d_k = d_model // n_heads
    d_v = d_k if d_v is None else d_v
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    for key, value in (("d_k", d_k), ("d_v", d_v), ("n_kv_heads", n_kv_heads)):
        if value < 1:
            raise InvalidSetting(n(key), value, "an int >= 1 or null")
    if n_heads % n_kv_heads:
        raise InvalidSetting(n("n_kv_heads"), n_kv_heads, f"a divisor of {n('n_heads')}={n_heads}")
    return d_k, d_v, n_kv_heads


def one_of(key: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise InvalidSetting(key, value, "one of " + ", ".join(str(a) for a in allowed))


def readout_for(readout: str | None, level: str, key: str = "readout") -> str:
    """The readout a task of this level ('token' or 'sequence') gets: its own when null (token / cls), and
    InvalidSetting on a mismatch."""
    if readout is None:
        return "token" if level == "token" else "cls"
    one_of(key, readout, READOUTS)
    if (readout == "token") != (level == "token"):
        sequence = [r for r in READOUTS if r != "token"]
        allowed = "token (or null)" if level == "token" else f"{', '.join(sequence)} (or null)"
        raise InvalidSetting(key, readout, f"{allowed} for this {level}-level task")
    return readout


@cache
def _scoring_entry_points() -> dict[str, EntryPoint]:
    return {point.name: point for point in entry_points(group=SCORING_GROUP)}


def scoring_names() -> list[str]:
    """Every scoring function there is: headlab's own and those of installed packages (the entry-point group
    headlab.scoring), and any registered in this process."""
    return sorted(set(_scoring_entry_points()) | set(_registered))


def register_scoring(name: str, scoring) -> None:
    """Add a scoring function in this process (a class like those of headlab.model.scoring); a package adds
    one for every process with an entry point in the group headlab.scoring instead."""
    _registered[name] = scoring


def check_scoring(name: str, key: str = "scoring") -> None:
    if name not in scoring_names():
        raise InvalidSetting(key, name, "one of " + ", ".join(scoring_names()))


def load_scoring(name: str, key: str = "scoring"):
    """The scoring function registered under name; InvalidSetting listing the names there are otherwise."""
    check_scoring(name, key)
    return _registered[name] if name in _registered else _scoring_entry_points()[name].load()


def training_bytes(
    *,
    vocab_size: int,
    n_classes: int,
    positions: int,
    batch_size: int,
    d_model: int,
    n_layers: int,
    d_ff: int,
    n_heads: int,
    d_k: int,
    d_v: int,
    n_kv_heads: int,
    two_passes: bool = False,
    ascent: bool = False,
) -> int:
    """An estimate of the memory training one model takes, in bytes: 20 a parameter (weights, gradients, AdamW's
    two moments and a scratch tensor; 24 when a sharpness-aware ascent is kept, `ascent`), and per layer and
    position of a batch about three float32 copies of the query, key and value projections (values, gradients,
    temporaries), 20 tensors as wide as d_model, two as wide as the feed-forward, three rows of attention weights
    per head; activations twice over when two passes are kept for one backward (R-Drop, `two_passes`). Measured
    against the peak memory of real runs in docs/runs.md."""
    attention = d_model * (n_heads * d_k + n_kv_heads * (d_k + d_v)) + n_heads * d_v * d_model
    per_layer = attention + 2 * d_model * d_ff + 6 * d_model + 2 * d_ff
    params = vocab_size * d_model + positions * d_model + n_layers * per_layer + d_model * (n_classes + 1)
    projections = 3 * (n_heads * d_k + n_kv_heads * (d_k + d_v))
    per_position = projections + 20 * d_model + 2 * d_ff + 3 * n_heads * positions
    activations = 4 * batch_size * positions * n_layers * per_position * (2 if two_passes else 1)
    return (24 if ascent else 20) * params + activations
