"""Files written whole or not at all: a reader never sees half of one, and a kill or a full disk leaves the previous
version (and no temporary file) behind. Standard library only: every layer writes with these."""

import errno
import json
import math
import os
import stat
import tempfile
from pathlib import Path

from headlab.errors import DiskFull


def write_atomic(path: Path, write) -> None:
    """write(file) into a temporary file beside `path`, then rename: readers never see half a file, and a kill or
    a full disk leaves the previous file (and no temporary one) behind. A full disk is one DiskFull line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise _disk_full(error, path) from error
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise _disk_full(error, path) from error
        raise


MAX_RECORD_BYTES = 64 * 2**20  # a run's record is KB to a few MB: a larger one (a decompression bomb) is refused


class NotARecord(OSError):
    """A received file that is no plain file of a record's size (a pipe, a device, a link, a folder, too large):
    refused before a byte of it is read (a pipe would block, a device never end)."""


def check_received(path: Path, limit: int | None = MAX_RECORD_BYTES) -> Path:
    """path, where it is a plain file (not a link to one) of at most `limit` bytes; NotARecord otherwise."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        raise
    if not stat.S_ISREG(found.st_mode):
        kind = "a link" if stat.S_ISLNK(found.st_mode) else "a folder" if stat.S_ISDIR(found.st_mode) else "no file"
        raise NotARecord(f"{path} is {kind}: expected a plain file")
    if limit is not None and found.st_size > limit:
        raise NotARecord(f"{path} is {found.st_size:,} bytes, over the {limit:,} a record may be")
    return path


def read_received(path: Path, limit: int | None = MAX_RECORD_BYTES) -> str:
    """The text of a file a run directory holds, which may have come from anyone: check_received's, then read."""
    return check_received(path, limit).read_text(encoding="utf-8")


def _disk_full(error: OSError, path: Path) -> Exception:
    return DiskFull(f"no space left on the device to write {path}") if error.errno == errno.ENOSPC else error


def write_json_atomic(path: Path, obj: dict) -> None:
    """obj as JSON, whole or not at all; a number that is not finite (NaN, Infinity: no JSON) is written null."""
    write_bytes_atomic(path, (json.dumps(_finite(obj), indent=2, default=str, allow_nan=False) + "\n").encode())


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def write_bytes_atomic(path: Path, data: bytes) -> None:
    write_atomic(path, lambda f: f.write(data))


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def append_text_atomic(path: Path, text: str) -> None:
    """The file with text added at its end, written whole again (a reader never sees it half appended)."""
    write_text_atomic(path, path.read_text(encoding="utf-8") + text)
