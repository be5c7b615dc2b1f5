"""The steps of preparing a text classification dataset, as pure functions with explicit arguments.

read (local files or the hub) -> check columns -> label vocabulary -> carve a validation split -> tokenizer
-> tokenize -> cache. TextDataModule.setup() runs them in that order. Datasets are 🤗 `datasets.Dataset`s keyed
by role (train, val, test); arrays are numpy.
"""

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path

import numpy as np

from headlab.conventions import PAD_ID, SPLITS
from headlab.data import subwords
from headlab.errors import DataError, first_line

log = logging.getLogger("headlab")
TOKENIZERS = ("wordpiece", "bpe")  # the kinds make_tokenizer trains
SPECIAL = ["[PAD]", "[UNK]", "[SEP]"]  # [PAD] first: its id is PAD_ID
CACHE_VERSION = 2
CACHE_FILES = ("arrays.npz", "tokenizer.json", "labels.json")
COMPLETE = "complete.json"  # written last into a cache entry: the sha256 of every file above
assert SPECIAL.index("[PAD]") == PAD_ID


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# reading (local files: headlab.data.text_files)
def _hub_reachable(timeout: float = 5.0) -> bool:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        socket.create_connection((endpoint, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def read_hub(name: str, config: str | None, splits: dict) -> dict:
    """The hub dataset's splits by role (splits: role -> the hub's split name or None); without network, a cached
    copy or one line saying how to go on offline."""
    offline = os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1"
    if not offline and not Path(name).exists() and not _hub_reachable():
        offline = True  # a cached copy may still serve; no minute of retries against an unreachable hub
        os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"  # read when they are imported
    import datasets
    import huggingface_hub.constants

    if offline:  # and for when they were imported already
        datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    datasets.disable_progress_bars()
    try:
        loaded = datasets.load_dataset(name, config)
    except Exception as error:
        why = "the Hugging Face hub cannot be reached and it is not cached" if offline else str(error).split("\n")[0]
        raise DataError(
            f"cannot load {name!r}: {why}. Offline, use data=files with data.files.train=... (and "
            "data.files.val, data.files.test), or pre-fill the datasets cache and set HF_DATASETS_OFFLINE=1"
        ) from None
    data = {}
    for role, split in splits.items():
        if split is None:
            continue
        if split not in loaded:
            raise DataError(f"{name} has no split {split!r} (data.hub_splits.{role}); it has {', '.join(loaded)}")
        data[role] = loaded[split]
    return data


def read_column(ds, name: str) -> list:
    """A Dataset's column as a list, read at once: `ds[name]` is a list before datasets 4 and a lazy Column that
    list() would read row by row (100x slower) since."""
    return ds[name][:]


# checking and labels
def check_columns(data: dict, columns: dict, where: dict, empty_text: str = "refuse") -> dict[str, int]:
    """Every configured column exists in every split, text columns hold text in every row (empty_text="keep": rows
    without text are counted instead), no split is empty. columns: config key -> column name (or None); where:
    role -> file or hub name, for the message. Returns the rows without text of each split."""
    without_text: dict[str, int] = {}
    for role, ds in data.items():
        for key, column in columns.items():
            if column is not None and column not in ds.column_names:
                raise DataError(
                    f"column {column!r} (data.{key}) is not in {where[role]} ({role}); "
                    f"available columns: {', '.join(ds.column_names)}"
                )
        if len(ds) == 0:
            raise DataError(f"the {role} split of {where[role]} is empty")
        for key, column in columns.items():
            if key == "label_column" or column is None:
                continue
            dtype = getattr(ds.features[column], "dtype", None)
            if dtype not in ("string", "large_string"):
                raise DataError(f"column {column!r} (data.{key}) of {where[role]} holds {dtype}, not text")
            empty = [row for row, text in enumerate(read_column(ds, column)) if text is None or not text.strip()]
            if empty and empty_text != "keep":
                raise DataError(
                    f"the {role} split of {where[role]} has no text in row {empty[0]} (column {column!r}); "
                    "data.empty_text=keep keeps such rows as examples without text"
                )
            without_text[role] = without_text.get(role, 0) + len(empty)
    return without_text


def _is_integer(y) -> bool:
    return isinstance(y, int | np.integer) and not isinstance(y, bool)


def _as_integer(y):
    """An integer label as an int, also when the file gave it as text ("3"); anything else as it is."""
    if isinstance(y, str) and y.strip().lstrip("-").isdigit():
        return int(y)
    return y


def label_key(y, labels: list):
    """A raw label as it appears in the label vocabulary: an int for integer classes, else its string."""
    return _as_integer(y) if labels and isinstance(labels[0], int) else str(y)


def label_vocabulary(data: dict, column: str, declared: int | None, where: dict, known: list | None = None) -> list:
    """The class of each id: 0..C-1 for integer labels (C = declared, or the largest + 1; "3" in a text column is
    3), or the sorted set of string labels; `known`: the labels a run trained with (a reload). Every split's labels
    must be present and among them; a column of integers with a few words among them is refused."""
    for role, ds in data.items():
        for row, y in enumerate(read_column(ds, column)):
            if y is None or (isinstance(y, str) and not y.strip()):
                raise DataError(f"the {role} split of {where[role]} has no label in row {row} (column {column!r})")
    train = [_as_integer(y) for y in read_column(data["train"], column)]
    integers = [_is_integer(y) for y in train]
    if known is not None:
        labels = list(known)
    elif all(integers):
        labels = list(range(declared or int(max(train)) + 1))
    else:
        if sum(integers) > len(train) / 2:
            row = integers.index(False)
            words = len(train) - sum(integers)
            raise DataError(
                f"the labels of {where['train']} (column {column!r}) are integers except in {words} row(s) (row "
                f"{row}: {train[row]!r}): fix those rows, or give every label as a word"
            )
        labels = sorted({str(y) for y in train})
        if declared and len(labels) != declared:
            raise DataError(
                f"the training labels have {len(labels)} classes, data.n_classes says {declared}: "
                f"{', '.join(labels[:10])}"
            )
    known_set = set(labels)
    for role, ds in data.items():
        for row, y in enumerate(read_column(ds, column)):
            if label_key(y, labels) not in known_set:
                source = "the labels the run trained with" if known is not None else "training labels"
                classes = f"{len(labels)} declared classes (data.n_classes)" if declared else source
                raise DataError(f"label {y!r} in row {row} of the {role} split is outside the {classes}")
    return labels


def carve_validation(data: dict, label_column: str, fraction: float, seed: int) -> dict:
    """A deterministic, stratified validation split from train when the data has none."""
    if "val" in data:
        return data
    train = data["train"]
    labels = np.asarray(read_column(train, label_column))
    rng = np.random.default_rng([seed, 17])
    val_index = []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        val_index += members[: max(1, round(fraction * len(members)))].tolist()
    val_set = set(val_index)
    if len(val_set) >= len(train):
        raise DataError(f"the training split has {len(train)} rows: too few to carve a validation split from")
    return {
        **data,
        "train": train.select([i for i in range(len(train)) if i not in val_set]),
        "val": train.select(sorted(val_index)),
    }


# tokens
def make_tokenizer(config: dict, texts: list[str]):
    """A tokenizer.json (config path), one from the hub (config hub), or a WordPiece / BPE tokenizer learned on
    texts with config vocab_size and lowercase, deterministically (headlab.data.subwords): the same texts and
    settings give the same tokenizer, byte for byte, on any machine."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    if config["path"]:
        return Tokenizer.from_file(str(config["path"]))
    if config["hub"]:
        return Tokenizer.from_pretrained(config["hub"])
    if config["kind"] not in TOKENIZERS:
        raise DataError(f"data.tokenizer.kind={config['kind']!r} is invalid: expected one of {', '.join(TOKENIZERS)}")
    wordpiece = config["kind"] == "wordpiece"
    normalizer = normalizers.BertNormalizer(lowercase=config["lowercase"])
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    counts = subwords.word_counts(texts, normalizer, pre_tokenizer)
    vocab, merges = subwords.learn(counts, config["vocab_size"], SPECIAL, prefix="##" if wordpiece else "")
    ids = {token: i for i, token in enumerate(vocab)}
    if wordpiece:
        tok = Tokenizer(models.WordPiece(ids, unk_token="[UNK]"))
    else:
        tok = Tokenizer(models.BPE(ids, merges, unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
    tok.decoder = decoders.WordPiece() if wordpiece else decoders.BPEDecoder()
    sep = tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="$A", pair="$A [SEP] $B", special_tokens=[("[SEP]", sep)])
    return tok


def read_saved(folder: Path) -> tuple:
    """(tokenizer, labels) a run saved in its data/ folder (TextDataModule.keep_in)."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(folder / "tokenizer.json")), json.loads((folder / "labels.json").read_text())
    except Exception as error:  # missing, unreadable, or not a tokenizer
        raise DataError(f"cannot read the tokenizer and labels {folder} holds: {first_line(error)}") from None


def saved_digests(folder: Path) -> dict:
    """What identifies a saved tokenizer and labels, for the cache key of data prepared with them."""
    return {"saved": {name: sha256(folder / name) for name in ("tokenizer.json", "labels.json")}}


def tokenize(tokenizer, texts: list[str], pairs: list[str] | None, raw_labels: list, labels: list, max_length: int):
    """Token ids of a split as one flat array with offsets (truncated at max_length), and label ids."""
    tokenizer.enable_truncation(max_length)
    encoded = tokenizer.encode_batch(list(zip(texts, pairs, strict=True)) if pairs else texts)
    lengths = np.array([max(1, len(e.ids)) for e in encoded])
    ids = np.concatenate([np.asarray(e.ids or [1], dtype=np.int32) for e in encoded])  # empty text -> [UNK]
    index = {y: i for i, y in enumerate(labels)}
    label_ids = np.array([index[label_key(y, labels)] for y in raw_labels])
    return {"ids": ids, "offsets": np.concatenate([[0], np.cumsum(lengths)]), "labels": label_ids}


# cache
def check_cache_root(root: Path) -> None:
    """The cache root must be a folder headlab can write in: checked before any data is read, in one line."""
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=root):
            pass
    except OSError as error:
        raise DataError(
            f"cannot write the data cache in {root} ({first_line(error)}): set HEADLAB_CACHE (or data.cache_dir) to "
            "a writable folder"
        ) from None


def cache_key(settings: dict) -> str:
    """The name of a cache entry: a hash of everything that shapes the prepared data."""
    return hashlib.sha256(
        json.dumps({"version": CACHE_VERSION, **settings}, sort_keys=True, default=str).encode()
    ).hexdigest()[:20]


def cache_state(entry: Path) -> str:
    """'missing', 'complete' (every file there with the checksum recorded last), or 'corrupt: <why>'."""
    if not entry.exists():
        return "missing"
    try:
        recorded = json.loads((entry / COMPLETE).read_text())
    except (OSError, ValueError):
        return f"corrupt: no readable {COMPLETE} (an interrupted or older write)"
    for name in CACHE_FILES:
        path = entry / name
        if not path.is_file() or sha256(path) != recorded.get(name):
            return f"corrupt: {name} is missing or does not match its checksum"
    return "complete"


@contextlib.contextmanager
def preparing(entry: Path):
    """Held while one process prepares a cache entry: another process that needs the same entry (two packs of a
    sweep with the same seeds) waits here, then reads the entry instead of preparing it too. The lock is a file
    beside the entry, removed on release (a waiter that locked a removed file takes the new one); it goes with
    a killed process. Where the file system cannot lock, nothing waits and write_cache still settles the race."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    path = entry.parent / f".{entry.name}.lock"
    while True:
        lock = open(path, "a")  # noqa: SIM115 (held across the yield)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:
            break  # no locks here
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == os.fstat(lock.fileno()).st_ino:
                break
        lock.close()
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        lock.close()


def write_cache(entry: Path, arrays: dict, tokenizer, labels: list) -> None:
    """Write into a temporary directory, then rename: a crash leaves no half-written cache entry; the checksums
    are written last, so an entry damaged later is detected on reading. Where another process completed the entry
    meanwhile (two packs preparing the same data), its entry is kept: that process may be reading it."""
    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".tmp-"))
        np.savez(tmp / "arrays.npz", **{f"{role}_{k}": v for role, a in arrays.items() for k, v in a.items()})
        tokenizer.save(str(tmp / "tokenizer.json"))
        (tmp / "labels.json").write_text(json.dumps(labels))
        (tmp / COMPLETE).write_text(json.dumps({name: sha256(tmp / name) for name in CACHE_FILES}))
        if cache_state(entry) == "complete":  # a concurrent writer won the race
            shutil.rmtree(tmp, ignore_errors=True)
            return
        if entry.exists():  # a corrupt entry being rebuilt
            shutil.rmtree(entry, ignore_errors=True)
        os.replace(tmp, entry)
    except Exception as error:  # OSError, or the tokenizer's own error for a full disk
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if cache_state(entry) != "complete":  # not merely a concurrent writer that won the race
            raise DataError(
                f"cannot write the data cache entry {entry} ({first_line(error)}): free space, or set HEADLAB_CACHE "
                "(or data.cache_dir) to another folder"
            ) from None


def read_cache(entry: Path, max_length: int) -> tuple:
    """(tokenizer, labels, splits) of a complete cache entry; splits: role -> [(ids (n,), label id)]."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(entry / "tokenizer.json"))
    tokenizer.enable_truncation(max_length)
    labels = json.loads((entry / "labels.json").read_text())
    splits = {}
    with np.load(entry / "arrays.npz") as arrays:
        for role in SPLITS:
            if f"{role}_ids" not in arrays:
                continue
            ids, offsets = arrays[f"{role}_ids"].astype(np.int64), arrays[f"{role}_offsets"]
            label_ids = arrays[f"{role}_labels"].tolist()
            splits[role] = [(ids[a:b], y) for a, b, y in zip(offsets[:-1], offsets[1:], label_ids, strict=True)]
    return tokenizer, labels, splits
