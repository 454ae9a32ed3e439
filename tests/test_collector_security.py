"""The collector's port faces whoever can reach it: strangers' garbage, forged hellos, a
second hello for a joined rank, oversize lines and another secret must neither crash the
storing process, nor forge a result, nor grow its memory past the line limit. The real test
sends all of them while a 2-rank torch run started the torchrun way trains, and checks that
the run is stored with the losses one process trains."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sextant.core.errors import RunFailed, UserError
from sextant.launch.collector import (
    MAX_HELLO,
    MAX_LINE,
    MAX_PENDING,
    SECRET_ENV,
    SECRET_FILE_ENV,
    Channel,
    Collector,
    CollectorRefused,
    check_hello,
    check_message,
    digest,
    gather,
    new_secret,
    secret_from_env,
)
from sextant.launch.join import COLLECTOR_PORT_OFFSET, connect
from sextant.launch.local import free_port
from sextant.results.store import ResultsStore
from sextant.runner import execute
from sextant.strategy import Strategy
from sextant.sources import resolve_workload
from tests.helpers import needs_torch, same_training, tiny_gpt_file


# --- one collector in this process -------------------------------------------------------

class _Log(list[str]):
    def __call__(self, line: str) -> None:
        self.append(line)


def _collector(world: int = 2, **kw: Any) -> tuple[Collector, bytes, _Log]:
    secret, log = new_secret(), _Log()
    return Collector("127.0.0.1", {"x": 1}, world, secret=secret, join_timeout_s=20,
                     log=log, **kw), secret, log


def _raw(address: str, *lines: bytes, read: bool = True) -> bytes:
    """Send `lines` as a stranger would; what the collector answered before closing."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        try:
            for line in lines:
                s.sendall(line)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the collector closed first: what we want to see
        chunks = []
        while read:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def _hello_as(address: str, rank: int, secret: bytes) -> bytes:
    """A hello signed with `secret` (the right one or not), answered or refused."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        reader = s.makefile("rb")
        challenge = json.loads(reader.readline())["challenge"]
        hello = {"kind": "hello", "rank": rank, "host": "intruder", "port": 1,
                 "challenge": "0" * 64}
        hello["digest"] = digest(secret, challenge, hello)
        s.sendall((json.dumps(hello) + "\n").encode())
        return reader.readline()


def test_a_stray_event_before_hello_is_dropped_and_the_run_goes_on() -> None:
    """The first high defect: `{"kind":"event"}` used to end the storing process with
    KeyError: 'event'."""
    collector, secret, log = _collector(world=1)
    try:
        assert b'"refused"' in _raw(collector.address, b'{"kind":"event"}\n')
        ch = Channel(collector.address, 0, 1, secret)
        ch.send({"kind": "event"})  # even from a joined rank: dropped, not raised
        ch.send({"kind": "result", "result": {"loss": 3.0}})
        got = gather(collector, (0,), deadline=time.monotonic() + 10, label="t")
        ch.close()
    finally:
        collector.close()
    assert got == [{"loss": 3.0}]
    assert any("not a hello" in line for line in log), log
    assert any("event: missing field 'event'" in line for line in log), log


def test_a_forged_hello_gets_no_plan_and_its_results_are_not_used() -> None:
    """The second high defect: a hello as rank 0 used to receive the plan and have its
    results aggregated."""
    collector, secret, log = _collector(world=1)
    try:
        forged = json.dumps({"kind": "hello", "rank": 0, "host": "x", "port": 1}).encode()
        answer = _raw(collector.address, forged + b"\n",
                      b'{"kind": "result", "result": {"loss": 1.5308}}\n')
        assert b'"plan"' not in answer and b"refused" in answer
        assert b'"plan"' not in _hello_as(collector.address, 0, new_secret())
        assert collector.joined == {}
        ch = Channel(collector.address, 0, 1, secret)
        assert ch.welcome["plan"] == {"x": 1}
        ch.send({"kind": "result", "result": {"loss": 3.0728}})
        (got,) = gather(collector, (0,), deadline=time.monotonic() + 10, label="t")
        ch.close()
    finally:
        collector.close()
    assert got == {"loss": 3.0728}
    assert sum("not signed" in line or "no challenge" in line for line in log) == 2, log


def test_a_second_hello_for_a_rank_is_refused() -> None:
    collector, secret, log = _collector(world=1)
    try:
        ch = Channel(collector.address, 0, 1, secret)
        assert b"already said hello" in _hello_as(collector.address, 0, secret)
        with pytest.raises(CollectorRefused, match="already said hello"):
            Channel(collector.address, 0, 1, secret)
        ch.close()
    finally:
        collector.close()
    assert collector.joined[0][2] != "intruder"


def test_ranks_outside_the_world_are_refused_in_one_line() -> None:
    """A hello with rank 99 or "abc" used to end in thread tracebacks and 'not every rank
    joined in time'."""
    collector, secret, log = _collector(world=2)
    try:
        for rank in (99, -1, "abc", True, 1.0):
            hello = {"kind": "hello", "rank": rank, "host": "x", "port": 1,
                     "challenge": "0" * 64, "digest": "0" * 64}
            _raw(collector.address, json.dumps(hello).encode() + b"\n")
    finally:
        collector.close()
    assert len(log) == 5 and all("is not one of 0..1" in line for line in log), log


