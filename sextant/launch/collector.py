"""How a run's plan reaches the ranks and their results come back, with no shared filesystem.

The process that starts a run (on a login node, or rank 0's node for a torchrun-style start)
listens on one TCP port. Each rank connects once (SEXTANT_COLLECTOR=host:port) and says hello
with its rank and a free port of its own host. When every rank has said hello, each receives
the run's plan and every rank's address (as the collector sees the rank's connection) and
port: what TF_CONFIG-style frameworks need, with no hostname resolution and no shared
filesystem. Then each rank streams its progress events and finally its result or its error,
one JSON object per line; the launcher reads them in order of arrival.

Messages (rank -> collector): {"kind": "hello", "rank": r, "host": name, "port": p},
{"kind": "event", "event": {...}}, {"kind": "result", "result": {...}},
{"kind": "error", "text": "..."}. Collector -> rank, once: {"plan": {...}, "addresses": [...],
"ports": [...]}.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from sextant.defaults import COLLECTIVE_TIMEOUT_S
from sextant.errors import RunFailed

CONNECT_TIMEOUT_S = 60.0
ENV = "SEXTANT_COLLECTOR"


class Collector:
    """A TCP listener on `bind` (one address, never the wildcard) in the launching process,
    for the `world` ranks of one run."""

    def __init__(self, bind: str, plan: dict[str, Any], world: int, *, port: int = 0,
                 join_timeout_s: float = COLLECTIVE_TIMEOUT_S) -> None:
        self.plan = plan
        self.world = world
        self.join_timeout_s = join_timeout_s
        self.joined: dict[int, tuple[str, int, str]] = {}
        """rank -> (address, port, hostname) of the ranks that said hello."""
        self._all_joined = threading.Event()
        self._join_lock = threading.Lock()
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        self._sock = socket.create_server((bind, port))
        self._sock.settimeout(0.5)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="sextant-collector",
                                        daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"{host}:{port}"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        rank = None
        with conn, conn.makefile("rb") as lines:
            for raw in lines:
                try:
                    msg = json.loads(raw)
                except ValueError:
                    continue
                if msg.get("kind") == "hello":
                    rank = int(msg["rank"])
                    self.messages.put({**msg, "address": conn.getpeername()[0]})
                    if not self._welcome(conn, rank, msg):
                        break
                    continue
                self.messages.put({**msg, "rank": rank})
        self.messages.put({"kind": "closed", "rank": rank})

    def _welcome(self, conn: socket.socket, rank: int, hello: dict[str, Any]) -> bool:
        """Wait until every rank has said hello, then send this one the plan and the
        addresses; False (and the connection is dropped) if they did not all come in time."""
        with self._join_lock:
            self.joined[rank] = (conn.getpeername()[0], int(hello.get("port") or 0),
                                 str(hello.get("host")))
            if len(self.joined) == self.world:
                self._all_joined.set()
        if not self._all_joined.wait(self.join_timeout_s):
            return False
        reply = {"plan": self.plan,
                 "addresses": [self.joined[r][0] for r in range(self.world)],
                 "ports": [self.joined[r][1] for r in range(self.world)],
                 "hosts": [self.joined[r][2] for r in range(self.world)]}
        conn.sendall((json.dumps(reply) + "\n").encode())
        return True

    def missing(self) -> list[int]:
        """Ranks that have not said hello."""
        return [r for r in range(self.world) if r not in self.joined]

    def drain(self) -> list[dict[str, Any]]:
        out = []
        while True:
            try:
                out.append(self.messages.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        self._closed.set()
        self._sock.close()
        self._thread.join(timeout=2)


class Channel:
    """A rank's connection to its collector."""

    def __init__(self, address: str, rank: int, port: int) -> None:
        """Connect, say hello with this rank and a free `port` of this host, and wait for the
        plan and every rank's address (the collector sends them once all ranks are in)."""
        host, collector_port = address.rsplit(":", 1)
        try:
            self._sock = socket.create_connection((host, int(collector_port)),
                                                  timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise RunFailed(f"rank {rank}: cannot reach the collector at {address} ({exc}); "
                            f"the launching host must be reachable from this node") from exc
        self._sock.settimeout(None)
        self._lock = threading.Lock()
        self._reader = self._sock.makefile("rb")
        self.send({"kind": "hello", "rank": rank, "host": socket.gethostname(),
                   "pid": os.getpid(), "port": port})
        line = self._reader.readline()
        if not line:
            raise RunFailed(f"rank {rank}: the collector at {address} closed the rendezvous "
                            f"(not every rank joined in time)")
        self.welcome: dict[str, Any] = json.loads(line)

    def send(self, msg: dict[str, Any]) -> None:
        data = (json.dumps(msg) + "\n").encode()
        with self._lock:
            self._sock.sendall(data)

    def close(self) -> None:
        self._reader.close()
        self._sock.close()


def gather(collector: Collector, primary: tuple[int, ...], *, deadline: float, label: str,
           on_event: Callable[[dict[str, Any]], None] | None = None,
           alive: Callable[[], str | None] | None = None) -> list[dict[str, Any]]:
    """The primary ranks' results, in rank order, as they arrive through the collector.

    Progress events go to `on_event` as they come. RunFailed names the first rank that
    reports an error or drops its connection without a result, the ranks that never joined
    when the deadline passes, or what `alive()` says (e.g. 'the Slurm job ended') when it
    returns a reason to stop waiting."""
    results: dict[int, dict[str, Any]] = {}
    while len(results) < len(primary):
        for msg in collector.drain():
            kind, rank = msg.get("kind"), msg.get("rank")
            where = _where(collector, rank)
            if kind == "event" and on_event is not None:
                on_event(msg["event"])
            elif kind == "result" and rank in primary:
                results[rank] = msg["result"]
            elif kind == "error":
                raise RunFailed(f"{label}: rank {rank}{where} failed: "
                                f"{_last_line(msg.get('text', ''))}")
            elif kind == "closed" and rank is not None and rank in primary and rank not in results:
                raise RunFailed(f"{label}: rank {rank}{where} lost its connection before "
                                f"reporting a result")
        if len(results) == len(primary):
            break
        reason = alive() if alive is not None else None
        if reason is not None:
            raise RunFailed(f"{label}: {reason}; {_progress(collector, results, primary)}")
        if time.monotonic() > deadline:
            raise RunFailed(f"{label}: timed out; {_progress(collector, results, primary)}")
        time.sleep(0.05)
    return [results[r] for r in primary]


def _where(collector: Collector, rank: int | None) -> str:
    joined = collector.joined.get(rank) if rank is not None else None
    return f" on {joined[2]}" if joined else ""


def _progress(collector: Collector, results: dict[int, Any], primary: tuple[int, ...]) -> str:
    missing = collector.missing()
    if missing:
        return f"rank(s) {', '.join(map(str, missing))} never joined the run"
    waiting = [r for r in primary if r not in results]
    return f"no result yet from rank(s) {', '.join(map(str, waiting))}"


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:500] if lines else "no error output"
