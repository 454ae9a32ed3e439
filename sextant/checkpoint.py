"""Framework-neutral checkpoint directories: written atomically, verified on load.

Protocol (every backend): the framework writes its native checkpoint into
`<dir>/step-00000012.partial/`; when every rank is done, rank 0 writes `manifest.json` (step,
world size, workload hash, sha256 and size of every file) into it and renames the directory
to `<dir>/step-00000012`. A crash at any point leaves either a `.partial` directory (ignored)
or a complete, sealed one. On resume, checkpoints are tried newest first; one whose manifest
is missing or whose files do not match their checksums is refused with a message, and the
previous good one is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from sextant.fsutil import atomic_write_json

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 1


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


def seal(root: str | Path, step: int, meta: dict[str, Any]) -> Path:
    """Checksum the partial directory, write its manifest, and publish it atomically."""
    partial, final = partial_dir(root, step), step_dir(root, step)
    files = {}
    for path in _files(partial):
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        files[str(path.relative_to(partial))] = {"sha256": _sha256(path),
                                                 "bytes": path.stat().st_size}
    atomic_write_json(partial / MANIFEST, {"schema": MANIFEST_SCHEMA, "step": step,
                                           "files": files, **meta})
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


def verify(directory: Path) -> str | None:
    """None when the checkpoint is complete and intact, else what is wrong with it."""
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        return "no manifest (the save did not finish)"
    try:
        manifest = json.loads(manifest_path.read_text())
        listed = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return "unreadable manifest"
    present = {str(p.relative_to(directory)) for p in _files(directory)}
    missing = sorted(set(listed) - present)
    if missing:
        return f"missing file {missing[0]}"
    for name, entry in sorted(listed.items()):
        path = directory / name
        if path.stat().st_size != entry["bytes"]:
            return f"{name} is {path.stat().st_size} bytes, manifest says {entry['bytes']} (truncated?)"
        if _sha256(path) != entry["sha256"]:
            return f"{name} does not match its checksum (corrupted)"
    return None


def latest_valid(root: str | Path) -> tuple[int | None, Path | None, list[str]]:
    """(step, directory, refusals): the newest intact checkpoint, and why newer ones were
    refused."""
    root = Path(root)
    refusals: list[str] = []
    if not root.is_dir():
        return None, None, refusals
    candidates = sorted(
        (p for p in root.glob("step-*") if p.is_dir() and p.name[5:].isdigit()),
        key=lambda p: int(p.name[5:]), reverse=True,
    )
    for directory in candidates:
        problem = verify(directory)
        if problem is None:
            return int(directory.name[5:]), directory, refusals
        refusals.append(f"checkpoint {directory.name} refused: {problem}")
    return None, None, refusals


def save_sealed(ctx: Any, step: int, write: Any, barrier: Any) -> Path:
    """One checkpoint save, the same for every backend: rank 0 clears a stale partial
    directory, every rank calls `write(partial_dir)` (the framework's native save), and rank 0
    seals the directory once all ranks are done. `barrier()` waits for every rank (a no-op in
    a single process)."""
    root = ctx.strategy.checkpoint_dir
    partial = partial_dir(root, step)
    if ctx.rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
    barrier()
    write(partial)
    barrier()
    if ctx.rank == 0:
        seal(root, step, {"world": ctx.world, "framework": ctx.strategy.framework,
                          "strategy": ctx.strategy.label,
                          "workload_hash": ctx.workload.content_hash()})
    barrier()
    return step_dir(root, step)


def resume_point(ctx: Any, notes: list[str]) -> tuple[int, Path | None]:
    """(step, directory) to resume from: the newest intact checkpoint, or (0, None). Every
    refused checkpoint and the outcome are appended to `notes` and emitted as events."""
    step, directory, refusals = latest_valid(ctx.strategy.checkpoint_dir)
    for refusal in refusals:
        notes.append(refusal)
        ctx.emit("warning", message=refusal)
    if directory is None:
        notes.append("no valid checkpoint found: started from step 0")
        return 0, None
    notes.append(f"resumed from {directory.name}")
    ctx.emit("resumed", step=step, checkpoint=str(directory))
    return int(step), directory
