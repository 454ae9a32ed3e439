"""Per-framework environments (sextant.core.envs, `sextant env`): the states an environment can be
in and the one-line errors that name the fix. Real environments are made by the backends'
own tests (tests/test_paddle.py, tests/test_mindspore.py) through ensure_environment."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sextant.core import envs
from sextant.backends.base import get_backend, python_for
from sextant.core.errors import UserError
from tests.helpers import run_cli


@pytest.fixture
def env_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SEXTANT_ENVS", str(tmp_path / "envs"))
    return tmp_path / "envs"


def test_frameworks_without_an_environment_use_this_interpreter() -> None:
    assert get_backend("torch").ENVIRONMENT is None
    assert python_for("torch") == sys.executable


def test_root_follows_sextant_envs_then_xdg(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    monkeypatch.setenv("SEXTANT_ENVS", str(tmp_path / "a"))
    assert envs.root() == tmp_path / "a"
    monkeypatch.delenv("SEXTANT_ENVS")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert envs.root() == tmp_path / "xdg" / "sextant" / "envs"


def test_states_missing_unfinished_unreadable(env_root: Path) -> None:
    assert envs.load("paddle") is None                       # never created
    (env_root / "paddle" / "bin").mkdir(parents=True)        # creation did not finish
    assert envs.load("paddle") is None
    (env_root / "paddle" / envs.RECORD).write_text("{not json")
    with pytest.raises(UserError, match=r"sextant env create paddle --force"):
        envs.load("paddle")


def test_a_record_round_trips(env_root: Path) -> None:
    where = env_root / "mindspore"
    where.mkdir(parents=True)
    record = {"name": "mindspore", "python": sys.executable, "packages": ["mindspore==2.10.0"],
              "versions": {"mindspore": "2.10.0"}, "sextant_source": "editable: /src",
              "created": 0.0, "create_s": 1.0}
    (where / envs.RECORD).write_text(json.dumps(record))
    loaded = envs.load("mindspore")
    assert loaded is not None and loaded.packages == ("mindspore==2.10.0",)


def test_unknown_environment_is_one_line(env_root: Path) -> None:
    proc = run_cli("env", "create", "nosuch")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("sextant: error: no environment named 'nosuch'; "
                                   "sextant makes: paddle, mindspore")
    assert not env_root.exists()  # nothing made


def test_env_list_says_what_to_run(env_root: Path) -> None:
    (env_root / "mindspore").mkdir(parents=True)
    proc = run_cli("env", "list", env={"COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert "missing: sextant env create paddle" in proc.stdout
    assert "unfinished: sextant env create mindspore" in proc.stdout


def test_remove(env_root: Path) -> None:
    (env_root / "paddle" / "bin").mkdir(parents=True)
    assert run_cli("env", "remove", "paddle").returncode == 0
    assert not (env_root / "paddle").exists()
    proc = run_cli("env", "remove", "paddle")
    assert proc.returncode == 0 and "no environment to remove" in proc.stdout


def test_a_missing_environment_names_the_command(env_root: Path) -> None:
    proc = run_cli("run", "--framework", "paddle", "--db", str(env_root.parent / "r.db"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"sextant: error: paddle runs in an environment of its own, which does not exist in "
        f"{env_root}: run `sextant env create paddle` (SEXTANT_ENVS moves it)")


@pytest.mark.slow
def test_a_broken_environment_names_the_fix(env_root: Path, tmp_path: Path) -> None:
    """An environment whose interpreter lacks its framework (here: this one, which has no
    Paddle) fails in the worker, and the error's last line is the command that repairs it."""
    from sextant.core.errors import RunFailed
    from sextant.runner import execute
    from sextant.strategy import Strategy
    from tests.helpers import short

    where = env_root / "paddle"
    where.mkdir(parents=True)
    record = {"name": "paddle", "python": sys.executable, "packages": ["paddlepaddle==3.3.1"],
              "versions": {}, "sextant_source": "editable: /src", "created": 0.0,
              "create_s": 0.0}
    (where / envs.RECORD).write_text(json.dumps(record))
    with pytest.raises(RunFailed, match=r"the paddle environment is broken; run "
                                        r"`sextant env create paddle --force`"):
        execute(short("gpt-tiny", 2), Strategy(framework="paddle"), runs_dir=tmp_path)
