"""The Ray driver of `sextant run --launcher ray`: `python -m sextant.launch.ray_driver`.

A process of its own, started by sextant.launch.ray_launcher, because a Ray driver must run
on a node of the cluster (`ray.init(address=HOST:PORT)` attaches to that node's raylet; a
`ray://` address goes through the head's Ray Client server and may run anywhere), and so that
`import ray` never enters the process that measures and stores the run.

It reads its order as one JSON object on stdin (the run's secret travels there, never in argv
or a file), checks that the cluster runs this Ray version, then:

- creates ONE placement group, one bundle per rank ({"CPU": cpus, "GPU": gpus}), STRICT_SPREAD
  when the cluster has a node per rank, SPREAD otherwise;
- starts one Ray task per bundle that runs sextant's own worker, `sextant join`, with the
  rank's environment (RANK, WORLD_SIZE, MASTER_ADDR = rank 0's node address, the collector's
  address and the secret): the same program every launcher starts;
- writes JSON lines on stdout: `placed` (each rank's node id, address and hostname), `exit`
  (a rank's exit code), `failed` (a rank's task or node lost, naming the node), `refused`
  (a cluster this driver must not use) and `error`.

Tasks are never retried (max_retries=0): a rank restarted alone would join nothing. On any
exit (end, SIGTERM from the launcher) it removes the placement group; Ray ends the job's
workers with the driver, and each rank dies with its worker (PR_SET_PDEATHSIG, see
sextant.launch.hosts.adopt_host).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from typing import Any

PLACE_TIMEOUT_S = 60.0
"""How long the placement group may wait for its bundles before the run fails."""
POLL_S = 0.5
CONNECT_TIMEOUT_S = 10.0


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def cluster_version(address: str) -> str | None:
    """The Ray version the cluster's head wrote in its GCS when it started (what `ray.init`
    itself compares), or None where it cannot be read before connecting (Ray Client)."""
    if address.startswith("ray://"):
        return None
    import socket

    host, _, port = address.rpartition(":")
    # Ray's own client waits about 40 s for a GCS that is not there; a refused or silent port
    # is known sooner.
    socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    from ray._common.usage.usage_lib import get_cluster_metadata
    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # not in its stub

    metadata = get_cluster_metadata(GcsClient(address=address))
    return str(metadata["ray_version"]) if metadata and "ray_version" in metadata else None


def run_rank(argv: list[str], env: dict[str, str], timeout_s: float) -> int:
    """Inside a Ray task: run one rank's `sextant join` to its end; its exit code. The rank
    dies with this worker process (SEXTANT_PARENT_PID), so a killed node or a cancelled job
    leaves no rank behind."""
    import os
    import subprocess

    python = argv[0] or sys.executable  # the node's interpreter, unless the order names one
    full = {**os.environ, **env, "SEXTANT_PARENT_PID": str(os.getpid())}
    proc = subprocess.Popen([python, *argv[1:]], env=full, stdin=subprocess.DEVNULL)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return -9
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _nodes(ray: Any, pg: Any) -> list[dict[str, str]]:
    """Each bundle's node: id, address and hostname."""
    from ray.util import placement_group_table

    by_id = {n["NodeID"]: n for n in ray.nodes()}
    table = placement_group_table(pg)["bundles_to_node_id"]
    out = []
    for i in range(len(table)):
        node = by_id.get(table[i], {})
        out.append({"node_id": str(table[i]), "address": str(node.get("NodeManagerAddress")),
                    "hostname": str(node.get("NodeManagerHostname"))})
    return out


