"""metrics.jsonl (merge, schema, checker), TensorBoard files, the live view's figures."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from sextant.commands.common import RunProgress
from sextant.monitor import (
    METRICS_SCHEMA,
    MetricsSchemaError,
    read_metrics,
    validate_record,
    write_metrics,
)
from sextant.monitor.live import LiveStats
from sextant.results.record import RunRecord
from sextant.monitor.procs import worker_rss
from sextant.monitor.tensorboard import crc32c, read_event_file, write_tensorboard
from tests.helpers import run_cli


def step(rank, s, t, loss=None, step_time=0.1, data=0.001, rows=8, **extra):
    return {"schema": 1, "event": "step", "rank": rank, "time": t, "step": s, "loss": loss,
            "step_time_s": step_time, "data_time_s": data, "rows": rows, **extra}


def fake_run(tmp_path: Path, steps: int = 4, torn: bool = False) -> Path:
    run = tmp_path / "20260101-000000-gpt-tiny-torch-dp-x2-000001"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps({
        "workload": {"name": "gpt-tiny", "global_batch": 16, "steps": steps,
                     "model": {"kind": "gpt", "seq_len": 64}},
        "strategy": {"framework": "torch", "mode": "eager", "parallel": "dp", "workers": 2},
        "roles": ["worker", "worker"]}))
    for r in range(2):
        lines = [{"schema": 1, "event": "start", "rank": r, "time": 100.0, "steps": steps,
                  "start_step": 0}]
        lines += [step(r, s, 100.0 + s * 0.1 + r * 0.01,
                       loss=5.0 - s * 0.1 + r * 0.02 if s % 2 == 0 else None)
                  for s in range(1, steps + 1)]
        lines += [{"schema": 1, "event": "done", "rank": r, "time": 101.0}]
        text = "".join(json.dumps(x) + "\n" for x in lines)
        if torn and r == 1:
            text += '{"schema": 1, "event": "st'  # killed mid-write
        (run / f"rank{r}.events.jsonl").write_text(text)
    return run


def test_write_metrics_merges_ranks_in_time_order(tmp_path: Path) -> None:
    run = fake_run(tmp_path, torn=True)
    path = write_metrics(run)
    records = list(read_metrics(path))
    head = records[0]
    assert head["event"] == "run" and head["world"] == 2 and head["label"] == "torch dp x2"
    assert head["tokens_per_sample"] == 64 and head["schema"] == METRICS_SCHEMA
    steps = [r for r in records if r["event"] == "step"]
    assert len(steps) == 8 and [r["rank"] for r in steps[:2]] == [0, 1]
    assert all(r["compute_time_s"] == pytest.approx(0.099) for r in steps)
    times = [r["time"] for r in records[1:]]
    assert times == sorted(times)


@pytest.mark.parametrize(("record", "fragment"), [
    ({"schema": 2, "event": "step"}, "schema must be 1"),
    ({"schema": 1, "event": "step", "rank": 0, "time": 1.0}, "missing field 'step'"),
    ({"schema": 1, "event": "step", "rank": -1, "time": 1.0}, "'rank' must be"),
    ({**step(0, 1, 1.0), "loss": "low"}, "'loss' has type str"),
    ({**step(0, 0, 1.0)}, "'step' must be >= 1"),
    ({**step(0, 1, 1.0), "step_time_s": -1.0}, "'step_time_s' must be"),
    ({"schema": 1, "event": "checkpoint", "rank": 0, "time": 1.0, "step": 2}, "'seconds'"),
])
def test_validate_record_rejects(record, fragment) -> None:
    with pytest.raises(MetricsSchemaError, match=fragment.replace("(", r"\(")):
        validate_record(record)


def test_validate_record_accepts_unknown_kinds() -> None:
    validate_record({"schema": 1, "event": "future-thing", "rank": 0, "time": 1.0, "x": 1})


def test_tensorboard_scalars(tmp_path: Path) -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    run = fake_run(tmp_path)
    from sextant.monitor.metrics import merged_records

    path = write_tensorboard(merged_records(run), tmp_path / "tb")
    assert path.parent.name == run.name and "tfevents" in path.name
    events = read_event_file(path)  # CRCs verified
    assert events[0] == (0, {})
    by_step = dict(events[1:])
    assert by_step[2]["loss"] == pytest.approx((4.8 + 4.82) / 2)
    assert "loss" not in by_step[1]
    assert by_step[1]["tokens_per_s"] == pytest.approx(16 * 64 / 0.1, rel=1e-5)
    assert set(by_step[3]) >= {"step_time_ms/rank0", "data_wait_ms/rank1"}


def test_live_stats() -> None:
    stats = LiveStats(tokens_per_step=1024, sample_processes=False)
    for r in range(2):
        stats.update({"event": "start", "rank": r})
    stats.update(step(0, 1, 1.0, loss=4.0, step_time=0.1, rss_bytes=300 * 2**20))
    assert stats.step == 0  # rank 1 has not finished step 1
    stats.update(step(1, 1, 1.0, loss=5.0, step_time=0.2, rss_bytes=310 * 2**20))
    assert stats.step == 1 and stats.loss == 4.5 and stats.step_time_s == 0.2
    assert stats.throughput == (1024 / 0.2, "tok/s")
    stats.exposed_comm = 0.12
    assert stats.text() == "loss 4.5000  200.0 ms/step  5.1k tok/s  comm 12%  RSS 300|310 MB"


def test_run_progress_off_terminal_prints_one_line_and_writes_files(tmp_path: Path) -> None:
    run = fake_run(tmp_path)
    buf = io.StringIO()
    out = Console(file=buf, width=200, force_terminal=False)
    record = RunRecord.from_dict({
        "id": 7, "run_dir": str(run), "strategy": {"framework": "torch"},
        "ranks": [{"rank": r, "peak_rss_bytes": 300 * 2**20} for r in range(2)],
        "metrics": {"step_time_median_s": 0.1, "tokens_per_s": 10240.0, "final_loss": 4.6,
                    "exposed_comm_share": 0.2}})
    with RunProgress(out, tensorboard=tmp_path / "tb") as progress:
        progress.start("torch dp x2", 4)
        for r in range(2):
            for line in (run / f"rank{r}.events.jsonl").read_text().splitlines():
                progress.on_event(json.loads(line))
        progress.finish("torch dp x2", record)
    assert buf.getvalue().strip() == ("torch dp x2: done, 100.0 ms/step median, 10.2k tokens/s, "
                                      "final loss 4.6000, exposed comm 20%, peak RSS 300|300 MB")
    assert (run / "metrics.jsonl").exists()
    assert len(list((tmp_path / "tb" / "7-torch-dp-x2").glob("*tfevents*"))) == 1


def test_worker_rss_reads_the_children() -> None:
    assert worker_rss() == {}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)",
                              "sextant.launch.worker"], env={**os.environ, "RANK": "3"})
    try:
        deadline = time.monotonic() + 5
        while not (rss := worker_rss()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(rss) == [3] and rss[3] > 2**20
    finally:
        child.kill()
        child.wait()


def test_cli_bad_input_is_one_line() -> None:
    for args, fragment in ((["check", "--only", "mvp,nope"], "unknown check 'nope' in --only"),
                           (["check", "--max-bytes", "12"], "--max-bytes must be at least 1K"),
                           (["check", "--workers", "0"], "--workers must be >= 1"),
                           (["check", "--workload", "missing.toml"], "missing.toml")):
        proc = run_cli(*args, timeout=120)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and fragment in lines[0], proc.stderr
