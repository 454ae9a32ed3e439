"""The launcher's pure parts: where ranks go, what a failure quotes, link parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from sextant.cluster.emulated import format_rate, parse_latency, parse_rate
from sextant.core.errors import UserError
from sextant.launch.hosts import HostSlot, Placement, blocks
from sextant.launch.local import _last_error_line


def test_ranks_fill_hosts_in_contiguous_blocks() -> None:
    assert blocks(4, 2) == (0, 0, 1, 1)
    assert blocks(5, 2) == (0, 0, 0, 1, 1)
    with pytest.raises(UserError, match="cannot span 3 hosts"):
        blocks(2, 3)
    p = Placement(hosts=(HostSlot("a", "10.0.0.1"), HostSlot("b", "10.0.0.2")),
                  rank_host=blocks(4, 2))
    assert [p.local_rank(r) for r in range(4)] == [0, 1, 0, 1]
    assert [p.local_world(r) for r in range(4)] == [2, 2, 2, 2]
    assert p.master_addr == "10.0.0.1" and p.address(3) == "10.0.0.2" and p.multi_host


def test_a_killed_rank_does_not_quote_an_unrelated_warning(tmp_path: Path) -> None:
    (tmp_path / "rank1.stderr.log").write_text(
        "/x/train.py:206: FutureWarning: `broadcast_buffers` is deprecated\n"
        "  ddp = DDP(module, broadcast_buffers=False)\n")
    assert "ddp = DDP" in _last_error_line(tmp_path, 1)  # an exit code: the last words count
    killed = _last_error_line(tmp_path, 1, killed=True)
    assert "DDP" not in killed and "killed by a signal" in killed
    (tmp_path / "rank1.stderr.log").write_text("warning\nRuntimeError: gloo timed out\n")
    assert _last_error_line(tmp_path, 1, killed=True) == "RuntimeError: gloo timed out"


@pytest.mark.parametrize("text, rate, shown", [
    ("10gbit", 1e10, "10 Gbit/s"), ("100mbit", 1e8, "100 Mbit/s"),
    ("2.5gbit", 2.5e9, "2.5 Gbit/s"), ("none", None, "unshaped")])
def test_link_rates(text: str, rate: float | None, shown: str) -> None:
    assert parse_rate(text) == rate
    assert format_rate(rate) == shown


def test_latencies() -> None:
    assert parse_latency("50us") == pytest.approx(5e-5)
    assert parse_latency("1ms") == pytest.approx(1e-3)
    with pytest.raises(UserError, match="--latency"):
        parse_latency("50")
