"""The model's rules on its settings, stated once and torch-free: the model raises with them, and the config check
calls them before torch is imported (a wrong value costs well under a second).

Every rule raises InvalidSetting(key, value, expected). Keys are the model's argument names ("n_heads"); a caller
that knows them by other names passes `name`, which maps one to the other (the config check: "model.attention.n_heads").
"""

import math
from collections.abc import Callable
from functools import cache
from importlib.metadata import EntryPoint, entry_points

from headlab.errors import InvalidSetting

NORMS = ("post", "pre")
POSITIONALS = ("sinusoidal", "learned", "rope", "alibi")
IN_HEADS = ("rope", "alibi")  # positions inside the heads, not added to the input (headlab.model.positions)
READOUTS = ("cls", "mean", "max", "token")  # null in a config: the task's own (readout_for)
TALKING_HEADS = ("none", "pre", "post", "both")  # where heads' maps are mixed: logits, weights, or both
# the attention's stages that are tables, each an entry-point group that names its classes (pyproject.toml)
STAGES = {"scoring": "headlab.scoring", "normalizer": "headlab.normalizer", "gate": "headlab.gate"}
_registered: dict[str, dict[str, object]] = {stage: {} for stage in STAGES}  # added in this process (register)


def same(key: str) -> str:
    return key


def head_sizes(
    d_model: int,
    n_heads: int,
    d_k: int | None,
    d_v: int | None,
    n_kv_heads: int | None,
    name: Callable[[str], str] = same,
    differential: bool = False,
) -> tuple[int, int, int]:
    """(d_k, d_v, n_kv_heads) resolved from their defaults (d_k = d_model / n_heads, d_v = d_k, one key/value head
    per query head), or InvalidSetting saying why the combination is impossible. A differential head has two
    query/key components of d_k each and values of 2 d_k (Ye et al. 2024): d_k = d_model / (2 n_heads) by default,
    so that its parameters equal those of the plain heads of the same width."""
    n = name
    if n_heads < 1:
        raise InvalidSetting(n("n_heads"), n_heads, "an int >= 1")
    maps = 2 if differential else 1  # query/key components per head
    if d_k is None:
        if d_model % (maps * n_heads):
            what = (
                f"a divisor of {n('d_model')}={d_model}" if maps == 1 else f"half a divisor of {n('d_model')}={d_model}"
            )
            also = "" if maps == 1 else f" and {n('differential')}=true"
            rule = f"{what} while {n('d_k')} is null{also} (or set d_k)"
            raise InvalidSetting(n("n_heads"), n_heads, rule)
        d_k = d_model // (maps * n_heads)
    d_v = maps * d_k if d_v is None else d_v
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


def designs(
    differential: bool,
    talking_heads: str,
    normalizer: str,
    gate: str,
    latent_kv: int | None,
    name: Callable[[str], str] = same,
) -> None:
    """The attention designs beside the head split, alone and together: InvalidSetting naming both keys of an
    impossible pair. A differential head is defined with softmax maps (Ye et al. 2024), and mixing its two signed
    components across heads is not."""
    n = name
    one_of(n("talking_heads"), talking_heads, TALKING_HEADS)
    check_stage("normalizer", normalizer, n("normalizer"))
    check_stage("gate", gate, n("gate"))
    if latent_kv is not None and latent_kv < 1:
        raise InvalidSetting(n("latent_kv"), latent_kv, "an int >= 1 (the latent's rank) or null")
    if differential and talking_heads != "none":
        raise InvalidSetting(n("talking_heads"), talking_heads, f"none while {n('differential')}=true")
    if differential and normalizer != "softmax":
        raise InvalidSetting(n("normalizer"), normalizer, f"softmax while {n('differential')}=true")


def position_in_heads(position: str, scoring: str, d_k: int, name: Callable[[str], str] = same) -> None:
    """Position inside the heads, where its formula holds: rope rotates pairs of a query's and a key's coordinates
    (an even d_k) so that their dot product depends on i - j only; additive scoring's tanh(q_i + k_j) keeps no such
    property, so rope with it is refused (alibi, a bias on any logit, takes every scoring)."""
    n = name
    one_of(n("position"), position, ("none", "rope", "alibi"))
    if position == "rope" and scoring == "additive":
        rule = f"dot with {n('position')}=rope (rotary positions are relative through q . k; additive's are not)"
        raise InvalidSetting(n("scoring"), scoring, rule + f", or {n('position')}=alibi")
    if position == "rope" and d_k % 2:
        raise InvalidSetting(n("d_k"), d_k, f"an even number with {n('position')}=rope (rotary turns pairs)")


MTA_KEYS = ("query_kernel", "key_kernel", "head_group")  # model.attention.mta's keys
MTA_OPTIONAL = ("group_norm",)  # and the one it may have (absent: false, as runs before it trained)


