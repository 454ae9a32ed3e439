"""TensorBoard event files from a run's metrics, with no dependency.

An event file is a TFRecord stream (length, masked CRC-32C of the length, payload, masked
CRC-32C of the payload) of `tensorflow.Event` protocol buffers. sextant only writes scalars,
so the three messages involved are encoded here by hand (a few fields each):

    Event         wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
                  summary = 5 (Summary)
    Summary       value = 1 (repeated Value)
    Summary.Value tag = 1 (string), simple_value = 2 (float)

Viewing the files needs TensorBoard itself (`pip install tensorboard`); writing them does not,
so `--tensorboard DIR` never pulls a framework into the measuring process.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sextant.core.errors import UserError


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, wire: int) -> bytes:
    return _varint((number << 3) | wire)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _field(number, 2) + _varint(len(payload)) + payload


def encode_event(wall_time: float, step: int = 0, *, scalars: dict[str, float] | None = None,
                 file_version: str | None = None) -> bytes:
    out = _field(1, 1) + struct.pack("<d", wall_time)
    if step:
        out += _field(2, 0) + _varint(step)
    if file_version is not None:
        out += _bytes_field(3, file_version.encode())
    if scalars:
        summary = b"".join(
            _bytes_field(1, _bytes_field(1, tag.encode()) + _field(2, 5) + struct.pack("<f", v))
            for tag, v in scalars.items()
        )
        out += _bytes_field(5, summary)
    return out


def frame(payload: bytes) -> bytes:
    """One TFRecord: length, masked CRC of the length, payload, masked CRC of the payload."""
    length = struct.pack("<Q", len(payload))
    return (length + struct.pack("<I", masked_crc32c(length)) + payload
            + struct.pack("<I", masked_crc32c(payload)))


class EventWriter:
    """Appends scalar events to one new event file in `logdir`."""

    def __init__(self, logdir: str | Path) -> None:
        self.logdir = Path(logdir)
        try:
            self.logdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create TensorBoard directory {self.logdir}: {exc}") from None
        name = (f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}."
                f"{os.getpid()}.{time.monotonic_ns() % 10**6}")
        self.path = self.logdir / name
        self._f = open(self.path, "ab")
        self._f.write(frame(encode_event(time.time(), file_version="brain.Event:2")))

    def scalars(self, step: int, values: dict[str, float], wall_time: float | None = None) -> None:
        clean = {k: float(v) for k, v in values.items() if v is not None}
        if clean:
            self._f.write(frame(encode_event(wall_time or time.time(), step, scalars=clean)))

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_logdir(logdir: str | Path) -> Path:
    """Fail early (before any run) when `--tensorboard DIR` cannot be written."""
    path = Path(logdir)
    if path.exists() and not path.is_dir():
        raise UserError(f"--tensorboard {path}: exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--tensorboard {path}: cannot create it ({exc})") from None
    return path


def write_tensorboard(records: Iterable[dict[str, Any]], logdir: str | Path,
                      name: str | None = None) -> Path:
    """Write one run's metrics records (see sextant.monitor.metrics) as TensorBoard scalars
    under `logdir/<name>` (default: the run's directory name); returns the event file.

    Tags: loss (mean of the ranks' local losses, as the run record), step_time_ms (slowest
    rank), tokens_per_s, and per rank step_time_ms/rankR, data_wait_ms/rankR, rss_mb/rankR."""
    records = list(records)
    head = next((r for r in records if r.get("event") == "run"), {})
    tokens_per_step = (head.get("global_batch") or 0) * (head.get("tokens_per_sample") or 1)
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("event") == "step":
            by_step[r["step"]].append(r)
    with EventWriter(Path(logdir) / (name or head.get("run") or "run")) as writer:
        for step in sorted(by_step):
            rows = by_step[step]
            values: dict[str, float] = {}
            losses = [r["loss"] for r in rows if r.get("loss") is not None]
            if losses and len(losses) == len(rows):
                values["loss"] = sum(losses) / len(losses)
            job = max(r["step_time_s"] for r in rows)
            values["step_time_ms"] = job * 1e3
            if tokens_per_step and job > 0:
                values["tokens_per_s"] = tokens_per_step / job
            for r in rows:
                values[f"step_time_ms/rank{r['rank']}"] = r["step_time_s"] * 1e3
                values[f"data_wait_ms/rank{r['rank']}"] = r["data_time_s"] * 1e3
                if r.get("rss_bytes"):
                    values[f"rss_mb/rank{r['rank']}"] = r["rss_bytes"] / 2**20
            writer.scalars(step, values, wall_time=max(r["time"] for r in rows))
        return writer.path


def read_event_file(path: str | Path) -> list[tuple[int, dict[str, float]]]:
    """Decode an event file written by EventWriter (CRCs checked): [(step, scalars)]."""
    data = Path(path).read_bytes()
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        (len_crc,) = struct.unpack_from("<I", data, pos + 8)
        if len_crc != masked_crc32c(data[pos:pos + 8]):
            raise ValueError(f"bad length CRC at byte {pos}")
        payload = data[pos + 12:pos + 12 + length]
        (crc,) = struct.unpack_from("<I", data, pos + 12 + length)
        if crc != masked_crc32c(payload):
            raise ValueError(f"bad payload CRC at byte {pos}")
        pos += 16 + length
        fields = _decode(payload)
        step = fields.get(2, [0])[0]
        scalars = {}
        for summary in fields.get(5, []):
            for value in _decode(summary).get(1, []):
                v = _decode(value)
                scalars[v[1][0].decode()] = struct.unpack("<f", v[2][0])[0]
        out.append((step, scalars))
    return out


def _decode(buf: bytes) -> dict[int, list[Any]]:
    fields: dict[int, list[Any]] = defaultdict(list)
    pos = 0

    def varint() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return result

    while pos < len(buf):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            fields[number].append(varint())
        elif wire == 1:
            fields[number].append(buf[pos:pos + 8])
            pos += 8
        elif wire == 5:
            fields[number].append(buf[pos:pos + 4])
            pos += 4
        elif wire == 2:
            n = varint()
            fields[number].append(buf[pos:pos + n])
            pos += n
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return fields
