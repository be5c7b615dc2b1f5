"""Text classification through 🤗 datasets: hub datasets and local files share one pipeline (text_pipeline).

The cache key covers everything that shapes the prepared data (the data's fingerprint, columns, tokenizer
settings, max length, seed), so the second run starts at once and a changed setting never reuses a stale cache.
A failed preparation writes nothing; a damaged cache entry is detected by its checksums and rebuilt.
"""

import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch

from headlab.conventions import SPLITS, cache_root
from headlab.data import folds
from headlab.data import text_files as files_reader
from headlab.data import text_pipeline as pipeline
from headlab.data.datamodule import ExampleDataModule
from headlab.errors import DataError
from headlab.files import write_atomic

log = logging.getLogger("headlab")


class TextDataModule(ExampleDataModule):
    """Sequence classification of text (or text pairs) from the hub (`hub`) or from local files (`files`).

    files: {"train": path, "val": path or null, "test": path or null, "format": null or a format of
    headlab.data.text_files, "encoding": null or an encoding}; column_names: the columns of headerless csv/tsv
    files, for all of them or per split ({"test": [...]}); hub_splits: {"train": name, "val": name or null, "test":
    name or null}. A missing val split is carved from train (seeded, stratified). empty_text: "refuse" a row
    without text, or "keep" it as an example (some releases have such rows). cv: {"folds": k, "fold": j,
    "seed": s}: fold j of k stratified folds of train (headlab.data.folds) is the test split, the others train.
    saved: a folder with the tokenizer.json and labels.json a run trained with (its run directory's data/, written
    by keep_in): they are used instead of a tokenizer learned again and labels read again (headlab sets it when it
    reloads a run: resume, headlab-eval, headlab-heads).
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
        empty_text: str = "refuse",
        cv: dict | None = None,
        tokenizer: dict | None = None,
        max_length: int = 128,
        batch_size: int = 64,
        num_workers: int = 0,
        bucketing: bool = True,
        cache_dir: str | None = None,
        seed: int = 0,
        saved: str | None = None,
    ):
        super().__init__(batch_size, num_workers, bucketing, seed)
        self.columns = {"text_column": text_column, "text_pair_column": text_pair_column, "label_column": label_column}
        self.declared_classes, self.hub, self.hub_config = n_classes, hub, hub_config
        self.hub_splits = dict(hub_splits or {"train": "train", "val": "validation", "test": "test"})
        self.files = {key: (files or {}).get(key) for key in (*SPLITS, "format", "encoding")}
        self.cv = {"folds": None, "fold": None, "seed": 0, **(cv or {})}
        self.column_names, self.val_fraction, self.max_length = column_names, val_fraction, max_length
        self.empty_text = empty_text
        defaults = {"kind": "wordpiece", "vocab_size": 8000, "lowercase": True, "path": None, "hub": None}
        self.tokenizer_config = {**defaults, **(tokenizer or {})}
        self.cache_root = cache_root() if cache_dir is None else cache_dir
        self.tokenizer = None
        self.labels: list = []
        self.cache_path = None
        self.loaded_from_cache = False
        self.saved = Path(saved) if saved else None
        self.fingerprint: dict = {}

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

    def class_name(self, index: int) -> str:
        return str(self.labels[index])

    def token_strings(self, ids: torch.Tensor) -> list[str]:
        return [self.tokenizer.id_to_token(i) for i in ids.tolist()]

    def describe(self) -> dict:
        """Also the label of each class id (the mapping of string labels), where the prepared data lives, and the
        digests of the data files (their sha256; a hub dataset's fingerprint) and of the tokenizer."""
        described = super().describe()
        described["digests"].update(files=self.fingerprint, tokenizer=self._tokenizer_digest())
        return {**described, "labels": self.labels, "cache": str(self.cache_path), "from_cache": self.loaded_from_cache}

    def _tokenizer_digest(self) -> str:
        return hashlib.sha256(self.tokenizer.to_str().encode()).hexdigest()

    def keep_in(self, run_dir: Path) -> None:
        """Also data/tokenizer.json and data/labels.json: what a reload of the run reads instead of preparing them
        again."""
        super().keep_in(run_dir)
        for name, text in (("tokenizer.json", self.tokenizer.to_str()), ("labels.json", json.dumps(self.labels))):
            write_atomic(Path(run_dir) / "data" / name, lambda f, text=text: f.write(text.encode()))

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text).ids, dtype=np.int64)

    def setup(self, stage: str | None = None) -> None:
        """read -> check -> labels -> carve validation -> tokenizer -> tokenize -> cache (or read the cache)."""
        if self.splits:
            return
        pipeline.check_cache_root(Path(self.cache_root))
        if self.hub is None:  # local files: their content hash is the fingerprint, a cache hit needs no datasets
            paths = files_reader.local_paths(self.files)
            fingerprint = {role: pipeline.sha256(p) for role, p in paths.items()}
            where = {r: str(p) for r, p in paths.items()}
            read = lambda: files_reader.read_files(paths, self.files, self.column_names, self.columns)  # noqa: E731
        else:
            hub_data = pipeline.read_hub(self.hub, self.hub_config, self.hub_splits)
            fingerprint = {role: ds._fingerprint for role, ds in hub_data.items()}
            read, where = (lambda: hub_data), dict.fromkeys(hub_data, self.hub)
        self.fingerprint = fingerprint
        self.cache_path = Path(self.cache_root) / pipeline.cache_key(self._settings(fingerprint))
        state = pipeline.cache_state(self.cache_path)
        if state != "complete":
            with pipeline.preparing(self.cache_path):
                state = pipeline.cache_state(self.cache_path)  # complete if another process prepared it meanwhile
                if state != "complete":
                    self._prepare_logged(read, where, state)
        self.loaded_from_cache = state == "complete"
        self.tokenizer, self.labels, self.splits = pipeline.read_cache(self.cache_path, self.max_length)
        self._check_classes()
        counts = ", ".join(f"{r} {len(s):,}" for r, s in self.splits.items())
        log.info("data: %s examples, %d classes, %d tokens in the vocabulary", counts, self.n_classes, self.vocab_size)

    def _prepare_logged(self, read, where: dict, state: str) -> None:
        if state != "missing":
            log.warning("data cache entry %s is %s; rebuilding it", self.cache_path, state)
        started = time.perf_counter()
        log.info("data: preparing %s", ", ".join(f"{r} from {w}" for r, w in where.items()))
        self._prepare(read(), where)
        log.info("data: prepared in %.0f s, cached in %s", time.perf_counter() - started, self.cache_path)

    def _check_classes(self) -> None:
        """Training labels of one class leave nothing to learn: refused, or a recorded warning when data.n_classes
        is declared (then it may be meant)."""
        classes = {y for _, y in self.splits["train"]}
        if len(classes) > 1:
            return
        only = self.labels[classes.pop()]
        if not self.declared_classes:
            raise DataError(
                f"every training label is {only!r}: one class, nothing to learn (declare data.n_classes if meant)"
            )
        self.warn(f"every training label is {only!r}: one of the {self.declared_classes} declared classes")

    def _prepare(self, data: dict, where: dict) -> None:
        text, pair, label = (self.columns[k] for k in ("text_column", "text_pair_column", "label_column"))
        for role, rows in pipeline.check_columns(data, self.columns, where, self.empty_text).items():
            if rows:
                log.info(
                    "data: %d rows of %s (%s) have no text: kept as examples (data.empty_text)", rows, where[role], role
                )
        saved = pipeline.read_saved(self.saved) if self.saved else None
        known = saved[1] if saved else None
        labels = pipeline.label_vocabulary(data, label, self.declared_classes, where, known)
        if self.cv["folds"]:
            k, fold = self.cv["folds"], self.cv["fold"]
            data = folds.split_fold(data, label, k, fold, self.cv["seed"])
            where["test"] = f"{where['train']} (fold {fold} of {k})"
            log.info("data: cross-validation: fold %d of %d (seed %d) is the test split", fold, k, self.cv["seed"])
        data = pipeline.carve_validation(data, label, self.val_fraction, self._carve_seed())
        train = data["train"]
        if saved:
            tokenizer = saved[0]
            log.info("data: tokenizing with the tokenizer %s kept", self.saved)
        else:
            texts = pipeline.read_column(train, text) + (pipeline.read_column(train, pair) if pair else [])
            config = self.tokenizer_config
            if not (config["path"] or config["hub"]):
                log.info(
                    "data: learning a %s vocabulary of %d tokens from %s texts",
                    config["kind"],
                    config["vocab_size"],
                    f"{len(texts):,}",
                )
            tokenizer = pipeline.make_tokenizer(config, texts)
        log.info("data: tokenizing %s", ", ".join(f"{role} ({len(ds):,})" for role, ds in data.items()))
        arrays = {
            role: pipeline.tokenize(
                tokenizer,
                pipeline.read_column(ds, text),
                pipeline.read_column(ds, pair) if pair else None,
                pipeline.read_column(ds, label),
                labels,
                self.max_length,
            )
            for role, ds in data.items()
        }
        pipeline.write_cache(self.cache_path, arrays, tokenizer, labels)

    def _carve_seed(self) -> int:
        """The seed of the validation carve: data.cv.seed under cross-validation (every run of a fold, whatever its
        seed, trains on the same data and tokenizer: one pack holds them), else the run's."""
        return self.cv["seed"] if self.cv["folds"] else self.seed

    def _carves_validation(self) -> bool:
        return not (self.files["val"] if self.hub is None else self.hub_splits.get("val"))

    def _settings(self, fingerprint: dict) -> dict:
        return {
            "source": self.hub or "files",
            "hub_config": self.hub_config,
            "fingerprint": fingerprint,
            "columns": list(self.columns.values()),
            "column_names": self.column_names,
            "n_classes": self.declared_classes,
            "val_fraction": self.val_fraction,
            "empty_text": self.empty_text,
            "cv": self.cv if self.cv["folds"] else None,
            # the seed shapes the data only by the carve: runs with other seeds (a pack's members) share the entry
            # otherwise
            "seed": self._carve_seed() if self._carves_validation() else None,
            "tokenizer": self.tokenizer_config if self.saved is None else pipeline.saved_digests(self.saved),
            "max_length": self.max_length,
        }
