"""Framework-neutral checkpoint directories: written atomically, authenticated and verified
on load.

Protocol (every backend): the framework writes its native checkpoint into
`<dir>/step-00000012.partial/`; when every rank is done, rank 0 writes `manifest.json` (step,
world size, the workload's state hash, sha256 and size of every file, and an HMAC of all of
it) into it and renames the directory to `<dir>/step-00000012`. A crash at any point leaves either a
`.partial` directory (ignored) or a complete, sealed one.

Trust model (docs/reliability.md): the manifest's HMAC-SHA256 is keyed with a secret kept in
this user's sextant config directory (`keys.checkpoint_key`), so a directory written by
anyone else, or edited after it was sealed, is refused before any framework reads it (torch's
distributed checkpoint unpickles its `.metadata`: loading a crafted one runs code). A
checkpoint from elsewhere can be loaded on purpose with `--trust-checkpoint`, which skips the
authentication, never the checksums.

On resume, checkpoints are tried newest first; one that is unauthenticated, written for
another workload, malformed, or whose files do not match their checksums is refused with a
message, and the previous good one is used. The parent checks the same before it launches
(`preflight`), so a resume that cannot work is refused in one line instead of training from
step 0.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shutil
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from sextant.errors import UserError
from sextant.fsutil import atomic_write_json
from sextant.keys import checkpoint_key

if TYPE_CHECKING:  # the contracts import the workload and strategy modules
    from sextant.backends.contracts import WorkerContext

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 2
"""2: the manifest carries an `hmac`; schema-1 manifests (unauthenticated) are refused."""
_STEP_DIR = re.compile(r"step-(\d{8})")
_SHA256 = re.compile(r"[0-9a-f]{64}")
FOREIGN_WORKLOAD = "written for another workload"
"""The refusal that stops a resume at once (see `preflight`)."""


class CheckpointRefused(UserError):
    """`--resume` was asked for, and no checkpoint in the directory may be used."""


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def partial_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}.partial"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _signature(manifest: dict[str, Any]) -> str:
    """HMAC-SHA256 of the manifest's canonical JSON (every key but `hmac` itself)."""
    body = {k: v for k, v in manifest.items() if k != "hmac"}
    blob = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(checkpoint_key(), blob, hashlib.sha256).hexdigest()


def seal(root: str | Path, step: int, meta: dict[str, Any]) -> Path:
    """Checksum the partial directory, write its signed manifest, and publish it atomically."""
    partial, final = partial_dir(root, step), step_dir(root, step)
    files = {}
    for path in _files(partial):
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        files[path.relative_to(partial).as_posix()] = {"sha256": _sha256(path),
                                                       "bytes": path.stat().st_size}
    manifest = {"schema": MANIFEST_SCHEMA, "step": step, "files": files, **meta}
    atomic_write_json(partial / MANIFEST, {**manifest, "hmac": _signature(manifest)})
    if final.exists():  # the same step saved again (a resumed run): replace it
        stale = final.with_name(final.name + ".stale")
        shutil.rmtree(stale, ignore_errors=True)
        os.replace(final, stale)
        os.replace(partial, final)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        os.replace(partial, final)
    _fsync_dir(Path(root))
    return final


def _read_manifest(directory: Path) -> dict[str, Any] | str:
    """The manifest, or what is wrong with its form (checked before any value is used)."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return "unreadable manifest"
    if not isinstance(manifest, dict):
        return "malformed manifest (not a JSON object)"
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return "malformed manifest ('files' is not a table of files)"
    for name, entry in files.items():
        parts = PurePosixPath(name).parts
        if not parts or PurePosixPath(name).is_absolute() or ".." in parts or "\\" in name:
            return f"malformed manifest (file name {name[:80]!r} leaves the checkpoint)"
        if not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str)
                and _SHA256.fullmatch(entry["sha256"])
                and type(entry.get("bytes")) is int and entry["bytes"] >= 0):
            return f"malformed manifest (entry of {name[:80]!r})"
    return manifest


def verify(directory: Path, *, state_hash: str | None = None, trust: bool = False
           ) -> str | None:
    """None when the checkpoint is authentic (or `trust`), of this workload (when
    `state_hash` is given), complete and intact; else what is wrong with it. Only the
    manifest (JSON) and the files' bytes are read: nothing is unpickled here."""
    if not (directory / MANIFEST).is_file():
        return "no manifest (the save did not finish)"
    manifest = _read_manifest(directory)
    if isinstance(manifest, str):
        return manifest
    if not trust:
        signature = manifest.get("hmac")
        if not (isinstance(signature, str) and hmac.compare_digest(signature,
                                                                   _signature(manifest))):
            return ("not signed with this user's checkpoint key (written by another user or "
                    "sextant version, or edited since); pass --trust-checkpoint to load it "
                    "anyway")
    match = _STEP_DIR.fullmatch(directory.name)
    if match is None or manifest.get("step") != int(match.group(1)):
        return f"manifest is of step {manifest.get('step')!r}, not of {directory.name}"
    if state_hash is not None and manifest.get("state_hash") != state_hash:
        return (f"{FOREIGN_WORKLOAD} (model, data, optimizer or seed differ: state hash "
                f"{manifest.get('state_hash')!r}, this workload's {state_hash!r})")
    listed: dict[str, Any] = manifest["files"]
    present = {p.relative_to(directory).as_posix() for p in _files(directory)}
    missing = sorted(set(listed) - present)
    if missing:
        return f"missing file {missing[0]}"
    unlisted = sorted(present - set(listed))
    if unlisted:
        return f"file {unlisted[0]} is not in the manifest (added since the save)"
    for name, entry in sorted(listed.items()):
        path = directory / name
        if path.stat().st_size != entry["bytes"]:
            return f"{name} is {path.stat().st_size} bytes, manifest says {entry['bytes']} (truncated?)"
        if _sha256(path) != entry["sha256"]:
            return f"{name} does not match its checksum (corrupted)"
    return None


