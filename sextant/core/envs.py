"""Per-framework Python environments: frameworks whose pins cannot share an environment (or a
process) with the others run their workers under their own interpreter.

PaddlePaddle and MindSpore cannot live beside TensorFlow, JAX or each other (an import of one
after the other crashes the process or fails to load a symbol; MindSpore's distributed
launcher wants numpy < 2 where JAX wants numpy >= 2). A backend that declares `ENVIRONMENT`
trains in that environment: `sextant env create NAME` makes a virtual environment with the
framework's pins, numpy, rich and sextant itself, checks that the framework imports there, and
writes a record (`sextant-env.json`) last, so an environment without a record is one whose
creation did not finish. `python_for(framework)` is the interpreter the launcher starts that
framework's workers with; the parent process still imports no framework.

Environments live in `$SEXTANT_ENVS`, else `$XDG_DATA_HOME/sextant/envs` (by default
`~/.local/share/sextant/envs`), one directory each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from sextant import __version__
from sextant.core.errors import UserError
from sextant.core.fsutil import atomic_write_json

RECORD = "sextant-env.json"
CREATE_TIMEOUT_S = 1800.0
"""pip's budget for one environment (MindSpore's wheels are ~2.8 GB installed)."""
PROBE_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class EnvSpec:
    name: str
    packages: tuple[str, ...]
    """pip requirements, pinned to what is known to work on a CPU machine (with numpy's own
    range where the framework needs one); `sextant env create --package` replaces them (a GPU
    build, another version)."""
    probe: str
    """Import name that must import in the environment."""
    why: str
    """Why the framework needs an environment of its own."""


SPECS: dict[str, EnvSpec] = {
    "paddle": EnvSpec(
        name="paddle", packages=("paddlepaddle==3.3.1",), probe="paddle",
        why="PaddlePaddle crashes a process that imported TensorFlow first and breaks "
            "MindSpore's symbols"),
    "mindspore": EnvSpec(
        name="mindspore", packages=("mindspore==2.10.0", "numpy<2"), probe="mindspore",
        why="MindSpore's distributed runtime needs numpy < 2, which JAX does not accept"),
}


@dataclass(frozen=True, slots=True)
class EnvRecord:
    """What `sextant env create` made (the record file of an environment)."""

    name: str
    python: str
    packages: tuple[str, ...]
    """The requirements it was created with."""
    versions: dict[str, str]
    """Installed versions of the framework, numpy and sextant, read in the environment."""
    sextant_source: str
    """Where the environment imports sextant from ('editable: PATH' follows that tree)."""
    created: float
    create_s: float


def root() -> Path:
    """The directory environments live in."""
    if os.environ.get("SEXTANT_ENVS"):
        return Path(os.environ["SEXTANT_ENVS"]).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "sextant" / "envs"


def spec(name: str) -> EnvSpec:
    if name not in SPECS:
        raise UserError(f"no environment named {name!r}; sextant makes: {', '.join(SPECS)}")
    return SPECS[name]


def location(name: str) -> Path:
    return root() / name


def load(name: str) -> EnvRecord | None:
    """The environment's record; None when it was never created or its creation did not
    finish. A record that cannot be read is a one-line UserError naming the fix."""
    path = location(name) / RECORD
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        return EnvRecord(**{**data, "packages": tuple(data["packages"])})
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise UserError(f"environment {name!r}: cannot read {path} ({exc}); re-create it "
                        f"with `sextant env create {name} --force`") from None


def _source_tree() -> Path | None:
    """The source tree this sextant runs from, when it is one (an editable install or a
    checkout on sys.path), else None (an installed wheel)."""
    top = Path(__file__).resolve().parents[2]
    return top if (top / "pyproject.toml").is_file() and (top / "sextant").is_dir() else None


def _run(cmd: list[str], what: str, timeout: float, *, capture: bool = True) -> str:
    """Run `cmd`; its standard output is returned (capture) or shown (not captured); a
    failure is a one-line UserError ending with the command's last line of errors."""
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE if capture else None,
                              stderr=subprocess.PIPE, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise UserError(f"{what} did not finish in {timeout:.0f} s") from None
    except OSError as exc:
        raise UserError(f"{what} could not start: {exc}") from None
    if proc.returncode != 0:
        tail = ((proc.stderr or "") + (proc.stdout or "")).strip().splitlines()[-1:]
        raise UserError(f"{what} failed (exit code {proc.returncode})"
                        + (f": {tail[0]}" if tail else ""))
    return proc.stdout or ""


