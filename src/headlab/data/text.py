"""Text classification through 🤗 datasets: hub datasets and local files share one pipeline.

load (hub or files) -> check columns and labels -> carve a validation split if there is none -> train a
tokenizer on the training split (or load one) -> tokenize -> cache. The cache key covers everything that
shapes the result (the data's fingerprint, columns, tokenizer settings, max length, seed), so the second run
starts at once and a changed setting never reuses a stale cache. A failed preparation writes nothing.
"""

import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path

import numpy as np
import torch

from headlab.data.datamodule import ExampleDataModule
from headlab.errors import DataError, first_line

log = logging.getLogger("headlab")
FORMATS = {  # extension -> (datasets builder, its options)
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"delimiter": "\t", "quoting": 3}),  # quoting 3: quotes are text (SST-2 has them)
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
    ".parquet": ("parquet", {}),
}
ROLES = ("train", "val", "test")
SPECIAL = ["[PAD]", "[UNK]", "[SEP]"]  # [PAD] first: id 0 is padding everywhere in headlab
CACHE_VERSION = 1


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _hub_reachable(timeout: float = 5.0) -> bool:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        socket.create_connection((endpoint, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


class TextDataModule(ExampleDataModule):
    """Sequence classification of text (or text pairs) from the hub (`hub`) or from local files (`files`).

    files: {"train": path, "val": path or null, "test": path or null}; column_names: the columns of headerless
    csv/tsv files, for all of them or per split ({"test": [...]}); hub_splits: {"train": name, "val": name or
    null, "test": name or null}. A missing val split is carved from train (seeded, stratified).
    """

    level = "sequence"

    def __init__(
        self,
        text_column: str,
        label_column: str,
        n_classes: int | None = None,
        hub: str | None = None,
        hub_config: str | None = None,
        hub_splits: dict | None = None,
        files: dict | None = None,
        column_names: list[str] | dict | None = None,
        text_pair_column: str | None = None,
        val_fraction: float = 0.05,
        tokenizer: dict | None = None,
        max_length: int = 128,
        batch_size: int = 64,
        num_workers: int = 0,
        bucketing: bool = True,
        cache_dir: str | None = None,
        seed: int = 0,
    ):
        super().__init__(batch_size, num_workers, bucketing, seed)
        self.text_column, self.text_pair_column, self.label_column = text_column, text_pair_column, label_column
        self.declared_classes, self.hub, self.hub_config = n_classes, hub, hub_config
        self.hub_splits = dict(hub_splits or {"train": "train", "val": "validation", "test": "test"})
        self.files = {role: (files or {}).get(role) for role in ROLES}
        self.column_names, self.val_fraction, self.max_length = column_names, val_fraction, max_length
        self.tokenizer_config = {
            "kind": "wordpiece",
            "vocab_size": 8000,
            "lowercase": True,
            "path": None,
            "hub": None,
            **(tokenizer or {}),
        }
        default_cache = Path(os.environ.get("HEADLAB_CACHE", Path.home() / ".cache" / "headlab"))
        self.cache_root = Path(cache_dir) if cache_dir else default_cache
        self.tokenizer = None
        self.labels: list = []
        self.cache_path: Path | None = None
        self.loaded_from_cache = False

    # what the model needs
    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    @property
    def n_classes(self) -> int:
        return len(self.labels)

    @property
    def max_len(self) -> int:
        return self.max_length

    def token_strings(self, ids: torch.Tensor) -> list[str]:
        return [self.tokenizer.id_to_token(i) for i in ids.tolist()]

    def describe(self) -> dict:
        """Also the label of each class id (the mapping of string labels) and where the prepared data lives."""
        return {
            **super().describe(),
            "labels": self.labels,
            "cache": str(self.cache_path),
            "from_cache": self.loaded_from_cache,
        }

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text).ids, dtype=np.int64)

    # preparation
    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        if self.hub is None and not self.files["train"]:
            raise DataError("data.files.train is not set: give the training file (csv, tsv, json, jsonl, parquet)")
        raw = self._load_local_fingerprinted() if self.hub is None else self._load_hub()
        key = self._cache_key(raw["fingerprint"])
        self.cache_path = self.cache_root / key
        if (self.cache_path / "arrays.npz").exists():
            self._read_cache()
            self.loaded_from_cache = True
            return
        data = raw["load"]()
        self._check(data)
        self._label_ids(data)
        data = self._carve_val(data)
        self.tokenizer = self._make_tokenizer(data["train"])
        arrays = {role: self._tokenize(ds) for role, ds in data.items()}
        self._write_cache(arrays)
        self._read_cache()

    def _load_local_fingerprinted(self) -> dict:
        """Local files: the fingerprint is their content hash, so a cache hit needs no datasets at all."""
        paths = {}
        for role, path in self.files.items():
            if not path:
                continue
            path = Path(path).expanduser()
            if not path.is_file():
                raise DataError(f"data.files.{role}: cannot read {path}: no such file")
            if path.suffix.lower() not in FORMATS:
                raise DataError(f"data.files.{role}: {path} has an unknown format; use one of {', '.join(FORMATS)}")
            paths[role] = path
        fingerprint = {role: _sha256(p) for role, p in paths.items()}
        return {"fingerprint": fingerprint, "load": lambda: self._read_files(paths)}

    def _read_files(self, paths: dict) -> dict:
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # a file that fails is reported below, once
        data = {}
        for role, path in paths.items():
            builder, options = FORMATS[path.suffix.lower()]
            names = self.column_names.get(role) if isinstance(self.column_names, dict) else self.column_names
            if names and builder == "csv":
                options = {**options, "column_names": list(names)}
            try:
                data[role] = datasets.load_dataset(builder, data_files=str(path), split="train", **options)
            except Exception as error:  # datasets raises many types for unreadable files
                if "corresponds to no data" in str(error):  # what datasets says of a file with no rows
                    raise DataError(f"the {role} split of {path} is empty") from None
                cause = error.__cause__ or error  # DatasetGenerationError wraps what the parser said
                raise DataError(f"data.files.{role}: cannot read {path}: {first_line(cause)}") from None
        return data

    def _load_hub(self) -> dict:
        offline = os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1"
        if not offline and not Path(self.hub).exists() and not _hub_reachable():
            offline = True  # a cached copy may still serve; no minute of retries against an unreachable hub
            os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"  # read when they are imported
        import datasets
        import huggingface_hub.constants

        if offline:  # and for when they were imported already
            datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
        datasets.disable_progress_bars()
        try:
            loaded = datasets.load_dataset(self.hub, self.hub_config)
        except Exception as error:
            why = (
                "the Hugging Face hub cannot be reached and it is not cached" if offline else str(error).split("\n")[0]
            )
            raise DataError(
                f"cannot load {self.hub!r}: {why}. Offline, use data=files with data.files.train=... (and "
                "data.files.val, data.files.test), or pre-fill the datasets cache and set HF_DATASETS_OFFLINE=1"
            ) from None
        data = {}
        for role, split in self.hub_splits.items():
            if split is None:
                continue
            if split not in loaded:
                raise DataError(
                    f"{self.hub} has no split {split!r} (data.hub_splits.{role}); it has {', '.join(loaded)}"
                )
            data[role] = loaded[split]
        fingerprint = {role: ds._fingerprint for role, ds in data.items()}
        return {"fingerprint": fingerprint, "load": lambda: data}

    def _cache_key(self, fingerprint: dict) -> str:
        settings = {
            "version": CACHE_VERSION,
            "source": self.hub or "files",
            "hub_config": self.hub_config,
            "fingerprint": fingerprint,
            "columns": [self.text_column, self.text_pair_column, self.label_column],
            "column_names": self.column_names,
            "n_classes": self.declared_classes,
            "val_fraction": self.val_fraction,
            "seed": self.seed,
            "tokenizer": self.tokenizer_config,
            "max_length": self.max_length,
        }
        return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:20]

    def _check(self, data: dict) -> None:
        for role, ds in data.items():
            where = self.hub or self.files[role]
            for key, column in (
                ("text_column", self.text_column),
                ("text_pair_column", self.text_pair_column),
                ("label_column", self.label_column),
            ):
                if column is not None and column not in ds.column_names:
                    raise DataError(
                        f"column {column!r} (data.{key}) is not in {where} ({role}); "
                        f"available columns: {', '.join(ds.column_names)}"
                    )
            if len(ds) == 0:
                raise DataError(f"the {role} split of {where} is empty")
            for key, column in (("text_column", self.text_column), ("text_pair_column", self.text_pair_column)):
                dtype = getattr(ds.features[column], "dtype", None) if column else "string"
                if dtype not in ("string", "large_string"):
                    raise DataError(f"column {column!r} (data.{key}) of {where} holds {dtype}, not text")

    def _carve_val(self, data: dict) -> dict:
        """A deterministic, stratified validation split from train when the data has none."""
        if "val" in data:
            return data
        train = data["train"]
        labels = np.asarray(list(train[self.label_column]))
        rng = np.random.default_rng([self.seed, 17])
        val_index = []
        for label in np.unique(labels):
            members = rng.permutation(np.flatnonzero(labels == label))
            val_index += members[: max(1, round(self.val_fraction * len(members)))].tolist()
        val_set = set(val_index)
        return {
            **data,
            "train": train.select([i for i in range(len(train)) if i not in val_set]),
            "val": train.select(sorted(val_index)),
        }

    def _label_ids(self, data: dict) -> None:
        """Integer labels are class ids (checked against data.n_classes); strings are mapped in sorted order."""
        train_labels = list(data["train"][self.label_column])
        if all(isinstance(y, int | np.integer) and not isinstance(y, bool) for y in train_labels):
            n = self.declared_classes or int(max(train_labels)) + 1
            self.labels = list(range(n))
        else:
            self.labels = sorted({str(y) for y in train_labels})
            if self.declared_classes and len(self.labels) != self.declared_classes:
                raise DataError(
                    f"the training labels have {len(self.labels)} classes, data.n_classes says "
                    f"{self.declared_classes}: {', '.join(self.labels[:10])}"
                )
        known = {y: i for i, y in enumerate(self.labels)}
        for role, ds in data.items():
            for row, y in enumerate(ds[self.label_column]):
                if (y if isinstance(self.labels[0], int) else str(y)) not in known:
                    raise DataError(
                        f"label {y!r} in row {row} of the {role} split is outside the "
                        f"{len(self.labels)} declared classes (data.n_classes)"
                    )

    def _make_tokenizer(self, train):
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

        cfg = self.tokenizer_config
        if cfg["path"]:
            return Tokenizer.from_file(str(cfg["path"]))
        if cfg["hub"]:
            return Tokenizer.from_pretrained(cfg["hub"])
        if cfg["kind"] not in ("wordpiece", "bpe"):
            raise DataError(f"data.tokenizer.kind={cfg['kind']!r} is unknown; choose wordpiece or bpe")
        wordpiece = cfg["kind"] == "wordpiece"
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]") if wordpiece else models.BPE(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=cfg["lowercase"])
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece() if wordpiece else decoders.BPEDecoder()
        trainer = (trainers.WordPieceTrainer if wordpiece else trainers.BpeTrainer)(
            vocab_size=cfg["vocab_size"], special_tokens=SPECIAL, show_progress=False
        )
        texts = list(train[self.text_column]) + (list(train[self.text_pair_column]) if self.text_pair_column else [])
        tok.train_from_iterator(texts, trainer)
        sep = tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="$A", pair="$A [SEP] $B", special_tokens=[("[SEP]", sep)]
        )
        return tok

    def _tokenize(self, ds) -> dict[str, np.ndarray]:
        """Token ids of a split as one flat array with offsets (truncated at max_length), and label ids."""
        self.tokenizer.enable_truncation(self.max_length)
        texts = list(ds[self.text_column])
        pairs = list(ds[self.text_pair_column]) if self.text_pair_column else None
        encoded = self.tokenizer.encode_batch(list(zip(texts, pairs, strict=True)) if pairs else texts)
        lengths = np.array([max(1, len(e.ids)) for e in encoded])
        ids = np.concatenate([np.asarray(e.ids or [1], dtype=np.int32) for e in encoded])  # empty text -> [UNK]
        index = {y: i for i, y in enumerate(self.labels)}
        labels = np.array([index[y if isinstance(self.labels[0], int) else str(y)] for y in ds[self.label_column]])
        return {"ids": ids, "offsets": np.concatenate([[0], np.cumsum(lengths)]), "labels": labels}

    def _write_cache(self, arrays: dict) -> None:
        """Write into a temporary directory, then rename: a crash leaves no half-written cache entry."""
        self.cache_root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.cache_root, prefix=".tmp-"))
        try:
            np.savez(tmp / "arrays.npz", **{f"{role}_{k}": v for role, a in arrays.items() for k, v in a.items()})
            self.tokenizer.save(str(tmp / "tokenizer.json"))
            (tmp / "labels.json").write_text(json.dumps(self.labels))
            os.replace(tmp, self.cache_path)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not (self.cache_path / "arrays.npz").exists():  # not merely a concurrent writer that won the race
                raise

    def _read_cache(self) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(self.cache_path / "tokenizer.json"))
        self.tokenizer.enable_truncation(self.max_length)
        self.labels = json.loads((self.cache_path / "labels.json").read_text())
        with np.load(self.cache_path / "arrays.npz") as arrays:
            for role in ROLES:
                if f"{role}_ids" not in arrays:
                    continue
                ids, offsets = arrays[f"{role}_ids"].astype(np.int64), arrays[f"{role}_offsets"]
                labels = arrays[f"{role}_labels"].tolist()
                self.splits[role] = [(ids[a:b], y) for a, b, y in zip(offsets[:-1], offsets[1:], labels, strict=True)]
        log.info("data: %s (%s)", self.cache_path, ", ".join(f"{r} {len(s)}" for r, s in self.splits.items()))
