"""Atomic file writes (a reader sees the old file or the new one, never half of one), and a
process's private scratch directory."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from sextant.core.errors import UserError


class CannotWrite(UserError, OSError):
    """A one-line UserError for the CLI that is still an OSError for code that handles those
    (e.g. the launcher's best-effort metrics file)."""


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` atomically; a path that cannot be written (a directory, no
    permission, a file where a directory should be, a full disk) is a one-line UserError."""
    path = Path(path)
    try:
        _atomic_write(path, data)
    except OSError as exc:
        why = "it is a directory" if path.is_dir() else (exc.strerror or str(exc))
        raise CannotWrite(f"cannot write {path}: {why}") from None


def _atomic_write(path: Path, data: bytes) -> None:
    with atomic_output(path) as f:
        f.write(data)


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[BinaryIO]:
    """A binary file that becomes `path` when the block ends without an exception (written
    to a temporary file beside it, fsynced, renamed over it); on an exception the temporary
    file is removed and `path` is left as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


_PRIVATE: list[tuple[Path, str | None]] = []


def private_tempdir(prefix: str, parent: Path | None = None) -> Path:
    """Point this process's `tempfile` at a fresh directory of its own, for a framework that
    leaves scratch files behind: TensorFlow's autograph writes a module per converted function
    to the temp directory and deletes them from an atexit hook, which a worker's fast exit
    (sextant.launch.worker.exit_now) skips. remove_private_tempdirs() deletes the directory
    and restores the previous one (the worker calls it when its rank ends; at interpreter exit
    as well). Under `parent` if given (a rank's run directory: a process killed before it
    could clean up leaves its scratch files there, not in /tmp)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    _PRIVATE.append((path, tempfile.tempdir))
    tempfile.tempdir = str(path)
    return path


@atexit.register
def remove_private_tempdirs() -> None:
    while _PRIVATE:
        path, previous = _PRIVATE.pop()
        tempfile.tempdir = previous
        shutil.rmtree(path, ignore_errors=True)
