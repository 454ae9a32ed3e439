"""Where each rank of a run lives: which host, at which address, started how.

A placement maps ranks to hosts, contiguously (host 0 holds ranks 0..k-1, and so on), as
torchrun and Slurm's block distribution do. The coordinator (torch's TCPStore, JAX's
coordination service, TensorFlow's chief) is rank 0, on host 0. Every rank listens on its
host's address only: loopback on one machine, the cluster interface across hosts.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sextant.core.errors import UserError
from sextant.core.fsutil import atomic_write_text

LOOPBACK = "127.0.0.1"
PRIVATE_PREFIX = "sextant-run-"
"""Network namespaces of single-host runs: sextant-run-<launcher pid>-<n>."""
NETNS_DIR = Path("/run/netns")
NETNS_ETC = Path("/etc/netns")
"""`ip netns exec NS` bind-mounts NETNS_ETC/NS/* over /etc (see write_netns_hosts)."""


@dataclass(frozen=True, slots=True)
class HostSlot:
    name: str
    address: str
    """Address the host's ranks bind to and are reached at."""
    prefix: tuple[str, ...] = ()
    """Command prefix that starts a process on the host (e.g. `ip netns exec NS`)."""
    hostname: str | None = None
    """Hostname the host's processes set in their own UTS namespace (emulated hosts)."""

    def env(self) -> dict[str, str]:
        """What a process on this host needs to know about it (see `adopt_host`)."""
        return {"SEXTANT_HOSTNAME": self.hostname} if self.hostname else {}


@dataclass(frozen=True, slots=True)
class Placement:
    hosts: tuple[HostSlot, ...]
    rank_host: tuple[int, ...]
    """Host index of every rank."""
    cluster: str | None = None
    """Emulated cluster name, when the hosts are namespaces on this machine."""

    @property
    def world(self) -> int:
        return len(self.rank_host)

    def host_of(self, rank: int) -> HostSlot:
        return self.hosts[self.rank_host[rank]]

    def address(self, rank: int) -> str:
        return self.host_of(rank).address

    @property
    def master_addr(self) -> str:
        return self.address(0)

    def local_rank(self, rank: int) -> int:
        return self.rank_host[:rank].count(self.rank_host[rank])

    def local_world(self, rank: int) -> int:
        return self.rank_host.count(self.rank_host[rank])

    @property
    def multi_host(self) -> bool:
        return len(set(self.rank_host)) > 1

    def to_dict(self) -> dict[str, object]:
        return {"cluster": self.cluster, "hosts": [h.name for h in self.hosts],
                "rank_host": list(self.rank_host),
                "addresses": [self.address(r) for r in range(self.world)]}


def single_host(world: int) -> Placement:
    return Placement(hosts=(HostSlot(name="localhost", address=LOOPBACK),),
                     rank_host=(0,) * world)


@contextlib.contextmanager
def private_loopback(world: int) -> Iterator[Placement]:
    """A single-host placement whose ranks run in a network namespace of their own that has
    only a loopback interface, so no rendezvous or collective listener of any framework
    (torch's TCPStore and gloo, JAX's gloo, TensorFlow's gRPC servers all bind the wildcard
    or the hostname's address by default) can be reached from the network while the run
    lasts. The hostname resolves to loopback inside it. Needs root and iproute2; elsewhere
    the ranks run in this machine's namespace, bound to loopback where the framework allows
    (see docs/reliability.md)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        yield single_host(world)
        return
    _remove_stale()
    name = f"{PRIVATE_PREFIX}{os.getpid()}-{next(_COUNTER)}"
    made = subprocess.run(["ip", "netns", "add", name], check=False, capture_output=True,
                          timeout=20).returncode == 0
    try:
        if not made or subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo",
                                       "up"], check=False, capture_output=True,
                                      timeout=20).returncode != 0:
            yield single_host(world)
            return
        write_netns_hosts(name, f"127.0.0.1\tlocalhost {socket.gethostname()}\n")
        yield Placement(hosts=(HostSlot(name="localhost", address=LOOPBACK,
                                        prefix=("ip", "netns", "exec", name)),),
                        rank_host=(0,) * world)
    finally:
        if made:
            delete_netns(name)


def write_netns_hosts(netns: str, text: str) -> None:
    """The /etc/hosts that `ip netns exec NETNS` bind-mounts over /etc/hosts."""
    atomic_write_text(NETNS_ETC / netns / "hosts", text)


def delete_netns(name: str) -> None:
    """Remove a named network namespace and its /etc/netns files (no error if absent)."""
    subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True, timeout=20)
    shutil.rmtree(NETNS_ETC / name, ignore_errors=True)


def _remove_stale() -> None:
    """Namespaces left by launchers that were SIGKILLed (their pid is gone)."""
    for path in NETNS_DIR.glob(f"{PRIVATE_PREFIX}*"):
        pid = path.name[len(PRIVATE_PREFIX):].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            delete_netns(path.name)


_COUNTER = itertools.count(1)


def blocks(world: int, hosts: int) -> tuple[int, ...]:
    """Contiguous blocks of ranks per host, the first hosts taking one more when uneven."""
    if world < hosts:
        raise UserError(f"{world} ranks cannot span {hosts} hosts; use at least {hosts} "
                        f"workers (one per host) or a cluster with fewer hosts")
    base, extra = divmod(world, hosts)
    out: list[int] = []
    for h in range(hosts):
        out += [h] * (base + (1 if h < extra else 0))
    return tuple(out)


def adopt_host() -> None:
    """Called first thing in every rank process: become a process of the host the launcher
    placed it on, and never outlive the launcher.

    - SEXTANT_HOSTNAME: set the hostname (the rank runs in its own UTS namespace), so that
      frameworks that resolve their own hostname (gloo does) find the host's address;
    - SEXTANT_PARENT_PID: ask the kernel to SIGKILL this process when the launcher dies, even
      by SIGKILL (Linux PR_SET_PDEATHSIG), and exit at once if it is already gone.
    """
    import os
    import socket

    name = os.environ.get("SEXTANT_HOSTNAME")
    if name and socket.gethostname() != name:
        socket.sethostname(name)
    parent = os.environ.get("SEXTANT_PARENT_PID")
    if parent:
        _die_with_parent(int(parent))


def _die_with_parent(parent: int) -> None:
    import ctypes
    import os
    import signal
    import sys

    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    else:  # no parent-death signal: a watchdog thread polls instead
        import threading
        import time

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, name="sextant-parent-watchdog", daemon=True).start()
    if os.getppid() != parent:  # the launcher died before the line above
        os._exit(1)
