"""A sweep's run records in one file: every run's results.json, heads.json, metrics.csv and .hydra/ config, and the
sweep's own SWEEP_RECORDS (what its rounds read), as a .tar.xz of a few hundred KB, without checkpoints, figures or
logger files.

headlab-compare reads such an archive as it reads the sweep directory (so a table recomputes from the archive
committed beside it), and `tar -xJf ARCHIVE -C DIR` puts the records back where `sweep.resume=true` finds them
(completed runs are skipped, the others run).
"""

import collections
import contextlib
import functools
import io
import os
import tarfile
from pathlib import Path
from typing import NamedTuple

from headlab import files

RECORDS = ("results.json", "heads.json", "metrics.csv", ".hydra/config.yaml", ".hydra/overrides.yaml")
SWEEP_RECORDS = ("sequential.json",)  # in a sweep directory itself: each arm's rounds (sweep.sequential)
SUFFIXES = (".tar.xz", ".tar.gz", ".tar")
MAX_RECORD_BYTES = files.MAX_RECORD_BYTES  # a larger record (a decompression bomb) is refused
UNREADABLE = (tarfile.TarError, OSError, EOFError, UnicodeDecodeError)  # what a damaged archive raises when read


class TooLarge(ValueError):
    """A record past MAX_RECORD_BYTES, refused before a byte of it is read."""


def is_archive(path: Path) -> bool:
    return path.name.endswith(SUFFIXES) and path.is_file()


def write(path: Path, roots: list[Path]) -> int:
    """Archive the records of every run below the roots (directories holding results.json somewhere below them),
    each under its root's own name (sweep/3/results.json; roots of the same name as sweep, sweep-2, ...); returns
    the number of runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    runs = 0
    mode = {".xz": "w:xz", ".gz": "w:gz"}.get(path.suffix, "w")
    partial = _partial(path)
    names: list[str] = []  # each root's name in the archive, distinct: no path is held twice (duplicates)
    with _replacing(partial, path), tarfile.open(partial, mode) as tar:
        for root in roots:
            names.append(root.name if root.name not in names else f"{root.name}-{names.count(root.name) + 1}")
            for name in SWEEP_RECORDS:
                if (root / name).is_file():
                    tar.add(root / name, arcname=f"{names[-1]}/{name}", recursive=False)
            for results in sorted(root.rglob("results.json")):
                runs += 1
                for name in RECORDS:
                    file = results.parent / name
                    if file.is_file():
                        tar.add(file, arcname=f"{names[-1]}/{file.relative_to(root).as_posix()}", recursive=False)
    return runs


def _partial(path: Path) -> Path:
    """The file an archive is written to before it replaces `path`: one per process, so that two writers of one
    archive never share it."""
    return path.with_name(f"{path.name}.{os.getpid()}.partial")


@contextlib.contextmanager
def _replacing(partial: Path, path: Path):
    """partial becomes path when the block ends; it is removed if the block fails or is interrupted (Ctrl-C)."""
    try:
        yield
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(path)


def duplicates(path: Path) -> list[str]:
    """The member names an archive holds more than once (archives written before roots got distinct names):
    `tar -x` keeps one of each, so a sweep continued from it would lose runs; read() keeps them apart."""
    return sorted(name for name, n in collections.Counter(f.name for f in _files(path)).items() if n > 1)


def rebuild(path: Path) -> int:
    """Rewrite an archive whose roots repeat (duplicates) with every copy of a root under a name of its own
    (sweep, sweep-2, ...), as write() names them; returns the number of runs. The records' bytes are unchanged."""
    runs = read(path)
    partial = _partial(path)
    mode = {".xz": "w:xz", ".gz": "w:gz"}.get(path.suffix, "w")
    with _replacing(partial, path), tarfile.open(partial, mode) as tar:
        for where, records in runs.items():
            root, _, below = where.removeprefix(f"{path}:").partition("/")
            name, _, copy = root.partition("#")
            for record, text in records.items():
                data = text.encode("utf-8")
                info = tarfile.TarInfo("/".join(p for p in (name + (f"-{copy}" if copy else ""), below, record) if p))
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return len(runs)


def read(path: Path) -> dict[str, dict[str, str]]:
    """{run (ARCHIVE:sweep/3): {record name (results.json, heads.json, ...): its text}} of every run archived.
    Archives written before roots got distinct names may hold two roots of one name: a record met twice starts the
    root's next copy (sweep#2/3), so no run hides another."""
    runs: dict[str, dict[str, str]] = {}
    copy: dict[str, int] = {}  # root name -> which of its copies is being read
    for file in _files(path):
        name = _record(file.name)
        if name is None:
            continue
        root, _, below = file.name[: -len(name) - 1].partition("/")
        if name in runs.get(_run(path, root, copy.get(root, 1), below), {}):
            copy[root] = copy.get(root, 1) + 1
        runs.setdefault(_run(path, root, copy.get(root, 1), below), {})[name] = file.read()
    return runs


def sweep_records(path: Path, name: str) -> dict[str, str]:
    """{ARCHIVE:root: its text} of a sweep record (SWEEP_RECORDS) each archived root holds; a record past
    MAX_RECORD_BYTES is TooLarge."""
    return {f"{path}:{f.name.partition('/')[0]}": f.read() for f in _files(path) if f.name.partition("/")[2] == name}


class _File(NamedTuple):
    """A file of an archive: its name, and its text where it is a record (None past MAX_RECORD_BYTES: read()
    raises TooLarge, as for a record that was never read)."""

    name: str
    size: int
    text: str | None

    def read(self) -> str:
        if self.text is None:
            raise TooLarge(f"{self.name} is {self.size:,} bytes, over the {MAX_RECORD_BYTES:,} a record may be")
        return self.text


def _record(name: str) -> str | None:
    """The record (RECORDS) a member's name ends in, or None."""
    return next((r for r in RECORDS if name.endswith("/" + r)), None)


def _files(path: Path) -> tuple[_File, ...]:
    """Every file of an archive, in order, the records' texts read: one decompression of the archive, kept while
    the file is unchanged (its size and time), since reading a table asks an archive several things."""
    stat = path.stat()
    return _files_of(path.resolve(), stat.st_size, stat.st_mtime_ns, MAX_RECORD_BYTES)


@functools.lru_cache(maxsize=16)
def _files_of(path: Path, size: int, mtime_ns: int, limit: int) -> tuple[_File, ...]:
    found = []
    with tarfile.open(path) as tar:
        for member in tar:
            if not member.isfile():
                continue
            wanted = _record(member.name) or member.name.partition("/")[2] in SWEEP_RECORDS
            small = member.size <= limit  # a larger one (a decompression bomb) is never read
            text = tar.extractfile(member).read().decode("utf-8") if wanted and small else None
            found.append(_File(member.name, member.size, text))
    return tuple(found)


def _run(path: Path, root: str, copy: int, below: str) -> str:
    return f"{path}:{root}" + (f"#{copy}" if copy > 1 else "") + f"/{below}"
