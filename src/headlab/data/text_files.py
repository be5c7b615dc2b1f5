"""Reading local text-classification files as released: csv, tsv, json / jsonl and parquet through 🤗 datasets, and
the line formats of the classic benchmarks ("label, whitespace, text", as MR, SUBJ, CR, MPQA and SST-5 ship) and
of fastText (`__label__x text`), in UTF-8 or, detected or declared, another encoding.

A file's format comes from data.files.format, else from its extension, else from its first lines; its encoding
from data.files.encoding, else UTF-8, else cp1252 (Latin-1 with the Windows punctuation these releases use), with
a one-line note. Text is never decoded with replacement characters: a byte the encoding lacks is an error.
"""

import logging
import re
from pathlib import Path

from headlab.conventions import SPLITS, data_dir
from headlab.errors import DataError, first_line

log = logging.getLogger("headlab")
BUILDERS = {  # format -> (datasets builder, its options)
    "csv": ("csv", {}),
    "tsv": ("csv", {"delimiter": "\t", "quoting": 3}),  # quoting 3: quotes are text (SST-2 has them)
    "json": ("json", {}),
    "parquet": ("parquet", {}),
}
LINE_FORMATS = {"lines": "label, whitespace, text", "fasttext": "__label__x text"}
FORMATS = (*BUILDERS, *LINE_FORMATS)
EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
FASTTEXT_LABEL = "__label__"
_LABELLED_LINE = re.compile(r"^(\S{1,40})[ \t]+\S")  # a short label, whitespace, then text
_DESCRIBED = ", ".join(f"{name} ({LINE_FORMATS[name]})" if name in LINE_FORMATS else name for name in FORMATS)


def local_paths(files: dict) -> dict[str, Path]:
    """The data file of each split (files: split -> path, besides the format and encoding keys), checked to exist
    and to have a format that can be told (declared, or from the extension or the first lines)."""
    if not files.get("train"):
        raise DataError(f"data.files.train is not set: give the training file ({_DESCRIBED})")
    declared = files.get("format")
    if declared is not None and declared not in FORMATS:
        raise DataError(f"data.files.format={declared!r} is invalid: expected one of {_DESCRIBED}")
    paths = {}
    for role in SPLITS:
        if not files.get(role):
            continue
        path = Path(files[role]).expanduser()
        if path.is_dir():
            raise DataError(f"data.files.{role}: {path} is a directory: give a file ({_DESCRIBED})")
        if not path.is_file():
            hint = ""
            if path.resolve().is_relative_to(data_dir()):  # a released benchmark (conf/data/mr.yaml, ...)
                hint = f" (the released benchmarks are read from $HEADLAB_DATA, now {data_dir()})"
            raise DataError(f"data.files.{role}: cannot read {path}: no such file{hint}")
        paths[role] = path
    return paths


def file_format(role: str, path: Path, declared: str | None, encoding: str) -> str:
    """The format of a file: declared, from its extension, or told from its first lines (every line
    `__label__x text`: fasttext; every line a short label, whitespace and text: lines)."""
    if declared:
        return declared
    if path.suffix.lower() in EXTENSIONS:
        return EXTENSIONS[path.suffix.lower()]
    with path.open(encoding=encoding, errors="strict") as f:
        head = [line for line in (f.readline() for _ in range(50)) if line.strip()]
    if head and all(line.startswith(FASTTEXT_LABEL) for line in head):
        return "fasttext"
    if head and all(_LABELLED_LINE.match(line) for line in head):
        return "lines"
    raise DataError(
        f"data.files.{role}: cannot tell the format of {path} from its extension or first lines: set "
        f"data.files.format to one of {_DESCRIBED}"
    )


