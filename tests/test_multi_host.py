"""Runs across hosts of an emulated cluster: network namespaces behind shaped veth links.

Real namespaces, real tc shaping, real frameworks talking over the cluster's addresses. Needs
root and iproute2 (CI has both); every cluster a test creates is removed, even on failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sextant.cluster import emulated
from sextant.core.errors import RunFailed, UserError
from sextant.results.store import ResultsStore
from sextant.runner import execute
from sextant.strategy import Strategy
from tests.helpers import needs_torch, same_training, short

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                       reason="an emulated cluster needs root and iproute2"),
]


def _name(tag: str) -> str:
    return f"t{tag}{os.getpid() % 10000}"


def _ours() -> list[str]:
    return [ns for ns in emulated.namespaces() if ns.startswith(f"{emulated.PREFIX}t")]


@pytest.fixture(scope="module")
def cluster() -> emulated.Cluster:
    name = _name("m")
    c = emulated.up(name, 2, emulated.Link(rate_bit_s=10e9))
    try:
        yield c
    finally:
        emulated.down(name)


def _bytes_sent(host: emulated.Host) -> int:
    out = subprocess.run(["ip", "netns", "exec", host.netns, "tc", "-s", "qdisc", "show", "dev",
                          "eth0"], check=True, capture_output=True, text=True, timeout=10).stdout
    return int(out.split("Sent ")[1].split()[0])


def test_up_and_down_leave_nothing_behind() -> None:
    before = emulated.namespaces()
    name = _name("u")
    c = emulated.up(name, 3, emulated.Link(rate_bit_s=1e9))
    try:
        subnet = c.hosts[0].address.rsplit(".", 1)[0]
        assert [h.address for h in c.hosts] == [f"{subnet}.{i}" for i in (1, 2, 3)]
        assert c.gateway == f"{subnet}.254"
        assert emulated.load(name) == c
        assert set(emulated.link_states(c).values()) == {"UP"}
        hosts = (emulated.NETNS_ETC / c.hosts[1].netns / "hosts").read_text()
        assert f"{subnet}.2\t{name}-h1" in hosts
        with pytest.raises(UserError, match="already exists"):
            emulated.up(name, 2, emulated.Link(rate_bit_s=None))
    finally:
        removed = emulated.down(name)
    assert len(removed) == 4  # three hosts and the switch
    assert emulated.namespaces() == before
    assert not list(emulated.NETNS_ETC.glob(f"{emulated.PREFIX}{name}-*"))
    assert not (emulated.STATE_DIR / f"{name}.json").exists()
    assert subprocess.run(["ip", "link", "show", emulated.gateway_device(name)], check=False,
                          capture_output=True, timeout=10).returncode != 0


def test_a_failed_up_removes_what_it_created(monkeypatch: pytest.MonkeyPatch) -> None:
    before = emulated.namespaces()
    real, calls = emulated._shape, []

    def shape_then_fail(*args: object) -> None:
        calls.append(args)
        if len(calls) == 3:  # the second host's link
            raise UserError("injected: tc failed")
        real(*args)

    monkeypatch.setattr(emulated, "_shape", shape_then_fail)
    with pytest.raises(UserError, match="injected"):
        emulated.up(_name("f"), 2, emulated.Link(rate_bit_s=1e9))
    assert emulated.namespaces() == before


@pytest.mark.parametrize("text, message", [
    ("Bad_Name", "cluster name"), ("waytoolongname", "cluster name"),
])
def test_bad_names_are_refused(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        emulated.up(text, 2, emulated.Link(rate_bit_s=1e9))


@pytest.mark.parametrize("text", ["10gb", "fast", "-1gbit", "0gbit"])
def test_bad_link_rates_are_refused(text: str) -> None:
    with pytest.raises(UserError, match="--link must look like"):
        emulated.parse_rate(text)


def test_latency_needs_netem_or_is_refused_in_one_line() -> None:
    link = emulated.Link(rate_bit_s=1e9, latency_s=50e-6)
    if emulated.has_netem():
        pytest.skip("this kernel has netem; latency is emulated")
    with pytest.raises(UserError, match="no netem"):
        emulated.up(_name("l"), 2, link)


def test_unknown_cluster_is_a_one_line_error() -> None:
    with pytest.raises(UserError, match="no emulated cluster 'nosuch'.*sextant cluster up"):
        emulated.load("nosuch")


WORKLOAD = short("gpt-tiny", 4)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The reference: torch, one process on one host (frameworks agree to ~1e-6 in fp32)."""
    pytest.importorskip("torch")
    return execute(WORKLOAD, Strategy(framework="torch", mode="eager", parallel="single",
                                      workers=1), runs_dir=tmp_path_factory.mktemp("one"))


