"""Files written whole or not at all: a reader never sees half of one, and a kill or a full disk leaves the previous
version (and no temporary file) behind. Standard library only: every layer writes with these."""

import errno
import json
import os
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


def _disk_full(error: OSError, path: Path) -> Exception:
    return DiskFull(f"no space left on the device to write {path}") if error.errno == errno.ENOSPC else error


def write_json_atomic(path: Path, obj: dict) -> None:
    write_bytes_atomic(path, (json.dumps(obj, indent=2, default=str) + "\n").encode())


def write_bytes_atomic(path: Path, data: bytes) -> None:
    write_atomic(path, lambda f: f.write(data))


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def append_text_atomic(path: Path, text: str) -> None:
    """The file with text added at its end, written whole again (a reader never sees it half appended)."""
    write_text_atomic(path, path.read_text(encoding="utf-8") + text)
