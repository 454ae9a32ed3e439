"""How a run's plan reaches the ranks and their results come back, with no shared filesystem.

The process that starts a run (on a login node, or rank 0's node for a torchrun-style start)
listens on one TCP port, bound to the one address the ranks reach it by. Each rank connects
once (SEXTANT_COLLECTOR=host:port) and says hello with its rank and a free port of its own
host. When every rank has said hello, each receives the run's plan and every rank's address
(as the collector sees the rank's connection) and port: what TF_CONFIG-style frameworks need,
with no hostname resolution and no shared filesystem. Then each rank streams its progress
events and finally its result or its error, one JSON object per line; the launcher reads them
in order of arrival.

Authentication, as the standard library's multiprocessing.connection does it, in JSON: every
run has a 32-byte secret (SEXTANT_COLLECTOR_SECRET, hex, or a file named by
SEXTANT_COLLECTOR_SECRET_FILE) that reaches the ranks through their environment. The
collector opens each connection with a random challenge; the rank's hello carries
HMAC-SHA256(secret, challenge + hello) and a challenge of its own, which the collector's
welcome answers the same way. A connection that does not prove the secret is closed before
anything else on it is read; so is a second hello for a rank that has one.

Messages (rank -> collector), each checked against `SCHEMA` (a message that breaks it is
dropped and logged, never raised; a line longer than `MAX_LINE` ends the connection):
{"kind": "hello", "rank": r, "host": name, "pid": n, "port": p, "challenge": hex,
"digest": hex}, {"kind": "event", "event": {...}}, {"kind": "result", "result": {...}},
{"kind": "error", "text": "..."}. Collector -> rank: {"challenge": hex} first, then once
{"plan": {...}, "addresses": [...], "ports": [...], "hosts": [...], "digest": hex}, or
{"refused": reason} before it closes the connection.
"""

from __future__ import annotations

import io
import json
import os
import queue
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from sextant.core.defaults import COLLECTIVE_TIMEOUT_S
from sextant.core.errors import RunFailed, UserError
from sextant.contracts import DoneEvent, EVENTS, Event, MESSAGES, RankResult
from sextant.core.keys import sign, signed
from sextant.core.schema import problem

CONNECT_TIMEOUT_S = 60.0
HELLO_TIMEOUT_S = 10.0
"""How long a new connection may take, from its accept, to authenticate before it is closed:
a deadline for the whole hello, not a limit per read (a byte every few seconds does not
extend it)."""
EVICT_AFTER_S = 1.0
"""When every pre-authentication slot is taken, a newcomer closes the oldest connection that
has been unauthenticated this long (a rank proves the secret in one round trip), so holding
the slots takes more than MAX_PENDING new connections a second, not a few bytes a second."""
BUSY_PREFIX = "busy:"
"""How a refusal for want of a free slot begins: the rank retries it (with backoff)."""
ENV = "SEXTANT_COLLECTOR"
SECRET_ENV = "SEXTANT_COLLECTOR_SECRET"
"""The run's secret, 64 hex digits (set by sextant for the ranks it starts)."""
SECRET_FILE_ENV = "SEXTANT_COLLECTOR_SECRET_FILE"
"""Or a file holding those hex digits (for torchrun-style joins; keep it mode 0600)."""
SECRET_BYTES = 32
MAX_HELLO = 4096
"""Bytes of an unauthenticated line (the hello): a stranger costs the collector no more."""
MAX_LINE = 64 << 20
"""Bytes of one authenticated line (a rank's result with its per-step records), at least."""
RESULT_BYTES_PER_STEP = 256
"""Room per training step in a result line (its per-step records take about 90 bytes), so
that a run of millions of steps is not refused its own result."""
MAX_PENDING = 64
"""Connections that may be proving the secret at once (a flood costs no more than this many
threads); a newcomer beyond them takes the slot of the oldest one past EVICT_AFTER_S, or is
told the collector is busy and retries."""
MAX_LOGGED = 20
"""Dropped messages logged one by one to stderr; later ones are counted."""


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def secret_from_env(env: dict[str, str] | os._Environ[str]) -> bytes | None:
    """The run's secret from SEXTANT_COLLECTOR_SECRET or SEXTANT_COLLECTOR_SECRET_FILE, None
    when neither is set (UserError when one is set but is not 32 bytes of hex)."""
    if env.get(SECRET_ENV):
        text, where = env[SECRET_ENV], SECRET_ENV
    elif env.get(SECRET_FILE_ENV):
        where = f"{SECRET_FILE_ENV} ({env[SECRET_FILE_ENV]})"
        try:
            with open(env[SECRET_FILE_ENV], "rb") as f:
                text = f.read(4 * SECRET_BYTES + 2).decode("ascii", "replace")
        except OSError as exc:
            raise UserError(f"cannot read {where}: {exc.strerror}") from None
    else:
        return None
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError:
        secret = b""
    if len(secret) != SECRET_BYTES:
        raise UserError(f"{where} must be {2 * SECRET_BYTES} hex digits (e.g. from `python -c "
                        f"'import secrets; print(secrets.token_hex(32))'`). Received: "
                        f"{len(text.strip())} characters")
    return secret


