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

On resume, the parent tries checkpoints newest first (`preflight`): one that is
unauthenticated, written for another workload, malformed, holds a symbolic link or anything
but regular files and directories, or whose files do not match their checksums is refused
with a message, and the previous good one is used; the run says which one it resumes from,
and a resume that cannot work is refused in one line instead of training from step 0. Every
rank then loads exactly that checkpoint, verified at the point of use (`stage`): each file is
opened once (never through a symbolic link), hashed and copied from the same descriptor into
a fresh private directory (0700), and the framework loads that copy, so a file swapped after
the check is never read. A rank that refuses the checkpoint the parent accepted stops the run
(`CheckpointChanged`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from sextant.core.errors import UserError
from sextant.core.fsutil import atomic_write_json
from sextant.core.keys import checkpoint_key, sign, signed

from sextant.contracts import WorkerContext

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 2
"""2: the manifest carries an `hmac`; schema-1 manifests (unauthenticated) are refused."""
_STEP_DIR = re.compile(r"step-(\d{8})")
_SHA256 = re.compile(r"[0-9a-f]{64}")
FOREIGN_WORKLOAD = "written for another workload"
"""The refusal that stops a resume at once (see `preflight`)."""


MAX_MANIFEST_BYTES = 16 << 20


class CheckpointRefused(UserError):
    """`--resume` was asked for, and no checkpoint in the directory may be used."""


class CheckpointChanged(CheckpointRefused):
    """A rank refused the checkpoint the launching process accepted (changed since, or this
    host holds another copy): the run stops instead of training from another state."""


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
    """Checksum the partial directory, write its signed manifest, and publish it atomically."""
    partial, final = partial_dir(root, step), step_dir(root, step)
    files = {}
    for path in _files(partial):
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        files[path.relative_to(partial).as_posix()] = {"sha256": _sha256(path),
                                                       "bytes": path.stat().st_size}
    manifest = {"schema": MANIFEST_SCHEMA, "step": step, "files": files, **meta}
    atomic_write_json(partial / MANIFEST, {**manifest, "hmac": sign(checkpoint_key(), manifest,
                                                                field="hmac")})
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


def _read_manifest(blob: bytes) -> dict[str, Any] | str:
    """The manifest, or what is wrong with its form (checked before any value is used)."""
    try:
        manifest = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
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


_NOFOLLOW = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _open_dir(name: str | Path, dir_fd: int | None = None) -> int:
    return os.open(name, _NOFOLLOW | getattr(os, "O_DIRECTORY", 0), dir_fd=dir_fd)


def _open_file(dir_fd: int, name: str) -> int:
    """A descriptor of the regular file `name` (a relative path) under `dir_fd`, never
    through a symbolic link (OSError otherwise); a FIFO or device is refused, not opened
    for reading (O_NONBLOCK keeps a FIFO from blocking the open)."""
    *parents, leaf = PurePosixPath(name).parts
    fds = [dir_fd]
    try:
        for part in parents:
            fds.append(_open_dir(part, fds[-1]))
        fd = os.open(leaf, _NOFOLLOW | getattr(os, "O_NONBLOCK", 0), dir_fd=fds[-1])
    finally:
        for fd_ in fds[1:]:
            os.close(fd_)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{name} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def _walk(dir_fd: int, prefix: str = "") -> list[str] | str:
    """The regular files under `dir_fd` (names relative to it), or what is there that may
    not be: a symbolic link, a FIFO, a device, a socket."""
    with os.scandir(dir_fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    files: list[str] = []
    for entry in entries:
        name = prefix + entry.name
        if entry.is_symlink():
            return f"{name} is a symbolic link"
        if entry.is_dir(follow_symlinks=False):
            sub_fd = _open_dir(entry.name, dir_fd)
            try:
                sub = _walk(sub_fd, name + "/")
            finally:
                os.close(sub_fd)
            if isinstance(sub, str):
                return sub
            files += sub
        elif entry.is_file(follow_symlinks=False):
            files.append(name)
        else:
            return f"{name} is not a regular file"
    return files


def verify(directory: Path, *, state_hash: str | None = None, trust: bool = False
           ) -> str | None:
    """None when the checkpoint is authentic (or `trust`), of this workload (when
    `state_hash` is given), complete and intact; else what is wrong with it. Only the
    manifest (JSON) and the files' bytes are read: nothing is unpickled here."""
    return _check(Path(directory), state_hash=state_hash, trust=trust, into=None)


def stage(directory: Path, into: Path, *, state_hash: str | None = None, trust: bool = False
          ) -> str | None:
    """`verify`, copying every file into the empty private directory `into` from the very
    bytes that were hashed: a framework that loads `into` loads what was verified."""
    return _check(Path(directory), state_hash=state_hash, trust=trust, into=into)


def _check(directory: Path, *, state_hash: str | None, trust: bool, into: Path | None
           ) -> str | None:
    try:
        dir_fd = _open_dir(directory)
    except OSError as exc:
        if directory.is_symlink():
            return "the checkpoint directory is a symbolic link"
        return f"cannot open the checkpoint directory ({exc.strerror})"
    try:
        return _check_open(dir_fd, directory.name, state_hash=state_hash, trust=trust,
                           into=into)
    except OSError as exc:
        return f"cannot read the checkpoint ({exc.strerror or exc})"
    finally:
        os.close(dir_fd)


def _check_open(dir_fd: int, name: str, *, state_hash: str | None, trust: bool,
                into: Path | None) -> str | None:
    try:
        fd = _open_file(dir_fd, MANIFEST)
    except FileNotFoundError:
        return "no manifest (the save did not finish)"
    except OSError:
        return "the manifest is not a regular file"
    with os.fdopen(fd, "rb") as f:
        blob = f.read(MAX_MANIFEST_BYTES + 1)
    if len(blob) > MAX_MANIFEST_BYTES:
        return f"the manifest is larger than {MAX_MANIFEST_BYTES} bytes"
    manifest = _read_manifest(blob)
    if isinstance(manifest, str):
        return manifest
    if not trust:
        if not signed(checkpoint_key(), manifest, field="hmac"):
            return ("not signed with this user's checkpoint key (written by another user or "
                    "sextant version, or edited since); pass --trust-checkpoint to load it "
                    "anyway")
    match = _STEP_DIR.fullmatch(name)
    if match is None or manifest.get("step") != int(match.group(1)):
        return f"manifest is of step {manifest.get('step')!r}, not of {name}"
    if state_hash is not None and manifest.get("state_hash") != state_hash:
        return (f"{FOREIGN_WORKLOAD} (model, data, optimizer or seed differ: state hash "
                f"{manifest.get('state_hash')!r}, this workload's {state_hash!r})")
    listed: dict[str, Any] = manifest["files"]
    found = _walk(dir_fd)
    if isinstance(found, str):
        return found
    present = set(found) - {MANIFEST}
    missing = sorted(set(listed) - present)
    if missing:
        return f"missing file {missing[0]}"
    unlisted = sorted(present - set(listed))
    if unlisted:
        return f"file {unlisted[0]} is not in the manifest (added since the save)"
    for file_name, entry in sorted(listed.items()):
        problem = _check_file(dir_fd, file_name, entry, into)
        if problem is not None:
            return problem
    return None


def _check_file(dir_fd: int, name: str, entry: dict[str, Any], into: Path | None
                ) -> str | None:
    """Hash one file through one descriptor (and copy those bytes under `into`)."""
    try:
        fd = _open_file(dir_fd, name)
    except OSError:
        return f"{name} is not a regular file (or was replaced by a link)"
    digest = hashlib.sha256()
    size = 0
    with os.fdopen(fd, "rb") as src:
        if os.fstat(src.fileno()).st_size != entry["bytes"]:
            return (f"{name} is {os.fstat(src.fileno()).st_size} bytes, manifest says "
                    f"{entry['bytes']} (truncated?)")
        out = None
        if into is not None:
            target = into / name
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            out = open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW,
                               0o600), "wb")
        try:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                digest.update(chunk)
                size += len(chunk)
                if size > entry["bytes"]:
                    break
                if out is not None:
                    out.write(chunk)
        finally:
            if out is not None:
                out.close()
    if size != entry["bytes"]:
        return f"{name} changed size while it was read (manifest says {entry['bytes']} bytes)"
    if digest.hexdigest() != entry["sha256"]:
        return f"{name} does not match its checksum (corrupted)"
    return None