def _describe(exc: BaseException) -> str:
    """The exception's name and first sentence (Ray's messages go on with advice)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    first = lines[0].split(". ")[0].rstrip(".")[:300] if lines else ""
    return f"{type(exc).__name__}: {first}".rstrip(": ")


def _terminate(*_: Any) -> None:
    raise SystemExit(143)  # unwinds through the finally blocks that remove the group


def main() -> int:
    signal.signal(signal.SIGTERM, _terminate)
    order = json.loads(sys.stdin.readline())
    address = order["address"]
    import ray

    try:
        theirs = cluster_version(address)
    except Exception as exc:  # no GCS there, or not one this Ray can speak to
        emit("refused", message=f"cannot reach the Ray head at {address}: {_describe(exc)}")
        return 3
    if theirs is not None and theirs != ray.__version__:
        emit("refused", message=f"the Ray cluster at {address} runs Ray {theirs}, this "
                                f"host {ray.__version__}; use the cluster's version here "
                                f"(pip install 'ray[train]=={theirs}')")
        return 3
    try:
        ray.init(address=address, _node_ip_address=order.get("node_ip"), namespace="sextant",
                 log_to_driver=False, logging_level="ERROR", configure_logging=False)
    except Exception as exc:  # Ray raises RuntimeError, ConnectionError and more
        emit("refused", message=f"cannot connect to the Ray cluster at {address}: "
                                f"{_describe(exc)}")
        return 3
    try:
        return _run(ray, order)
    finally:
        ray.shutdown()


def _run(ray: Any, order: dict[str, Any]) -> int:
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    world, cpus, gpus = int(order["world"]), float(order["cpus"]), float(order["gpus"])
    alive = [n for n in ray.nodes() if n.get("Alive")]
    bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    strategy = "STRICT_SPREAD" if len(alive) >= world else "SPREAD"
    pg = placement_group([dict(bundle) for _ in range(world)], strategy=strategy,
                         name=f"sextant-{order['label']}"[:120])
    try:
        ready, _ = ray.wait([pg.ready()], timeout=order.get("place_timeout_s", PLACE_TIMEOUT_S))
        if not ready:
            total = sum(n.get("Resources", {}).get("CPU", 0) for n in alive)
            emit("error", message=f"Ray could not place {world} bundle(s) of {bundle} "
                                  f"({strategy}) in {order.get('place_timeout_s', PLACE_TIMEOUT_S):g} s: the cluster "
                                  f"has {len(alive)} node(s) and {total:g} CPU(s)")
            return 4
        nodes = _nodes(ray, pg)
        emit("placed", strategy=strategy, nodes=nodes)
        task = ray.remote(run_rank)
        env = {**order["env"], "WORLD_SIZE": str(world), "MASTER_ADDR": nodes[0]["address"],
               "MASTER_PORT": str(order.get("master_port", 29500)),
               # One rank per bundle: Ray gives each task its own GPU (CUDA_VISIBLE_DEVICES),
               # so every rank is local rank 0 of a world of one on its share of the node.
               "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
        refs = {task.options(num_cpus=cpus, num_gpus=gpus, max_retries=0,
                             scheduling_strategy=PlacementGroupSchedulingStrategy(
                                 placement_group=pg, placement_group_bundle_index=r)).remote(
                    order["argv"], {**env, "RANK": str(r)}, float(order["timeout_s"])): r
                for r in range(world)}
        return _wait(ray, refs, nodes, time.monotonic() + float(order["timeout_s"]) + 30)
    finally:
        remove_placement_group(pg)


def _wait(ray: Any, refs: dict[Any, int], nodes: list[dict[str, str]], deadline: float) -> int:
    pending = list(refs)
    worst = 0
    while pending:
        if time.monotonic() > deadline:
            emit("error", message="the ranks' Ray tasks outlived the run's timeout")
            return 5
        done, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
        for ref in done:
            rank = refs[ref]
            node = nodes[rank]
            try:
                code = int(ray.get(ref))
            except Exception as exc:  # a task lost with its worker or its node
                # Ray raises NodeDiedError before the GCS marks the node dead.
                dead = type(exc).__name__ == "NodeDiedError" or any(
                    n["NodeID"] == node["node_id"] and not n.get("Alive") for n in ray.nodes())
                emit("failed", rank=rank, node=node, node_dead=dead,
                     message=_describe(exc))
                return 6
            emit("exit", rank=rank, code=code, node=node)
            worst = worst or code
    return 0 if worst == 0 else 7


if __name__ == "__main__":
    sys.exit(main())