def test_an_oversize_line_is_cut_at_the_limit() -> None:
    """A line with no end used to be read whole (400 MB grew the process by 540 MB). Before
    the hello a stranger gets MAX_HELLO bytes; after it, the collector's line limit."""
    collector, secret, log = _collector(world=1, max_line=1 << 16)
    try:
        answer = _raw(collector.address, b"{" + b" " * (32 << 20))
        assert b"refused" not in answer  # closed without reading the 32 MiB
        ch = Channel(collector.address, 0, 1, secret)
        with pytest.raises(OSError):
            for _ in range(512):  # 64 MiB, no newline: the collector closes at 64 KiB
                ch._sock.sendall(b"x" * (128 << 10))
        ch.close()
    finally:
        collector.close()
    assert any(f"longer than {MAX_HELLO} bytes" in line for line in log), log
    assert any("longer than 65536 bytes" in line for line in log), log


def test_a_flood_of_silent_connections_costs_bounded_threads() -> None:
    """Connections that never say hello hold at most MAX_PENDING threads (each for at most
    HELLO_TIMEOUT_S); once they are gone, a rank joins."""
    collector, secret, log = _collector(world=1)
    host, port = collector.address.rsplit(":", 1)
    silent = [socket.create_connection((host, int(port)), timeout=10)
              for _ in range(MAX_PENDING + 8)]
    try:
        deadline = time.monotonic() + 10
        while not any("saying hello at once" in line for line in log):
            assert time.monotonic() < deadline, log
            time.sleep(0.05)
        assert threading.active_count() < MAX_PENDING + 20
    finally:
        for s in silent:
            s.close()
    try:
        ch = connect(collector.address, 0, 30, secret)  # retries while the slots free up
        ch.close()
    finally:
        collector.close()


class _SlowSenders:
    """`count` connections that each send one byte of a hello every `every_s` seconds and
    come back at once when closed: holding the collector's slots for as little as possible."""

    def __init__(self, address: str, count: int, every_s: float) -> None:
        host, port = address.rsplit(":", 1)
        self._where, self._every = (host, int(port)), every_s
        self._stop = threading.Event()
        self.reopened = 0
        self._socks = [self._open() for _ in range(count)]
        self._thread = threading.Thread(target=self._drip, daemon=True)
        self._thread.start()

    def _open(self) -> socket.socket:
        s = socket.create_connection(self._where, timeout=2)
        s.setblocking(False)
        return s

    def _drip(self) -> None:
        while not self._stop.wait(self._every):
            for i, s in enumerate(self._socks):
                try:
                    s.send(b"{")
                    if s.recv(65536, socket.MSG_PEEK) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    pass  # nothing to read: still open
                except OSError:
                    s.close()
                    self.reopened += 1
                    try:
                        self._socks[i] = self._open()
                    except OSError:
                        pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for s in self._socks:
            s.close()


def test_a_slow_sender_is_closed_at_the_hello_deadline(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """The hello limit runs from the accept: a byte every 0.2 s does not extend it."""
    import sextant.launch.collector as collector_module

    monkeypatch.setattr(collector_module, "HELLO_TIMEOUT_S", 1.0)
    collector, _, log = _collector(world=1)
    host, port = collector.address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=10) as s:
            started = time.monotonic()
            s.recv(4096)  # the challenge
            closed_after = None
            while time.monotonic() - started < 5:
                try:
                    s.sendall(b" ")
                except OSError:
                    closed_after = time.monotonic() - started
                    break
                s.settimeout(0.2)
                try:
                    if s.recv(4096) == b"":
                        closed_after = time.monotonic() - started
                        break
                except TimeoutError:
                    pass
        assert closed_after is not None and closed_after < 2.5, closed_after
        assert any("no hello within 1 s of connecting" in line for line in log), log
    finally:
        collector.close()


