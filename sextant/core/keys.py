"""This user's sextant config directory, the secret key that signs their checkpoints, and the
one signing code that checkpoints and the run collector share.

The directory is `$SEXTANT_CONFIG_DIR`, else `$XDG_CONFIG_HOME/sextant`, else
`~/.config/sextant`. The key (32 random bytes, hex) is created on first use, readable by this
user only; it is published with a hard link, so ranks racing to create it all end up reading
the same complete file.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import secrets
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sextant.core.errors import UserError

CHECKPOINT_KEY = "checkpoint.key"


def config_dir() -> Path:
    explicit = os.environ.get("SEXTANT_CONFIG_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sextant"


@functools.cache
def _key_at(path: Path) -> bytes:
    if not path.exists():
        _create(path)
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UserError(f"checkpoint key {path} is readable by others (mode "
                        f"{stat.S_IMODE(mode):o}); run: chmod 600 {path}")
    text = path.read_text(encoding="ascii", errors="replace").strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 32:
        raise UserError(f"checkpoint key {path} is not 64 hex digits; delete it to make a new "
                        "one (checkpoints signed with the old key will then be refused)")
    return key


def _create(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".checkpoint.key.")
    except OSError as exc:
        raise UserError(f"cannot create the checkpoint key in {path.parent}: "
                        f"{exc.strerror}") from None
    try:
        with os.fdopen(fd, "w") as f:  # mkstemp: mode 0600
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made it first: use theirs
    finally:
        os.unlink(tmp)


def checkpoint_key() -> bytes:
    """The secret that signs this user's checkpoint manifests (created on first use)."""
    return _key_at(config_dir() / CHECKPOINT_KEY)


def sign(key: bytes, doc: Mapping[str, Any], *, field: str, context: bytes = b"") -> str:
    """HMAC-SHA256 of `context` and `doc`'s canonical JSON (sorted keys, no spaces), every key
    but `field`, the one that carries the signature. `context` binds the signature to
    something outside the document (the collector's per-connection challenge), so a signed
    message replayed on another connection does not verify."""
    body = {k: v for k, v in doc.items() if k != field}
    blob = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, context + blob, hashlib.sha256).hexdigest()


def signed(key: bytes, doc: Mapping[str, Any], *, field: str, context: bytes = b"") -> bool:
    """Whether `doc[field]` is `sign(key, doc, ...)`, compared in constant time."""
    signature = doc.get(field)
    return isinstance(signature, str) and hmac.compare_digest(
        signature, sign(key, doc, field=field, context=context))