def multi_token(mta, n_heads: int, differential: bool, talking_heads: str, name: Callable[[str], str] = same) -> None:
    """Multi-token attention (null, or a dict of MTA_KEYS and MTA_OPTIONAL): kernels of odd sizes, centred on the
    logit they replace (an encoder's convolution looks both ways); head groups that divide the heads; group_norm a
    bool. Its head mixing and talking heads' are two mixings of one thing, and a differential head's two signed
    maps are not in the paper: both refused."""
    n = name
    if mta is None:
        return
    if not isinstance(mta, dict) or not set(MTA_KEYS) <= set(mta) <= {*MTA_KEYS, *MTA_OPTIONAL}:
        rule = "null or {query_kernel, key_kernel, head_group[, group_norm]}, e.g. +design=mta"
        raise InvalidSetting(n("mta"), mta, rule)
    if not isinstance(mta.get("group_norm", False), bool):
        raise InvalidSetting(n("mta.group_norm"), mta["group_norm"], "true or false")
    for key in ("query_kernel", "key_kernel"):
        size = mta[key]
        if not isinstance(size, int) or isinstance(size, bool) or size < 1 or size % 2 == 0:
            raise InvalidSetting(n(f"mta.{key}"), size, "an odd int >= 1 (a kernel centred on the logit)")
    group = mta["head_group"]
    if not isinstance(group, int) or isinstance(group, bool) or group < 1 or n_heads % group:
        raise InvalidSetting(n("mta.head_group"), group, f"a divisor of {n('n_heads')}={n_heads}")
    if differential:
        raise InvalidSetting(n("mta"), mta, f"null while {n('differential')}=true")
    if talking_heads != "none":
        raise InvalidSetting(n("talking_heads"), talking_heads, f"none with {n('mta')} (it mixes heads itself)")


def mixture_of_heads(moh, n_heads: int, name: Callable[[str], str] = same) -> None:
    """Mixture of heads (null, or {k, shared[, balance]}): at least one shared head (always on, as in the paper) and
    k routed heads on at each position, with at least one routed head left out (else every head is always on);
    balance, the load-balance loss's weight, a number >= 0 (absent: 0, as runs before it trained)."""
    n = name
    if moh is None:
        return
    if not isinstance(moh, dict) or not {"k", "shared"} <= set(moh) <= {"k", "shared", "balance"}:
        raise InvalidSetting(n("moh"), moh, "null or {k, shared[, balance]}, e.g. +design=moh")
    shared, k, balance = moh["shared"], moh["k"], moh.get("balance", 0.0)
    if not isinstance(shared, int) or isinstance(shared, bool) or not 1 <= shared < n_heads:
        raise InvalidSetting(n("moh.shared"), shared, f"an int in [1, {n('n_heads')}={n_heads}) (heads always on)")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k < n_heads - shared:
        rule = f"an int in [1, {n_heads - shared}) (routed heads on a token, of the {n_heads - shared} not shared)"
        raise InvalidSetting(n("moh.k"), k, rule)
    if not isinstance(balance, int | float) or isinstance(balance, bool) or not 0 <= balance < math.inf:
        raise InvalidSetting(n("moh.balance"), balance, "a number >= 0 (the load-balance loss's weight; 0: none)")


@cache
def _entry_points(stage: str) -> dict[str, EntryPoint]:
    return {point.name: point for point in entry_points(group=STAGES[stage])}


def stage_names(stage: str) -> list[str]:
    """Every implementation of a stage (scoring, normalizer, gate) there is: headlab's own and those of installed
    packages (the stage's entry-point group, STAGES), and any registered in this process."""
    return sorted(set(_entry_points(stage)) | set(_registered[stage]))


def register(stage: str, name: str, implementation) -> None:
    """Add an implementation of a stage in this process (a class like those of headlab.model.scoring,
    .normalizers, .gates); a package adds one for every process with an entry point in the stage's group."""
    _registered[stage][name] = implementation


def check_stage(stage: str, name: str, key: str | None = None) -> None:
    if name not in stage_names(stage):
        raise InvalidSetting(key or stage, name, "one of " + ", ".join(stage_names(stage)))


def load_stage(stage: str, name: str, key: str | None = None):
    """The implementation of a stage registered under name; InvalidSetting listing the names there are otherwise."""
    check_stage(stage, name, key)
    return _registered[stage][name] if name in _registered[stage] else _entry_points(stage)[name].load()


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
    maps: int = 1,
    latent_kv: int | None = None,
    gate_width: int = 0,
    two_passes: bool = False,
    ascent: bool = False,
    rotary: bool = False,
    alibi: bool = False,
    value_residual: bool = False,
    mta: bool = False,
) -> int:
    """An estimate of the memory training one model takes, in bytes: 20 a parameter (weights, gradients, AdamW's
    two moments and a scratch tensor; 24 when a sharpness-aware ascent is kept, `ascent`), and per layer and
    position of a batch about three float32 copies of the query, key and value projections (values, gradients,
    temporaries), 20 tensors as wide as d_model, two as wide as the feed-forward, three rows of attention weights
    per head and map; activations twice over when two passes are kept for one backward (R-Drop, `two_passes`).
    Designs: `maps` attention maps a head (2: differential), keys and values from a latent of rank `latent_kv`, an
    output gate `gate_width` wide; rotated copies of queries and keys (`rotary`), a distance bias row per head
    (`alibi`), the values mixed with the first layer's (`value_residual`), two more rows per head for multi-token
    attention's convolved logits and mixed weights (`mta`). Measured against the peak memory of real runs in
    docs/runs.md."""
    qk = maps * d_k  # query/key width of a head
    kv = n_kv_heads * (qk + d_v)
    kv_params = d_model * kv if latent_kv is None else (d_model + kv) * latent_kv
    attention = d_model * n_heads * qk + kv_params + n_heads * d_v * d_model + d_model * gate_width
    per_layer = attention + 2 * d_model * d_ff + 6 * d_model + 2 * d_ff
    params = vocab_size * d_model + positions * d_model + n_layers * per_layer + d_model * (n_classes + 1)
    projections = 3 * (n_heads * qk + kv + (latent_kv or 0) + gate_width)
    projections += 2 * (n_heads + n_kv_heads) * qk * rotary + n_kv_heads * d_v * value_residual
    per_position = projections + 20 * d_model + 2 * d_ff + (3 + alibi + 2 * mta) * n_heads * maps * positions
    activations = 4 * batch_size * positions * n_layers * per_position * (2 if two_passes else 1)
    return (24 if ascent else 20) * params + activations
