"""Faults and hostile inputs (issue 19): what happens, and what is kept.

docs/reliability.md quotes these tests' outcomes. Training tests are real torch runs of a
6-step digits MLP (about 3 s each); the rest use real files and real SQLite. The faults owned
by the launcher (worker SIGKILL, parent signals, listeners) are tested in tests/launch.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sextant import checkpoint as ckpt
from sextant.core.errors import UserError
from sextant.results.record import RunRecord
from sextant.results.store import ResultsStore
from sextant.runner import RECORD_FILE, execute, keep
from sextant.strategy import Strategy
from tests.helpers import needs_torch, run_cli, short
from tests.test_cli import assert_one_line_error

STEPS = 6
WARMUP = 2
TIMEOUT = 300  # seconds for every subprocess


def workload_toml(name: str = "digits-short", **changes: object) -> str:
    """The digits MLP of `short("digits-mlp", STEPS, warmup_steps=WARMUP, nosync_steps=0)`,
    as a TOML file (the CLI needs a file)."""
    values = {"seed": 0, "lr": 3e-3, "weight_decay": 0.01, **changes}
    return f"""
name = {json.dumps(name)}
seed = {values['seed']}
steps = {STEPS}
global_batch = 64
[model]
family = "mlp"
hidden = [128, 128]
[data]
dataset = "digits"
[optimizer]
lr = {values['lr']}
beta2 = 0.999
weight_decay = {values['weight_decay']}
warmup_steps = 5
[measure]
warmup_steps = {WARMUP}
nosync_steps = 0
log_every = 2
"""


def write_workload(tmp_path: Path, name: str = "digits-short", **changes: object) -> Path:
    path = tmp_path / "w.toml"
    path.write_text(workload_toml(name, **changes))
    return path


def torch_single(**fields: object) -> Strategy:
    return Strategy(framework="torch", mode="eager", **fields)  # type: ignore[arg-type]


# --- checkpoints: a real torch checkpoint directory, saved after every step -----------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """step-00000001 ... step-00000006 of one real torch run (checkpoint every step)."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("saved")
    w = short("digits-mlp", STEPS, warmup_steps=WARMUP, nosync_steps=0)
    assert w.state_hash() == _file_workload(root).state_hash()
    execute(w, torch_single(checkpoint_every=1, checkpoint_dir=str(root / "ckpt")),
            runs_dir=root / "runs", timeout_s=TIMEOUT)
    return root / "ckpt"


def _file_workload(tmp: Path):  # the TOML twin of the fixture's workload
    from sextant.workloads.spec import load_workload

    return load_workload(write_workload(tmp))


def copy_of(saved: Path, tmp_path: Path) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(saved, target)
    return target


def resume_cli(tmp_path: Path, directory: Path, workload: Path, *extra: str):
    return run_cli("run", "--workload", str(workload), "--checkpoint-dir", str(directory),
                   "--resume", "--db", str(tmp_path / "x.db"), *extra, timeout=TIMEOUT)


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def biggest_file(directory: Path) -> Path:
    return max((p for p in directory.rglob("*") if p.is_file() and p.name != ckpt.MANIFEST),
               key=lambda p: p.stat().st_size)


@needs_torch
def test_crafted_checkpoint_does_not_run_code(tmp_path: Path, saved: Path) -> None:
    """Item 2: a directory whose `.metadata` is a malicious pickle, with a manifest whose
    checksums the attacker recomputed, is refused before torch unpickles anything."""
    marker = tmp_path / "pwned"
    directory = copy_of(saved, tmp_path)
    for step in range(1, STEPS):
        shutil.rmtree(ckpt.step_dir(directory, step))
    victim = ckpt.step_dir(directory, STEPS)

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (victim / ".metadata").write_bytes(pickle.dumps(Payload()))
    manifest = json.loads((victim / ckpt.MANIFEST).read_text())
    manifest["files"][".metadata"] = {"sha256": ckpt._sha256(victim / ".metadata"),
                                      "bytes": (victim / ".metadata").stat().st_size}
    (victim / ckpt.MANIFEST).write_text(json.dumps(manifest))

    proc = resume_cli(tmp_path, directory, write_workload(tmp_path))
    assert_one_line_error(proc, "not signed with this user's checkpoint key")
    assert "--trust-checkpoint" in proc.stderr
    assert not marker.exists()