def candidates(root: str | Path) -> list[Path]:
    """The sealed-looking checkpoint directories under `root`, newest first (a symbolic
    link among them is a candidate, to be refused by name)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir()
             if (p.is_dir() or p.is_symlink()) and _STEP_DIR.fullmatch(p.name)]
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
    return resume_plan(workload, strategy)[0]


def resume_plan(workload: Any, strategy: Any) -> tuple[list[str], int | None]:
    """`preflight`'s warnings and the step every rank must resume from (0: no checkpoint
    yet; None without --resume)."""
    if not (strategy.resume or strategy.checkpoint_every):
        return [], None
    checkpoint_key()
    if not strategy.resume:
        return [], None
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
        return [f"--resume: no checkpoint in {root} yet: training starts at step 0"], 0
    return refusals, step


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
    """(step, private verified copy) to resume from, or (0, None): the step the launching
    process accepted (`ctx.resume_step`; CheckpointChanged if this rank refuses it), else the
    newest usable checkpoint. Every refused checkpoint and the outcome are appended to
    `notes` and emitted as events. The caller deletes the copy once it is loaded."""
    root = _checkpoint_dir(ctx)
    state_hash, trust = ctx.workload.state_hash(), ctx.strategy.trust_checkpoint
    if ctx.resume_step is not None:
        for newer in candidates(root):  # why the launching process passed them over
            if int(newer.name[5:]) > ctx.resume_step:
                problem = verify(newer, state_hash=state_hash, trust=trust)
                if problem is not None:
                    notes.append(f"checkpoint {newer.name} refused: {problem}")
        if ctx.resume_step == 0:
            notes.append("no checkpoint when the run started: started from step 0")
            return 0, None
        order = [step_dir(root, ctx.resume_step)]
    else:
        order = candidates(root)
    for directory in order:
        into = Path(tempfile.mkdtemp(prefix=f"rank{ctx.rank}.checkpoint-", dir=ctx.run_dir))
        problem = stage(directory, into, state_hash=state_hash, trust=trust)
        if problem is None:
            step = int(directory.name[5:])
            notes.append(f"resumed from {directory.name}")
            ctx.emit("resumed", step=step, checkpoint=str(directory))
            return step, into
        shutil.rmtree(into, ignore_errors=True)
        if ctx.resume_step is not None:
            raise CheckpointChanged(
                f"rank {ctx.rank} refused checkpoint {directory}, which the launching process "
                f"accepted: {problem}; the run stops instead of training from another state "
                f"(was it changed since, or does this host hold another copy?)")
        refusal = f"checkpoint {directory.name} refused: {problem}"
        notes.append(refusal)
        ctx.emit("warning", message=refusal)
    notes.append("no valid checkpoint found: started from step 0")
    return 0, None