def digest(secret: bytes, challenge: str, msg: dict[str, Any]) -> str:
    """HMAC-SHA256 of the peer's challenge and the message (every key but `digest`)."""
    return sign(secret, msg, field="digest", context=challenge.encode() + b"\n")


def verified(secret: bytes, challenge: str, msg: dict[str, Any]) -> bool:
    """Whether `msg` carries its `digest` for this secret and the peer's challenge."""
    return signed(secret, msg, field="digest", context=challenge.encode() + b"\n")


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_hex(value: Any, size: int = 64) -> bool:
    return (isinstance(value, str) and len(value) == size
            and all(c in "0123456789abcdef" for c in value))


def check_hello(msg: Any, world: int) -> str | None:
    """None when `msg` is a well-formed hello for a rank of a `world`-rank run, else what is
    wrong with it (the signature is checked apart)."""
    if not isinstance(msg, dict) or msg.get("kind") != "hello":
        return "the first message is not a hello"
    rank: Any = msg.get("rank")
    if not _is_int(rank) or not 0 <= rank < world:
        return f"rank {str(rank)[:20]!r} is not one of 0..{world - 1}"
    port: Any = msg.get("port")
    if not _is_int(port) or not 0 <= port <= 65535:
        return f"port {str(port)[:20]!r} is not a TCP port"
    if not isinstance(msg.get("host"), str) or len(msg["host"]) > 255:
        return "host is not a host name"
    if "pid" in msg and not _is_int(msg["pid"]):
        return "pid is not an integer"
    if not _is_hex(msg.get("challenge")) or not _is_hex(msg.get("digest")):
        return "no challenge or digest"
    return None


def check_message(msg: Any) -> str | None:
    """None when `msg` is a well-formed event, result or error (after the hello), else what
    is wrong with it (sextant.contracts.MESSAGES; an event's fields: EVENTS)."""
    if not isinstance(msg, dict):
        return "not a JSON object"
    kind = msg.get("kind")
    if not isinstance(kind, str) or kind not in MESSAGES:
        return f"unknown kind {str(kind)[:40]!r}"
    wrong = problem(msg, MESSAGES[kind], f"{kind}: ")
    if wrong is None and kind == "event":
        event = msg["event"]
        wrong = problem(event, Event, "event: ") or problem(
            event, EVENTS.get(str(event["event"]), DoneEvent), f"event {event['event']}: ")
    if wrong is None and kind == "result" and not all(isinstance(k, str) for k in msg["result"]):
        wrong = "result with a non-text key"
    return wrong


def _read_line(stream: IO[bytes], limit: int) -> bytes | None:
    """One line of at most `limit` bytes; b"" at the end of the stream, None when the line is
    longer (the rest of the connection cannot be trusted to be in step)."""
    line = stream.readline(limit + 1)
    return None if len(line) > limit else line