@needs_torch
def test_resume_at_and_near_the_end_is_stored(tmp_path: Path, saved: Path) -> None:
    """Item 3 (steps left <= measure.warmup_steps), item 10 (a refused checkpoint is said on
    stderr, not only in the database), items 7 and 9 (a workload name with rich markup and
    path characters, 300 long)."""
    directory = copy_of(saved, tmp_path)
    name = "../../probe[/bold]x" + "y" * 300
    workload = write_workload(tmp_path, name=name)
    flip_a_byte(biggest_file(ckpt.step_dir(directory, STEPS)))

    proc = resume_cli(tmp_path, directory, workload)
    assert proc.returncode == 0, proc.stderr
    assert ("sextant: warning: checkpoint step-00000006 refused: "
            in proc.stderr) and "corrupted" in proc.stderr
    assert "stored as run 1" in proc.stdout

    shutil.rmtree(ckpt.step_dir(directory, STEPS))  # the corrupt one: now a good step 6
    shutil.copytree(ckpt.step_dir(saved, STEPS), ckpt.step_dir(directory, STEPS))
    proc = resume_cli(tmp_path, directory, workload)
    assert proc.returncode == 0, proc.stderr

    with ResultsStore(tmp_path / "x.db") as store:
        near, at_end = store.runs()
    assert near.metrics.resumed_from_step == STEPS - 1
    assert near.metrics.steps_timed == 0 and near.metrics.step_time_median_s is None
    assert len(near.losses) == 1 and near.metrics.final_loss is not None
    assert at_end.metrics.resumed_from_step == STEPS and at_end.losses == ()
    runs = tmp_path / "runs"
    for run in (near, at_end):
        run_dir = Path(run.run_dir)
        assert run_dir.parent == runs and run_dir.is_dir() and len(run_dir.name) < 120
    listing = run_cli("runs", "list", "--db", str(tmp_path / "x.db"), timeout=TIMEOUT)
    assert listing.returncode == 0, listing.stderr
    assert "probe[/bold]x" in listing.stdout


@needs_torch
def test_resume_refusals_are_one_line(tmp_path: Path, saved: Path) -> None:
    """Item 4 (another workload's checkpoint) and item 10 (a misspelled directory)."""
    directory = copy_of(saved, tmp_path)
    other = write_workload(tmp_path, seed=1, lr=0.01)
    assert_one_line_error(resume_cli(tmp_path, directory, other),
                          "written for another workload")
    missing = tmp_path / "chekpoints"
    assert_one_line_error(resume_cli(tmp_path, missing, write_workload(tmp_path)),
                          f"checkpoint directory {missing} does not exist")
    assert not (tmp_path / "runs").exists()  # nothing was launched


def test_resume_before_the_first_save_starts_at_zero_with_a_warning(tmp_path: Path) -> None:
    """A job killed before its first checkpoint, restarted with --resume (a requeue)."""
    (tmp_path / "step-00000002.partial").mkdir()
    strategy = torch_single(checkpoint_dir=str(tmp_path), resume=True)
    assert ckpt.preflight(short("digits-mlp", STEPS), strategy) == [
        f"--resume: no checkpoint in {tmp_path} yet: training starts at step 0"]


def sealed(root: Path, step: int, files: dict[str, bytes]) -> Path:
    partial = ckpt.partial_dir(root, step)
    partial.mkdir(parents=True)
    for name, data in files.items():
        (partial / name).write_bytes(data)
    return ckpt.seal(root, step, {"state_hash": "s"})


