"""torch.profiler over steps 61-100 of every torch training process started with this
directory first on PYTHONPATH and SEXTANT_TORCH_PROBE=1: the profiler steps on a global
optimizer step hook, so sextant's worker and the expert loop are profiled the same way, and
writes the operator table (sorted by self CPU time) to /tmp/torchprobe-<pid>.txt. For issue
#20 (docs/benchmarks.md):

    SEXTANT_TORCH_PROBE=1 PYTHONPATH=benchmarks/torch_profile_probe:. sextant run \
        --workload benchmarks/expert/gpt-issue20.toml --framework torch --mode eager \
        --steps 150 --threads 2
    SEXTANT_TORCH_PROBE=1 PYTHONPATH=benchmarks/torch_profile_probe \
        python benchmarks/expert/torch_gpt.py --mode eager --steps 150 ...
"""

import os
import sys

if os.environ.get("SEXTANT_TORCH_PROBE") and "sextant.cli" not in " ".join(sys.argv):
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.profiler import ProfilerActivity, profile, schedule

    def _write(prof: profile) -> None:
        with open(f"/tmp/torchprobe-{os.getpid()}.txt", "w") as f:
            f.write(" ".join(sys.argv) + "\n")
            f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=60))

    _prof = profile(activities=[ProfilerActivity.CPU], on_trace_ready=_write,
                    schedule=schedule(wait=60, warmup=5, active=40, repeat=1))
    _prof.start()
    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: _prof.step())
    del torch
