"""Reading a user's TOML file (workload, profile, catalogue) into a dict; every problem is one
line.

tomllib raises more than TOMLDecodeError on hostile input: RecursionError for tables or
arrays nested thousands deep, ValueError for an integer longer than Python's 4,300-digit
conversion limit. Both are a file that is not a usable TOML document, said so here.
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from sextant.core.errors import UserError


MAX_TOML_BYTES = 16 << 20
"""A workload, profile or catalogue file is a few kilobytes; more is not one of them."""


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The parsed document of `path`, a `what` file (e.g. "workload")."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{what} file {path} is a directory, not a file")
    if not path.exists():
        raise UserError(f"{what} file not found: {path}")
    try:
        # O_NONBLOCK: a FIFO put in the file's place is refused below, never waited on.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise UserError(f"{what} file {path} is not a regular file (a FIFO, device "
                                f"or socket); give a TOML file")
            blob = f.read(MAX_TOML_BYTES + 1)
        if len(blob) > MAX_TOML_BYTES:
            raise UserError(f"{what} file {path} is larger than {MAX_TOML_BYTES >> 20} MiB: "
                            f"not a {what} TOML file")
        text = blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text (byte {exc.start}): expected a {what} "
                        f"TOML file") from None
    except OSError as exc:
        raise UserError(f"cannot read {what} file {path}: {exc.strerror}") from None
    return parse_toml(text, str(path))


def parse_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{source} is not valid TOML: {exc}") from None
    except RecursionError:
        raise UserError(f"{source} is not valid TOML: nested too deeply") from None
    except ValueError as exc:  # int() over the 4,300-digit limit
        raise UserError(f"{source} is not valid TOML: {str(exc).split(';')[0]}") from None