_PROBE = """
import importlib, importlib.metadata as md, json, sys
import {probe}
import sextant
def version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "?"
print(json.dumps({{"framework": version({dist!r}), "numpy": version("numpy"),
                  "sextant": sextant.__version__, "sextant_file": sextant.__file__}}))
"""


def create(name: str, *, python: str | None = None, packages: tuple[str, ...] = (),
           force: bool = False, quiet: bool = False,
           say: Callable[[str], None] = print) -> EnvRecord:
    """Make (or finish, or with `force` re-make) the environment `name`; return its record.

    An existing environment directory without a record is reused (pip installs only what is
    missing); `force` removes it first. The record is written last and atomically."""
    env = spec(name)
    where = location(name)
    packages = packages or env.packages
    if force and where.exists():
        shutil.rmtree(where)
    (where / RECORD).unlink(missing_ok=True)  # no record while the environment changes
    start = time.perf_counter()
    base = python or sys.executable
    say(f"{name}: creating a virtual environment in {where} (with {base})")
    _run([base, "-m", "venv", str(where)], f"{name}: `{base} -m venv`", 300)
    py = str(where / "bin" / "python")
    source = _source_tree()
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check",
           *(["-q"] if quiet else []), *packages, "numpy>=1.26", "rich>=13"]
    if source is not None:
        pip += ["-e", str(source)]
    say(f"{name}: pip install {' '.join(packages)} (this can take minutes)")
    _run(pip, f"{name}: pip install", CREATE_TIMEOUT_S, capture=quiet)
    if source is None:  # an installed sextant: copy this very package in (no index has it)
        purelib = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                       f"{name}: the environment's site-packages", PROBE_TIMEOUT_S).strip()
        target = Path(purelib) / "sextant"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(Path(__file__).resolve().parents[1], target,
                        ignore=shutil.ignore_patterns("__pycache__"))
    dist = packages[0].split("==")[0].split(">")[0].split("<")[0].split("[")[0].strip()
    out = _run([py, "-c", _PROBE.format(probe=env.probe, dist=dist)],
               f"{name}: importing {env.probe} in the new environment", PROBE_TIMEOUT_S)
    found = json.loads(out.strip().splitlines()[-1])
    record = EnvRecord(
        name=name, python=py, packages=tuple(packages),
        versions={dist: found["framework"], "numpy": found["numpy"],
                  "sextant": found["sextant"]},
        sextant_source=(f"editable: {source}" if source is not None
                        else f"copy of sextant {__version__}"),
        created=time.time(), create_s=round(time.perf_counter() - start, 1))
    atomic_write_json(where / RECORD, asdict(record))
    say(f"{name}: ready in {record.create_s:.0f} s ({dist} {found['framework']}, "
        f"numpy {found['numpy']})")
    return record


def remove(name: str) -> bool:
    """Delete the environment `name`; False when there was none."""
    spec(name)
    where = location(name)
    if not where.exists():
        return False
    shutil.rmtree(where)
    return True


def python_for(framework: str, name: str | None) -> str:
    """The interpreter that runs `framework`'s workers: this one (`name` None), or that of
    environment `name` (the backend says which: sextant.backends.base.python_for). A missing,
    unfinished, broken or stale environment is a one-line UserError naming the command that
    fixes it."""
    if name is None:
        return sys.executable
    record = load(name)
    if record is None:
        state = "was not finished" if location(name).exists() else "does not exist"
        raise UserError(f"{framework} runs in an environment of its own, which {state} in "
                        f"{root()}: run `sextant env create {name}` (SEXTANT_ENVS moves it)")
    if not os.access(record.python, os.X_OK):
        raise UserError(f"{framework}'s environment is broken ({record.python} is not an "
                        f"interpreter): run `sextant env create {name} --force`")
    if not record.sextant_source.startswith("editable: ") and \
            record.versions.get("sextant") != __version__:
        raise UserError(f"{framework}'s environment holds sextant "
                        f"{record.versions.get('sextant')}, this is {__version__}: run "
                        f"`sextant env create {name} --force`")
    return record.python