def test_a_rank_joins_while_slow_senders_hold_every_slot() -> None:
    """64 connections that drip a byte a second and reconnect when closed hold every
    pre-authentication slot; a real rank still joins within 12 s (a newcomer takes the
    slot of the oldest unauthenticated connection, or is told the collector is busy and
    retries)."""
    collector, secret, log = _collector(world=1)
    slow = _SlowSenders(collector.address, MAX_PENDING, every_s=1.0)
    try:
        time.sleep(1.5)  # every slot taken, and each holder past EVICT_AFTER_S
        started = time.monotonic()
        ch = connect(collector.address, 0, 12, secret)
        took = time.monotonic() - started
        ch.close()
    finally:
        slow.close()
        collector.close()
    assert took < 12, took
    assert collector.joined.keys() == {0}
    assert any("every slot was taken" in line for line in log), log


def test_a_rank_told_the_collector_is_busy_retries() -> None:
    """A flood of new connections leaves no slot old enough to take: the rank is told
    why, and joins once the flood stops."""
    collector, secret, log = _collector(world=1)
    host, port = collector.address.rsplit(":", 1)
    flood = [socket.create_connection((host, int(port)), timeout=10)
             for _ in range(MAX_PENDING)]
    try:
        deadline = time.monotonic() + 10
        while len(collector._pending) < MAX_PENDING:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(RunFailed, match="is busy"):
            Channel(collector.address, 0, 1, secret)
        threading.Timer(0.5, lambda: [s.close() for s in flood]).start()
        ch = connect(collector.address, 0, 20, secret)
        ch.close()
    finally:
        for s in flood:
            s.close()
        collector.close()


def test_the_line_limit_leaves_room_for_a_long_run_s_result() -> None:
    """A result carries about 90 bytes per step: a run of millions of steps must not be
    refused its own result by the limit meant for strangers' lines."""
    secret = new_secret()
    for steps, limit in ((100, MAX_LINE), (10**6, 256 * 10**6)):
        collector = Collector("127.0.0.1", {"workload": {"steps": steps}}, 1, secret=secret)
        try:
            assert collector.max_line == limit
        finally:
            collector.close()


def test_a_collector_without_the_secret_is_not_believed() -> None:
    """Mutual: a rank checks the welcome's signature before it uses the plan."""
    impostor, _, _ = _collector(world=1)
    try:
        with pytest.raises(CollectorRefused, match="refused it"):
            Channel(impostor.address, 0, 1, new_secret())
    finally:
        impostor.close()


def test_the_secret_comes_from_the_environment_or_a_file(tmp_path: Path) -> None:
    secret = new_secret()
    assert secret_from_env({SECRET_ENV: secret.hex()}) == secret
    path = tmp_path / "secret"
    path.write_text(secret.hex() + "\n")
    assert secret_from_env({SECRET_FILE_ENV: str(path)}) == secret
    assert secret_from_env({}) is None
    with pytest.raises(UserError, match="64 hex digits"):
        secret_from_env({SECRET_ENV: "abc"})
    with pytest.raises(UserError, match="cannot read"):
        secret_from_env({SECRET_FILE_ENV: str(tmp_path / "none")})


# --- schema properties -------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=10)
messages = st.dictionaries(st.sampled_from(["kind", "event", "result", "text", "rank", "x"]),
                           json_values | st.sampled_from(["event", "result", "error",
                                                          "hello"]), max_size=4)


@given(msg=json_values | messages, world=st.integers(1, 8))
def test_the_schema_answers_every_message_without_raising(msg: Any, world: int) -> None:
    problem = check_message(msg)
    assert problem is None or isinstance(problem, str)
    hello = check_hello(msg, world)
    assert hello is None or isinstance(hello, str)
    if problem is None:  # what passes is what gather and the runner read
        key = {"event": "event", "result": "result", "error": "text"}[msg["kind"]]
        assert isinstance(msg[key], str if key == "text" else dict)


@given(rank=st.integers(-5, 20), world=st.integers(1, 16), port=st.integers(-1, 70000))
def test_a_hello_is_accepted_exactly_for_ranks_in_the_world(rank: int, world: int,
                                                             port: int) -> None:
    hello = {"kind": "hello", "rank": rank, "host": "h", "port": port, "challenge": "a" * 64,
             "digest": "b" * 64}
    assert (check_hello(hello, world) is None) == (0 <= rank < world and 0 <= port <= 65535)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(st.binary(max_size=200), max_size=5))