def candidates(root: str | Path) -> list[Path]:
    """The sealed-looking checkpoint directories under `root`, newest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.fullmatch(p.name)]
    return sorted(found, key=lambda p: int(p.name[5:]), reverse=True)


def latest_valid(root: str | Path, *, state_hash: str | None = None, trust: bool = False
                 ) -> tuple[int | None, Path | None, list[str]]:
    """(step, directory, refusals): the newest usable checkpoint, and why newer ones were
    refused."""
    refusals: list[str] = []
    for directory in candidates(root):
        problem = verify(directory, state_hash=state_hash, trust=trust)
        if problem is None:
            return int(directory.name[5:]), directory, refusals
        refusals.append(f"checkpoint {directory.name} refused: {problem}")
    return None, None, refusals


def preflight(workload: Any, strategy: Any) -> list[str]:
    """In the parent, before any worker starts: refuse a `--resume` that cannot do what it
    says (CheckpointRefused, one line); return warnings to show (refused newer checkpoints, or no
    checkpoint yet). Also creates the user's checkpoint key before ranks race to."""
    if not (strategy.resume or strategy.checkpoint_every):
        return []
    checkpoint_key()
    if not strategy.resume:
        return []
    root = Path(strategy.checkpoint_dir)
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise CheckpointRefused(f"--resume: checkpoint directory {root} {what} "
                                "(check --checkpoint-dir)")
    step, _, refusals = latest_valid(root, state_hash=workload.state_hash(),
                                     trust=strategy.trust_checkpoint)
    foreign = [r for r in refusals if FOREIGN_WORKLOAD in r]
    if foreign:
        raise CheckpointRefused(f"--resume: {root}: {foreign[0]}; use another --checkpoint-dir")
    if step is None and refusals:
        older = f" (and {len(refusals) - 1} older refused)" if len(refusals) > 1 else ""
        raise CheckpointRefused(
            f"--resume: no usable checkpoint in {root}: {refusals[0]}{older}")
    if step is None:
        return [f"--resume: no checkpoint in {root} yet: training starts at step 0"]
    return refusals


def _checkpoint_dir(ctx: WorkerContext) -> str:
    """The run's checkpoint directory (Strategy refuses checkpointing or --resume without
    one, so a worker never gets here without it)."""
    root = ctx.strategy.checkpoint_dir
    if root is None:
        raise UserError("checkpointing and --resume need --checkpoint-dir")
    return root


def save_sealed(ctx: WorkerContext, step: int, write: Any, barrier: Any) -> Path:
    """One checkpoint save, the same for every backend: rank 0 clears a stale partial
    directory, every rank calls `write(partial_dir)` (the framework's native save), and rank 0
    seals the directory once all ranks are done. `barrier()` waits for every rank (a no-op in
    a single process)."""
    root = _checkpoint_dir(ctx)
    partial = partial_dir(root, step)
    if ctx.rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
    barrier()
    write(partial)
    barrier()
    if ctx.rank == 0:
        seal(root, step, {"world": ctx.world, "framework": ctx.strategy.framework,
                          "strategy": ctx.strategy.label,
                          "state_hash": ctx.workload.state_hash()})
    barrier()
    return step_dir(root, step)


def resume_point(ctx: WorkerContext, notes: list[str]) -> tuple[int, Path | None]:
    """(step, directory) to resume from: the newest usable checkpoint, or (0, None). Every
    refused checkpoint and the outcome are appended to `notes` and emitted as events."""
    step, directory, refusals = latest_valid(
        _checkpoint_dir(ctx), state_hash=ctx.workload.state_hash(),
        trust=ctx.strategy.trust_checkpoint)
    for refusal in refusals:
        notes.append(refusal)
        ctx.emit("warning", message=refusal)
    if directory is None or step is None:
        notes.append("no valid checkpoint found: started from step 0")
        return 0, None
    notes.append(f"resumed from {directory.name}")
    ctx.emit("resumed", step=step, checkpoint=str(directory))
    return int(step), directory