def _read_hello(conn: socket.socket, deadline: float) -> tuple[bytes | None, bytes]:
    """The first line from `conn` (b"" at the end of the stream, None past MAX_HELLO bytes)
    and what was read after it, by `deadline` (TimeoutError after it)."""
    buf = bytearray()
    while b"\n" not in buf:
        if len(buf) > MAX_HELLO:
            return None, b""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        conn.settimeout(left)
        chunk = conn.recv(MAX_HELLO + 1 - len(buf))
        if not chunk:
            return b"", b""
        buf += chunk
    end = buf.index(b"\n") + 1
    return (bytes(buf[:end]) if end <= MAX_HELLO else None), bytes(buf[end:])


class _Prefixed(io.RawIOBase):
    """A socket's stream with bytes already read from it put back in front."""

    def __init__(self, prefix: bytes, conn: socket.socket) -> None:
        self._prefix, self._conn = prefix, conn

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._prefix:
            n = min(len(buffer), len(self._prefix))
            buffer[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        return self._conn.recv_into(buffer)


def _loads(line: bytes) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


class Collector:
    """A TCP listener on `bind` (one address, never the wildcard) in the launching process,
    for the `world` ranks of one run that share `secret`."""

    def __init__(self, bind: str, plan: dict[str, Any], world: int, *, secret: bytes,
                 port: int = 0, join_timeout_s: float = COLLECTIVE_TIMEOUT_S, max_line: int | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        if len(secret) != SECRET_BYTES:
            raise ValueError(f"the collector's secret must be {SECRET_BYTES} bytes")
        self.plan = plan
        self.world = world
        self.join_timeout_s = join_timeout_s
        self._secret = secret
        steps = (plan.get("workload") or {}).get("steps")
        self.max_line = max_line if max_line is not None else max(
            MAX_LINE, RESULT_BYTES_PER_STEP * steps if type(steps) is int else 0)
        """Bytes of a joined rank's line: MAX_LINE, or more for a run of many steps."""
        self._log = log if log is not None else _stderr
        self.joined: dict[int, tuple[str, int, str]] = {}
        """rank -> (address, port, hostname) of the ranks that said hello."""
        self.dropped: list[str] = []
        """Why each refused connection or dropped message was refused, in order."""
        self._all_joined = threading.Event()
        self._join_lock = threading.Lock()
        self._pending: dict[socket.socket, float] = {}
        """Connections not yet authenticated -> when each was accepted (monotonic)."""
        self._evicted: set[socket.socket] = set()
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

    def _drop(self, peer: str, why: str) -> None:
        """Log a refused connection or a dropped message (never raise: the run goes on)."""
        with self._join_lock:
            self.dropped.append(f"{peer}: {why}")
            count = len(self.dropped)
        if count <= MAX_LOGGED:
            self._log(f"collector: dropped a message from {peer}: {why}")
        elif count == MAX_LOGGED + 1:
            self._log("collector: more dropped messages; not logging them one by one")

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            if not self._admit(conn):
                self._drop("a connection", f"more than {MAX_PENDING} connections are "
                                           f"saying hello at once; told it is busy")
                self._refuse(conn, f"{BUSY_PREFIX} {MAX_PENDING} connections are saying "
                                   f"hello at once; try again")
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, time.monotonic()),
                             daemon=True).start()

    def _admit(self, conn: socket.socket) -> bool:
        """Give `conn` a pre-authentication slot, closing the oldest pending connection past
        EVICT_AFTER_S when all are taken; False when none can be had."""
        now = time.monotonic()
        with self._join_lock:
            if len(self._pending) >= MAX_PENDING:
                oldest = min(self._pending, key=self._pending.__getitem__)
                if now - self._pending[oldest] < EVICT_AFTER_S:
                    return False
                del self._pending[oldest]
                self._evicted.add(oldest)
                try:  # its reader wakes with the end of the stream and lets the socket go
                    oldest.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._pending[conn] = now
            return True

    def _release(self, conn: socket.socket) -> bool:
        """Free `conn`'s pre-authentication slot; True when a newcomer had taken it."""
        with self._join_lock:
            self._pending.pop(conn, None)
            if conn in self._evicted:
                self._evicted.discard(conn)
                return True
            return False

    def _serve(self, conn: socket.socket, accepted: float) -> None:
        try:
            name = conn.getpeername()
        except OSError:
            conn.close()
            self._release(conn)
            return
        peer = f"{name[0]}:{name[1]}" if isinstance(name, tuple) else str(name or "local")
        rank = None
        try:
            with conn:
                try:
                    hello, rest = self._hello(conn, peer, accepted + HELLO_TIMEOUT_S)
                finally:
                    if self._release(conn):
                        self._drop(peer, f"unauthenticated for over {EVICT_AFTER_S:g} s "
                                         f"while every slot was taken; closed")
                if hello is None or not self._welcome(conn, hello):
                    return
                lines = io.BufferedReader(_Prefixed(rest, conn))
                rank = hello["rank"]
                while True:
                    raw = _read_line(lines, self.max_line)
                    if raw is None:
                        self._drop(f"rank {rank} ({peer})", f"a line longer than "
                                   f"{self.max_line} bytes; connection closed")
                        return
                    if not raw:
                        return
                    msg = _loads(raw)
                    problem = check_message(msg)
                    if problem is not None:
                        self._drop(f"rank {rank} ({peer})", problem)
                        continue
                    self.messages.put({**msg, "rank": rank})
        except OSError:
            pass  # a reset connection ends like a closed one
        finally:
            if rank is not None:
                self.messages.put({"kind": "closed", "rank": rank})

    def _hello(self, conn: socket.socket, peer: str, deadline: float
               ) -> tuple[dict[str, Any] | None, bytes]:
        """The authenticated hello of a rank that had not said hello, now joined, and the
        bytes read after it; None (and the connection is to be closed) otherwise."""
        challenge = secrets.token_hex(32)
        conn.settimeout(max(0.01, deadline - time.monotonic()))
        conn.sendall((json.dumps({"challenge": challenge}) + "\n").encode())
        try:
            raw, rest = _read_hello(conn, deadline)
        except TimeoutError:
            self._drop(peer, f"no hello within {HELLO_TIMEOUT_S:g} s of connecting")
            return None, b""
        if raw is None:
            self._drop(peer, f"a hello longer than {MAX_HELLO} bytes")
            return None, b""
        if not raw:
            return None, b""
        hello = _loads(raw)
        problem = check_hello(hello, self.world)
        if problem is None and not verified(self._secret, challenge, hello):
            problem = "the hello is not signed with this run's secret"
        if problem is None:
            with self._join_lock:
                if hello["rank"] in self.joined:
                    problem = f"rank {hello['rank']} has already said hello"
                else:
                    self.joined[hello["rank"]] = (peer.rsplit(":", 1)[0], hello["port"],
                                                  hello["host"])
                    if len(self.joined) == self.world:
                        self._all_joined.set()
        if problem is not None:
            self._drop(peer, problem)
            self._refuse(conn, problem)
            return None, b""
        conn.settimeout(None)
        self.messages.put({**{k: v for k, v in hello.items() if k != "digest"},
                           "address": self.joined[hello["rank"]][0]})
        return dict(hello), rest

    def _welcome(self, conn: socket.socket, hello: dict[str, Any]) -> bool:
        """Once every rank has said hello, send this one the plan and the addresses, signed
        against its challenge; False if they did not all come in time."""
        if not self._all_joined.wait(self.join_timeout_s):
            return False
        reply: dict[str, Any] = {
            "plan": self.plan,
            "addresses": [self.joined[r][0] for r in range(self.world)],
            "ports": [self.joined[r][1] for r in range(self.world)],
            "hosts": [self.joined[r][2] for r in range(self.world)]}
        reply["digest"] = digest(self._secret, hello["challenge"], reply)
        conn.sendall((json.dumps(reply) + "\n").encode())
        return True

    @staticmethod
    def _refuse(conn: socket.socket, why: str) -> None:
        try:
            conn.settimeout(1.0)  # a peer that reads nothing cannot stall the collector
            conn.sendall((json.dumps({"refused": why}) + "\n").encode())
        except OSError:
            pass

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