def file_encoding(role: str, path: Path, declared: str | None) -> str:
    """The encoding to read a text file with: declared (checked: every byte decodes), else UTF-8, else cp1252, else
    Latin-1 (every byte is a character); a file that is not UTF-8 gets a one-line note."""
    data = path.read_bytes()
    if declared:
        try:
            data.decode(declared)
        except LookupError:
            raise DataError(f"data.files.encoding={declared!r} is invalid: expected an encoding Python knows") from None
        except UnicodeDecodeError as error:
            raise DataError(f"data.files.{role}: {path} is not {declared}: {_where(error)}") from None
        return declared
    try:
        data.decode("utf-8")
        return "utf-8"
    except UnicodeDecodeError as error:
        not_utf8 = _where(error)
    for fallback in ("cp1252", "latin-1"):
        try:
            data.decode(fallback)
        except UnicodeDecodeError:
            continue
        log.info("data: %s is not UTF-8 (%s): read as %s; set data.files.encoding to choose", path, not_utf8, fallback)
        return fallback
    raise AssertionError("latin-1 decodes every byte")


def _where(error: UnicodeDecodeError) -> str:
    return f"byte 0x{error.object[error.start]:02x} at offset {error.start}"


def read_files(paths: dict[str, Path], files: dict, column_names, columns: dict) -> dict:
    """Each file as a Dataset. files: the format and encoding keys of data.files; column_names: the columns of
    headerless csv/tsv files (all, or per split); columns: data.text_column and data.label_column, the names
    given to a line format's text and label."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # a file that fails is reported below, once
    data, told = {}, {}
    for role, path in paths.items():
        encoding = None if path.suffix.lower() == ".parquet" else file_encoding(role, path, files.get("encoding"))
        kind = file_format(role, path, files.get("format"), encoding or "utf-8")
        if kind in LINE_FORMATS:
            if not files.get("format") and path.suffix.lower() not in EXTENSIONS:
                told.setdefault(kind, []).append(str(path))
            rows = read_lines(role, path, kind, encoding)
            data[role] = datasets.Dataset.from_dict({columns["label_column"]: rows[0], columns["text_column"]: rows[1]})
            continue
        data[role] = _read_table(role, path, kind, encoding, column_names)
    for kind, where in told.items():
        log.info(
            "data: reading %s as one example a line, %s (data.files.format=%s)",
            ", ".join(where),
            LINE_FORMATS[kind],
            kind,
        )
    return data


def _read_table(role: str, path: Path, kind: str, encoding: str | None, column_names):
    import datasets

    builder, options = BUILDERS[kind]
    names = column_names.get(role) if isinstance(column_names, dict) else column_names
    if names and builder == "csv":
        options = {**options, "column_names": list(names)}
    if encoding and builder in ("csv", "json"):
        options = {**options, "encoding": encoding}
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train", **options)
    except Exception as error:  # datasets raises many types for unreadable files
        if "corresponds to no data" in str(error):  # what datasets says of a file with no rows
            raise DataError(f"the {role} split of {path} is empty") from None
        cause = error.__cause__ or error  # DatasetGenerationError wraps what the parser said
        raise DataError(f"data.files.{role}: cannot read {path}: {first_line(cause)}") from None


def read_lines(role: str, path: Path, kind: str, encoding: str) -> tuple[list[str], list[str]]:
    """(labels, texts) of a line format; blank lines are skipped. lines: the first whitespace-separated word is the
    label; fasttext: the leading `__label__x` word (one label a line: multi-label lines are refused)."""
    labels, texts = [], []
    with path.open(encoding=encoding, errors="strict", newline=None) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            label, text = (*line.split(None, 1), "")[:2]  # the label, and the rest of the line
            text = text.strip()
            if kind == "fasttext":
                if not label.startswith(FASTTEXT_LABEL):
                    raise DataError(f"data.files.{role}: line {number} of {path} does not start with __label__")
                if text.startswith(FASTTEXT_LABEL):
                    raise DataError(
                        f"data.files.{role}: line {number} of {path} has more than one label (multi-label data is "
                        "not supported)"
                    )
                label = label.removeprefix(FASTTEXT_LABEL)
            labels.append(label)
            texts.append(text)
    if not labels:
        raise DataError(f"the {role} split of {path} is empty")
    return labels, texts