@pytest.mark.parametrize("framework, parallel", [
    ("torch", "dp"), ("jax", "dp-manual"), ("tensorflow", "dp"),
])
def test_runs_across_hosts_train_like_one_process(
    cluster: emulated.Cluster, one_process: dict, tmp_path: Path, framework: str, parallel: str
) -> None:
    """Same weights, same batches: two ranks on two hosts train exactly what one process on
    one host trains, and the gradients really crossed the shaped link."""
    pytest.importorskip({"torch": "torch", "jax": "jax", "tensorflow": "tensorflow"}[framework])
    mode = "eager" if framework == "torch" else "compiled"
    strategy = Strategy(framework=framework, mode=mode, parallel=parallel, workers=2)
    sent = _bytes_sent(cluster.hosts[1])
    with ResultsStore(tmp_path / "r.db") as store:
        remote = execute(WORKLOAD, strategy, runs_dir=tmp_path / "remote", store=store,
                         cluster=cluster.name)
        stored = store.get(remote.id)
    same_training(remote, one_process)
    assert [r.fingerprint["hostname"] for r in remote.ranks] == [
        h.name for h in cluster.hosts]
    network = stored.fingerprint.network
    assert network["kind"] == "emulated" and network["link_bit_s"] == 10e9
    assert list(network["hosts"]) == [h.name for h in cluster.hosts]
    assert _bytes_sent(cluster.hosts[1]) - sent > remote.metrics.params * 4


@needs_torch
def test_a_host_whose_link_goes_down_fails_the_run_naming_it(tmp_path: Path) -> None:
    name = _name("d")
    c = emulated.up(name, 2, emulated.Link(rate_bit_s=1e9))
    try:
        workload = short("gpt-tiny", 5000)
        strategy = Strategy(framework="torch", mode="eager", parallel="dp", workers=2)
        events: list[dict] = []

        def cut_after_first_step(event: dict) -> None:
            events.append(event)
            if event.get("event") == "step" and event.get("step") == 2:
                emulated.set_link(c, "h1", "down")

        start = time.monotonic()
        with ResultsStore(tmp_path / "r.db") as store:
            with pytest.raises(RunFailed, match=rf"rank \d on {name}-h\d"):
                execute(workload, strategy, runs_dir=tmp_path / "runs", store=store,
                        cluster=name, collective_timeout_s=8, on_event=cut_after_first_step,
                        timeout_s=120)
            assert [r.status for r in store.runs()] == ["failed"]
        assert time.monotonic() - start < 60
        for host in c.hosts:  # nothing left running inside the hosts
            assert subprocess.run(["ip", "netns", "pids", host.netns], check=True, capture_output=True,
                                  text=True, timeout=10).stdout.strip() == ""
    finally:
        emulated.down(name)


@needs_torch
def test_a_host_that_never_joins_fails_the_run_within_the_timeout(
    cluster: emulated.Cluster, tmp_path: Path
) -> None:
    strategy = Strategy(framework="torch", mode="eager", parallel="dp", workers=2)
    start = time.monotonic()
    with pytest.raises(RunFailed, match=rf"rank 0 on {cluster.name}-h0 exited"):
        execute(short("gpt-tiny", 4), strategy, runs_dir=tmp_path, cluster=cluster.name,
                collective_timeout_s=5, timeout_s=120,
                extra_env={"SEXTANT_TEST_FAULT": "no-rendezvous-rank-1"})
    assert time.monotonic() - start < 45


@needs_torch
def test_the_interconnect_check_measures_the_link_between_hosts() -> None:
    """On a 1 Gbit/s link the all-reduce bus bandwidth between the hosts nears the link rate
    and the check warns against the 10 Gb/s rule; on loopback it would pass."""
    from sextant.checks import analyse
    from sextant.checks.suite import measure_interconnect

    name = _name("i")
    emulated.up(name, 2, emulated.Link(rate_bit_s=1e9))
    try:
        measured = measure_interconnect(2, max_bytes=16 * 2**20, timeout=120, cluster=name)
    finally:
        emulated.down(name)
    result = analyse.check_interconnect(measured, threshold_gbps=10.0)
    assert result.status == analyse.WARN
    assert 0.5 < result.measured <= 1.05  # Gb/s of bus bandwidth on a 1 Gbit/s link
    assert f"2 hosts of cluster {name}" in result.summary
