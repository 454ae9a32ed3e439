"""Which collectives data parallelism issues per optimizer step, and the bytes they move.

The one table that the planner (sextant.planner.comms, estimate) and the measured runs'
"bytes sent" (sextant.measure.comm) both read, each with its own schedule. Ring bytes use the
nccl-tests bus-bandwidth factors (doc/PERFORMANCE.md: busbw = algbw * 2(n-1)/n for
all-reduce, (n-1)/n for all-gather and reduce-scatter). numpy only, broadcasting over arrays
of layouts.
"""

from __future__ import annotations

import numpy as np


def bus_factor(collective: str, n):
    """nccl-tests bus-bandwidth factor: busbw = algbw * factor."""
    n = np.asarray(n, dtype=np.float64)
    if collective == "all_reduce":
        return 2.0 * (n - 1.0) / n
    if collective in ("all_gather", "reduce_scatter"):
        return (n - 1.0) / n
    raise ValueError(f"unknown collective {collective!r}")


def _arr(x):
    return np.asarray(x, dtype=np.float64)


# The one description of the data-parallel collectives per optimizer step, used by the planner
# (sextant.planner.estimate) and by the measured runs' "bytes sent" (sextant.measure.comm). Per step with
# m micro-batches, counted in collectives over the whole gradient (reduce) or parameter
# (gather) payload of the rank:
#
#   schedule        ZeRO-0    ZeRO-1         ZeRO-2              ZeRO-3 / FSDP
#   "zero"          AR 1      RS 1 + AG 1    RS m + AG 1         RS m + AG 2m
#   "torch"         AR 1      AR 1 + AG 1    RS m + AG m         RS m + AG 2m
#   "torch-no-sync" AR 1      AR 1 + AG 1    RS 1 + AG m         RS 1 + AG 2m
#
# "zero": the ZeRO paper §7 and its implementations (DeepSpeed, Megatron's distributed
# optimizer, which reduce-scatters the fp32 main gradients and all-gathers the bf16
# parameters); sharded gradients must be reduced every micro-batch. "torch": DDP (gradients
# reduced once per step under no_sync), ZeroRedundancyOptimizer over DDP (a full all-reduce,
# then each rank broadcasts its updated shard: all-reduce + all-gather volume), FSDP2 with
# reshard_after_forward=False for ZeRO-2 (parameters gathered each forward, resharded after
# backward) and per-micro-batch gradient reduce-scatter as torchtitan runs it.
# "torch-no-sync": what sextant's own backends issue (set_requires_gradient_sync(False) on all
# but the last micro-batch: one reduce-scatter per step; JAX's compiled steps count the same
# collectives, docs/methodology.md: zero1 and zero2 all-gather + all-reduce on CPU, where XLA
# lowers the reduce-scatter to an all-reduce and a slice).
DP_SCHEDULES = ("zero", "torch", "torch-no-sync")


def dp_collectives(zero, microbatches, schedule: str = "zero") -> dict[str, np.ndarray]:
    """Collectives per optimizer step over the full payload: {'all_reduce', 'reduce_scatter'}
    of the gradients and {'all_gather'} of the parameters (counts, broadcasting over arrays)."""
    if schedule not in DP_SCHEDULES:
        raise ValueError(f"unknown data-parallel schedule {schedule!r}")
    zero = np.asarray(zero)
    m = np.asarray(microbatches, dtype=np.float64)
    z0 = (zero == 0).astype(np.float64)
    z1 = (zero == 1).astype(np.float64)
    z2 = (zero == 2).astype(np.float64)
    z3 = (zero >= 3).astype(np.float64)
    reduce_each = m if schedule != "torch-no-sync" else 1.0
    if schedule == "zero":
        ar, rs, ag_z2 = z0, z1 + (z2 + z3) * m, np.ones_like(m)
    else:
        ar, rs, ag_z2 = z0 + z1, (z2 + z3) * reduce_each, m
    ag = z1 + z2 * ag_z2 + z3 * 2.0 * m
    shape = np.broadcast(zero, m).shape
    return {
        "all_reduce": np.broadcast_to(ar, shape) * 1.0,
        "reduce_scatter": np.broadcast_to(rs, shape) * 1.0,
        "all_gather": np.broadcast_to(ag, shape) * 1.0,
    }


def dp_bytes_sent(zero, n, grad_payload, param_payload, microbatches=1, schedule="zero"):
    """Bytes one rank sends per step for data parallelism over n ranks (ring algorithms: the
    nccl-tests bus factors times the payload), per collective and in total."""
    counts = dp_collectives(zero, microbatches, schedule)
    out = {
        "all_reduce": counts["all_reduce"] * bus_factor("all_reduce", n) * _arr(grad_payload),
        "reduce_scatter": counts["reduce_scatter"]
        * bus_factor("reduce_scatter", n)
        * _arr(grad_payload),
        "all_gather": counts["all_gather"] * bus_factor("all_gather", n) * _arr(param_payload),
    }
    out["total"] = out["all_reduce"] + out["reduce_scatter"] + out["all_gather"]
    return out
