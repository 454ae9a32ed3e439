"""Reading a user's TOML file (workload, profile, catalogue) into a dict; every problem is one
line.

tomllib raises more than TOMLDecodeError on hostile input: RecursionError for tables or
arrays nested thousands deep, ValueError for an integer longer than Python's 4,300-digit
conversion limit. Both are a file that is not a usable TOML document, said so here.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from sextant.errors import UserError


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The parsed document of `path`, a `what` file (e.g. "workload")."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{what} file {path} is a directory, not a file")
    if not path.is_file():
        raise UserError(f"{what} file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
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