def test_tampering_is_refused_unless_trusted(tmp_path: Path) -> None:
    """Item 2: signed manifests catch edits an attacker re-checksums, and added files."""
    d = sealed(tmp_path, 3, {"a.bin": b"weights", "b.bin": b"moments"})
    assert ckpt.verify(d, state_hash="s") is None
    (d / "a.bin").write_bytes(b"evil")
    manifest = json.loads((d / ckpt.MANIFEST).read_text())
    manifest["files"]["a.bin"] = {"sha256": ckpt._sha256(d / "a.bin"), "bytes": 4}
    (d / ckpt.MANIFEST).write_text(json.dumps(manifest))
    assert "not signed with this user's checkpoint key" in ckpt.verify(d)
    assert ckpt.verify(d, trust=True) is None  # intact, if you choose to trust its author
    e = sealed(tmp_path, 4, {"a.bin": b"weights"})
    (e / "extra.pkl").write_bytes(b"x")
    assert "extra.pkl is not in the manifest" in ckpt.verify(e)


def test_malformed_manifest_falls_back_to_the_previous(tmp_path: Path) -> None:
    """Item 12: `"files"` as a list, or a name leaving the directory, is refused and the
    previous checkpoint is used (before: AttributeError in the worker)."""
    sealed(tmp_path, 2, {"a.bin": b"2"})
    for step, files in ((3, []), (4, {"../../x": {"sha256": "0" * 64, "bytes": 1}})):
        d = sealed(tmp_path, step, {"a.bin": b"3"})
        manifest = json.loads((d / ckpt.MANIFEST).read_text())
        (d / ckpt.MANIFEST).write_text(json.dumps({**manifest, "files": files}))
    step, directory, refusals = ckpt.latest_valid(tmp_path, state_hash="s")
    assert step == 2
    assert "malformed manifest (file name '../../x' leaves the checkpoint)" in refusals[0]
    assert "malformed manifest ('files' is not a table of files)" in refusals[1]


def test_checkpoint_key_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sextant.core import keys

    monkeypatch.setenv("SEXTANT_CONFIG_DIR", str(tmp_path / "cfg"))
    assert len(keys.checkpoint_key()) == 32
    path = tmp_path / "cfg" / keys.CHECKPOINT_KEY
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    keys._key_at.cache_clear()
    path.chmod(0o644)
    with pytest.raises(UserError, match="is readable by others"):
        keys.checkpoint_key()
    keys._key_at.cache_clear()


# --- divergence -----------------------------------------------------------------------------


@needs_torch
def test_diverged_run_stops_named_and_is_stored(tmp_path: Path) -> None:
    """Item 5: lr = 1e300 makes the loss NaN; the run stops with step, rank and value, is
    stored as 'diverged', and the exports stay valid JSON."""
    proc = run_cli("run", "--workload", str(write_workload(tmp_path, lr=1e300)),
                   "--db", str(tmp_path / "x.db"), timeout=TIMEOUT)
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "training diverged at step " in line and "on rank 0: " in line, line
    assert "nan" in line and "(status diverged)" in line
    with ResultsStore(tmp_path / "x.db") as store:
        (run,) = store.runs()
    assert run.status == "diverged" and run.metrics.diverged_at_step <= STEPS
    export = run_cli("runs", "export", "--format", "json", "--db", str(tmp_path / "x.db"),
                     timeout=TIMEOUT)
    json.loads(export.stdout, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))


def test_weight_decay_inf_is_refused(tmp_path: Path) -> None:
    proc = run_cli("run", "--workload", str(write_workload(tmp_path, weight_decay="inf")),
                   "--db", str(tmp_path / "x.db"), timeout=TIMEOUT)
    assert_one_line_error(proc, "optimizer.weight_decay must be a number >= 0. Received: inf")


