"""`sextant cluster up | down | status | link`: an emulated cluster of hosts on this machine,
each a network namespace behind a shaped link (see sextant.cluster.emulated)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from sextant.cluster import emulated, ray_lab, slurm_lab
from sextant.core.display import console

DEFAULT_NAME = "sx"


def register(sub: Any) -> None:
    p = sub.add_parser("cluster", help="an emulated cluster on this machine: hosts in network "
                                       "namespaces behind shaped links",
                       description="Create, inspect and remove emulated clusters: one network "
                                   "namespace per host, links shaped with tc. Runs take "
                                   "--cluster NAME. Needs root and iproute2.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True, parser_class=type(p))
    up = verbs.add_parser("up", help="create a cluster")
    up.add_argument("name", nargs="?", default=DEFAULT_NAME,
                    help=f"cluster name, 1-8 letters/digits (default: {DEFAULT_NAME})")
    up.add_argument("--hosts", type=int, default=2, help="emulated hosts (default: 2)")
    up.add_argument("--link", default="10gbit",
                    help="rate of every host's link, each direction: 100mbit, 1gbit, 10gbit, "
                         "... or none for unshaped (default: 10gbit)")
    up.add_argument("--latency", default="0us",
                    help="one-way host-to-host latency, e.g. 50us (needs the kernel's netem)")
    up.add_argument("--loss", type=float, default=0.0,
                    help="packet loss probability per link direction (needs netem)")
    up.add_argument("--slurm", action="store_true",
                    help="also run Slurm on it: slurmctld on the first host, slurmd on every "
                         "host (needs Debian's slurm-wlm and munge)")
    up.add_argument("--ray", action="store_true",
                    help="also run Ray on it: the head on the first host, a worker node on "
                         "every other host (runs then take --launcher ray)")
    up.set_defaults(func=cmd_up)
    down = verbs.add_parser("down", help="remove a cluster and everything it created")
    down.add_argument("name", nargs="?", default=DEFAULT_NAME)
    down.set_defaults(func=cmd_down)
    status = verbs.add_parser("status", help="the clusters that exist, their hosts and links")
    status.set_defaults(func=cmd_status)
    link = verbs.add_parser("link", help="take a host's link down or up (fault injection)")
    link.add_argument("name")
    link.add_argument("host", help="host name (e.g. sx-h1) or index")
    link.add_argument("state", choices=("up", "down"))
    link.set_defaults(func=cmd_link)


def cmd_up(args: argparse.Namespace) -> int:
    link = emulated.Link(rate_bit_s=emulated.parse_rate(args.link),
                         latency_s=emulated.parse_latency(args.latency), loss=args.loss)
    if args.slurm:
        slurm_lab.require()
    if args.ray:
        ray_lab.ray_executable()
    cluster = emulated.up(args.name, args.hosts, link)
    conf, ray = None, None
    try:
        if args.slurm:
            conf = slurm_lab.start(cluster)
        if args.ray:
            ray = ray_lab.start(cluster)
    except BaseException:
        emulated.down(cluster.name)
        raise
    out = console()
    out.print(f"cluster {cluster.name}: {len(cluster.hosts)} hosts, links {link.describe()}",
              markup=False)
    out.print(_hosts_table(cluster))
    if conf is not None:
        out.print(f"Slurm is up: export SLURM_CONF={conf}, then "
                  f"sextant run --launcher slurm ...", markup=False)
    if ray is not None:
        out.print(f"Ray {ray['version']} is up: head at {ray['address']}, "
                  f"{ray['nodes']} nodes of {ray['cpus_per_node']} CPU(s); sextant run "
                  f"--launcher ray ...", markup=False)
    out.print(f"run on it with --cluster {cluster.name}; remove it with "
              f"'sextant cluster down {cluster.name}'", markup=False)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    removed = emulated.down(args.name)
    console().print(f"cluster {args.name}: removed {len(removed)} namespaces" if removed
                    else f"cluster {args.name}: nothing to remove", markup=False)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    emulated.require_tools()
    out = console()
    found = emulated.names()
    if not found:
        out.print("no emulated cluster; 'sextant cluster up' creates one", markup=False)
        return 0
    for name in found:
        cluster = emulated.load(name)
        out.print(f"cluster {name}: {len(cluster.hosts)} hosts, links "
                  f"{cluster.link.describe()}, created {cluster.created_at}", markup=False)
        out.print(_hosts_table(cluster, emulated.link_states(cluster)))
        if slurm_lab.conf_path(cluster).exists():
            out.print(f"Slurm: SLURM_CONF={slurm_lab.conf_path(cluster)}", markup=False)
        ray = ray_lab.record(name)
        if ray is not None:
            alive = ray_lab.alive_nodes(cluster, ray["address"])
            out.print(f"Ray {ray['version']}: head at {ray['address']}, "
                      f"{alive if alive is not None else 'no answer:'} of {ray['nodes']} "
                      f"nodes alive", markup=False)
    return 0


def cmd_link(args: argparse.Namespace) -> int:
    cluster = emulated.load(args.name)
    emulated.set_link(cluster, args.host, args.state)
    console().print(f"cluster {cluster.name}: {args.host} link {args.state}", markup=False)
    return 0


def _hosts_table(cluster: emulated.Cluster, states: dict[str, str] | None = None) -> Table:
    table = Table(header_style="bold")
    for col in ("host", "address", "namespace", *(("link",) if states else ())):
        table.add_column(col)
    for host in cluster.hosts:
        row = [host.name, host.address, host.netns]
        if states:
            row.append(states.get(host.name, "?"))
        table.add_row(*row)
    return table