def test_no_bytes_after_the_hello_change_the_result(lines: list[bytes]) -> None:
    collector, secret, _ = _collector(world=1, max_line=1024)
    try:
        ch = Channel(collector.address, 0, 1, secret)
        for line in lines:
            ch._sock.sendall(line.replace(b"\n", b" ") + b"\n")
        ch.send({"kind": "result", "result": {"loss": 2.5}})
        got = gather(collector, (0,), deadline=time.monotonic() + 10, label="t")
        ch.close()
    finally:
        collector.close()
    assert got == [{"loss": 2.5}]


# --- a real run under attack -------------------------------------------------------------

def _free_port_pair() -> int:
    """A port free now whose collector port is free too: `join` binds MASTER_PORT for the
    process group and MASTER_PORT + COLLECTOR_PORT_OFFSET for rank 0's collector."""
    for _ in range(50):
        port = free_port()
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", port + COLLECTOR_PORT_OFFSET))
        except OSError:
            continue
        return port
    raise AssertionError("no free loopback port with a free collector port in 50 tries")


@pytest.mark.slow
@needs_torch
def test_a_run_under_attack_is_stored_with_its_true_loss(tmp_path: Path) -> None:
    """Two `sextant join` ranks (torchrun's variables) train while intruders send garbage, a
    forged hello, a second hello for each joined rank, an oversize line and a hello under
    another secret to rank 0's collector. The run is stored once, with the losses one process
    trains, and every intruder is logged."""
    workload_file = tiny_gpt_file(tmp_path / "w.toml", "tiny-intruded", 12)
    one = execute(resolve_workload(str(workload_file)), Strategy(framework="torch"),
                  runs_dir=tmp_path / "one")
    secret, master_port = new_secret(), _free_port_pair()
    address = f"127.0.0.1:{master_port + COLLECTOR_PORT_OFFSET}"
    # A 300 ms wait before every batch (the slow-loader test hook, which changes no value)
    # keeps the run training for seconds, so every intrusion lands while it does: a tiny run
    # could otherwise end before the last one is sent.
    env = {**os.environ, SECRET_ENV: secret.hex(), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
           "SEXTANT_TEST_FAULT": "slow-loader-300"}
    cmd = [sys.executable, "-m", "sextant.cli", "join", "--workload", str(workload_file),
           "--parallel", "dp", "--db", str(tmp_path / "r.db"), "--collective-timeout", "60"]
    ranks = [subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in (0, 1)]
    answers: dict[str, bytes] = {}

    def attack() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the collector starts with rank 0
            try:
                answers["garbage"] = _raw(address, b"\x00\xffnot json\n", b'{"kind":"event"}\n')
                break
            except OSError:
                time.sleep(0.1)
        answers["forged"] = _raw(address, b'{"kind":"hello","rank":0,"host":"x","port":1}\n'
                                 b'{"kind":"result","result":{"losses":[1.5308]}}\n')
        answers["other secret"] = _hello_as(address, 1, new_secret())
        answers["oversize"] = _raw(address, b"[" * (16 << 20))
        while time.monotonic() < deadline and not list(tmp_path.rglob("rank1.events.jsonl")):
            time.sleep(0.1)  # rank 1 has its plan: it has said hello
        answers["second hello 0"] = _hello_as(address, 0, secret)
        answers["second hello 1"] = _hello_as(address, 1, secret)

    intruder = threading.Thread(target=attack)
    intruder.start()
    try:
        outs = [p.communicate(timeout=300) for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
        intruder.join(timeout=60)
    assert [p.returncode for p in ranks] == [0, 0], outs[0][1][-3000:] + outs[1][1][-2000:]
    assert all(b'"plan"' not in a for a in answers.values()), answers
    assert b"already said hello" in answers["second hello 0"], answers
    assert b"already said hello" in answers["second hello 1"], answers
    with ResultsStore(tmp_path / "r.db", create=False) as store:
        (run,) = store.runs()
        stored = store.get(run.id)
    assert stored.status == "ok"
    same_training(stored, one)
    warnings = [ln for ln in outs[0][1].splitlines() if "collector: dropped" in ln]
    for why in ("not a hello", "not signed", f"longer than {MAX_HELLO}", "already said hello"):
        assert any(why in ln for ln in warnings), (why, warnings)


def test_join_without_the_secret_is_a_one_line_error() -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in (SECRET_ENV, SECRET_FILE_ENV) and not k.startswith("SLURM_")}
    env.update({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29999"})
    out = subprocess.run([sys.executable, "-m", "sextant.cli", "join"], capture_output=True,
                         text=True, timeout=120, env=env, check=False)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and SECRET_ENV in out.stderr