def test_nan_loss_is_a_disagreement() -> None:
    from sextant.measure.stats import max_loss_diff
    from sextant.report.model import _parity

    nan = float("nan")
    assert max_loss_diff([1.0, nan], [1.0, 1.0]) == float("inf")
    assert max_loss_diff([nan, nan], [nan, nan]) == float("inf")
    assert max_loss_diff([1.0, None], [1.0, 2.0]) == float("inf")  # a diverged run's record
    ref = RunRecord.from_dict({"losses": [1.0, nan], "strategy": {"framework": "torch"}})
    same = RunRecord.from_dict({"losses": [1.0, nan], "strategy": {"framework": "jax"}})
    assert _parity([ref], ref)["ok"] is False
    assert _parity([ref, same], ref)["ok"] is False


# --- the results database -------------------------------------------------------------------


def finished_record(tmp_path: Path) -> RunRecord:
    """A finished run's record (figures constructed; workload and strategy real)."""
    from tests.report.runs import make_run

    workload = short("digits-mlp", STEPS)
    run = make_run().replace(id=None, workload=workload.to_dict(),
                             workload_hash=workload.content_hash(), strategy=torch_single(),
                             run_dir=str(tmp_path / "runs" / "r1"))
    Path(str(run.run_dir)).mkdir(parents=True)
    return run


