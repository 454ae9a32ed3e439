"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from sextant.errors import UserError


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
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
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