def _stderr(line: str) -> None:
    sys.stderr.write(f"sextant: warning: {line}\n")


class CollectorRefused(RunFailed):
    """The collector refused this rank's hello (another secret, or its rank already joined):
    trying again cannot help."""


class CollectorBusy(RunFailed):
    """Every pre-authentication slot of the collector was taken: trying again can help."""


def _printable(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, with anything unprintable escaped (what a peer
    says reaches a terminal)."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text[:limit])


class Channel:
    """A rank's connection to its collector."""

    def __init__(self, address: str, rank: int, port: int, secret: bytes) -> None:
        """Connect, prove the run's secret, say hello with this rank and a free `port` of
        this host, and wait for the plan and every rank's address (the collector sends them,
        signed, once all ranks are in)."""
        host, collector_port = address.rsplit(":", 1)
        try:
            self._sock = socket.create_connection((host, int(collector_port)),
                                                  timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise RunFailed(f"rank {rank}: cannot reach the collector at {address} ({exc}); "
                            f"the launching host must be reachable from this node") from exc
        self._lock = threading.Lock()
        self._reader = self._sock.makefile("rb")
        try:
            opening = _loads(_read_line(self._reader, MAX_HELLO) or b"")
            busy = opening.get("refused") if isinstance(opening, dict) else None
            if isinstance(busy, str) and busy.startswith(BUSY_PREFIX):
                raise CollectorBusy(f"rank {rank}: the collector at {address} is busy "
                                    f"({_printable(busy[len(BUSY_PREFIX):], 200).strip()})")
            if not (isinstance(opening, dict) and _is_hex(opening.get("challenge"))):
                raise RunFailed(f"rank {rank}: {address} did not answer as a sextant "
                                f"collector")
            own = secrets.token_hex(32)
            hello = {"kind": "hello", "rank": rank, "host": socket.gethostname()[:255],
                     "pid": os.getpid(), "port": port, "challenge": own}
            hello["digest"] = digest(secret, opening["challenge"], hello)
            self.send(hello)
            self._sock.settimeout(None)
            line = _read_line(self._reader, MAX_LINE)
        except (OSError, RunFailed):
            self.close()
            raise
        welcome = _loads(line or b"")
        if isinstance(welcome, dict) and isinstance(welcome.get("refused"), str):
            self.close()
            raise CollectorRefused(f"rank {rank}: the collector at {address} refused it: "
                                   f"{_printable(welcome['refused'], 200)} (is {SECRET_ENV} the same "
                                   f"on every node?)")
        if not isinstance(welcome, dict):
            self.close()
            raise RunFailed(f"rank {rank}: the collector at {address} closed the rendezvous "
                            f"(not every rank joined in time)")
        if not (_is_hex(welcome.get("digest")) and verified(secret, own, welcome)):
            self.close()
            raise CollectorRefused(f"rank {rank}: the collector at {address} does not know "
                                   f"this run's secret; its plan is not used")
        self.welcome: dict[str, Any] = welcome

    def send(self, msg: dict[str, Any]) -> None:
        data = (json.dumps(msg) + "\n").encode()
        with self._lock:
            self._sock.sendall(data)

    def close(self) -> None:
        self._reader.close()
        self._sock.close()


def gather(collector: Collector, primary: tuple[int, ...], *, deadline: float, label: str,
           on_event: Callable[[dict[str, Any]], None] | None = None,
           alive: Callable[[], str | None] | None = None) -> list[RankResult]:
    """The primary ranks' results, in rank order, as they arrive through the collector.

    Progress events go to `on_event` as they come. RunFailed names the first rank that
    reports an error or drops its connection without a result, the ranks that never joined
    when the deadline passes, or what `alive()` says (e.g. 'the Slurm job ended') when it
    returns a reason to stop waiting."""
    results: dict[int, RankResult] = {}
    while len(results) < len(primary):
        for msg in collector.drain():
            kind, rank = msg.get("kind"), msg.get("rank")
            where = _where(collector, rank)
            if kind == "event" and on_event is not None:
                on_event(msg["event"])
            elif kind == "result" and rank in primary:
                results.setdefault(rank, msg["result"])
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