def test_locked_database_keeps_the_run(tmp_path: Path) -> None:
    """Item 8: a store locked past the busy timeout when a run ends: the record is kept in
    the run directory, the message says how to add it, and `runs import` adds it."""
    db = tmp_path / "x.db"
    store = ResultsStore(db, busy_timeout_s=0.1)
    record = finished_record(tmp_path)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(UserError, match="locked by another process"):
            ResultsStore(db, busy_timeout_s=0.1)  # before: "not a sextant results database"
        with pytest.raises(UserError, match=r"the finished run was kept in .*record\.json"):
            keep(store, record)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        store.close()
    kept = Path(record.run_dir) / RECORD_FILE
    proc = run_cli("runs", "import", str(kept), "--db", str(db), timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    with ResultsStore(db) as reopened:
        assert [r.label for r in reopened.runs()] == [record.label]


def test_kill_during_the_results_write_keeps_the_store(tmp_path: Path) -> None:
    """A process SIGKILLed as it commits a run: the store opens, holds no half row, and takes
    the next run (SQLite's journal rolls the transaction back)."""
    db = tmp_path / "x.db"
    record = tmp_path / "record.json"
    record.write_text(json.dumps(finished_record(tmp_path).to_dict()))
    child = f"""
import json, os, signal
from sextant.results.record import RunRecord
from sextant.results.record import RunRecord
from sextant.results.store import ResultsStore
store = ResultsStore({str(db)!r})
store._conn.set_trace_callback(
    lambda sql: os.kill(os.getpid(), signal.SIGKILL) if sql.startswith("COMMIT") else None)
store.add(RunRecord.from_dict(json.load(open({str(record)!r}))))
"""
    proc = subprocess.run([sys.executable, "-c", child], timeout=TIMEOUT, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    with ResultsStore(db) as store:
        assert store.runs() == []
        assert store._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        store.add(RunRecord.from_dict(json.loads(record.read_text())))
        assert len(store.runs()) == 1


def test_nan_metrics_export_as_valid_json(tmp_path: Path) -> None:
    record = finished_record(tmp_path).with_metrics(exposed_comm_share=float("nan"),
                                                    data_wait_share=float("inf"))
    with ResultsStore(tmp_path / "x.db") as store:
        store.add(record)
    for fmt in ("json", "csv"):
        proc = run_cli("runs", "export", "--format", fmt, "--db", str(tmp_path / "x.db"),
                       timeout=TIMEOUT)
        assert proc.returncode == 0, proc.stderr
        if fmt == "json":
            json.loads(proc.stdout, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
        else:
            cells = {c for line in proc.stdout.splitlines() for c in line.split(",")}
            assert not cells & {"nan", "inf", "NaN", "Infinity"}


# --- small hostile inputs -------------------------------------------------------------------


@pytest.mark.parametrize(("args", "fragment"), [
    (["run", "--timeout", "0"], "argument --timeout: must be a number of seconds > 0"),
    (["run", "--timeout", "nan"], "argument --timeout: must be a number of seconds > 0"),
    (["runs", "export", "--out", "{tmp}"], "cannot write {tmp}: it is a directory"),
    (["runs", "export", "--out", "/proc/none/x.csv"], "cannot write /proc/none/x.csv"),
    (["run", "--workload", "{tmp}"], "workload file {tmp} is a directory, not a file"),
    (["run", "--trust-checkpoint"], "--trust-checkpoint applies to the checkpoints a --resume"),
    (["report", "--calibration", "{tmp}/latin1.json"],
     "--calibration {tmp}/latin1.json: not a UTF-8 text file"),
])
def test_bad_paths_and_values(tmp_path: Path, args: list[str], fragment: str) -> None:
    ResultsStore(tmp_path / "x.db").close()
    (tmp_path / "latin1.json").write_bytes(b'{"name": "\xe9"}')
    args = [a.format(tmp=tmp_path) for a in args] + ["--db", str(tmp_path / "x.db")]
    assert_one_line_error(run_cli(*args, timeout=TIMEOUT), fragment.format(tmp=tmp_path))


@pytest.mark.parametrize(("table", "changes", "fragment"), [
    ("model", {"seq_len": 500_000}, "model.seq_len must be at most 65536"),  # corpus: 466,273
    ("", {"steps": 10**12}, "steps must be at most 10000000"),
    ("", {"global_batch": 10**9}, "global_batch must be at most 1048576"),
    ("model", {"d_model": 2**20}, "model.d_model must be at most 65536"),
    ("model", {"n_layers": 10**6}, "model.n_layers must be at most 1024"),
])
def test_values_that_used_to_fail_inside_a_worker(table: str, changes: dict, fragment: str
                                                  ) -> None:
    from sextant.workloads.spec import workload_from_dict
    from sextant.sources import resolve_workload

    raw = resolve_workload("gpt-tiny").to_dict()
    (raw[table] if table else raw).update(changes)
    with pytest.raises(UserError, match=fragment):
        workload_from_dict(raw)


@pytest.mark.parametrize(("changes", "fragment"), [
    ({"input_dim": 32}, "model.input_dim must be 64 for the digits dataset"),
    ({"num_classes": 5}, "model.num_classes must be 10 for the digits dataset"),
])
def test_mlp_must_match_the_digits(changes: dict, fragment: str) -> None:
    from sextant.workloads.spec import workload_from_dict

    raw = short("digits-mlp", STEPS).to_dict()
    raw["model"].update(changes)
    with pytest.raises(UserError, match=fragment):
        workload_from_dict(raw)


def test_profile_price_that_overflows_is_refused() -> None:
    """A price of 1e308 made every cost infinite and the scores NaN."""
    import tomllib

    from sextant.advisor.profile import parse_profile

    raw = tomllib.loads((Path(__file__).parents[1] / "examples" / "profiles"
                         / "startup-nvidia-pytorch.toml").read_text())
    with pytest.raises(UserError, match="gpu_price_per_hour must be at most 1e\\+06"):
        parse_profile({**raw, "gpu_price_per_hour": 1e308})


def test_reproduce_command_names_the_workload_file() -> None:
    from sextant.claims import check_claims
    from tests.report.runs import make_run

    runs = [make_run().replace(workload_file="/home/me/my workload.toml"),
            make_run(mode="compiled").replace(workload_file="/home/me/my workload.toml")]
    commands = [c.command for c in check_claims(runs) if "compare" in c.command]
    assert commands and all("--workload '/home/me/my workload.toml'" in c for c in commands)
