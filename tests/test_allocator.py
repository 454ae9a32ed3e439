"""The worker's allocator setting (sextant.core.allocator): freed buffers stay with the
process, so a loop that allocates and frees the same buffers stops paying page faults."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from sextant.core import allocator

# A step's pattern: 40 buffers of 1 MiB written and freed, five times; the page faults of
# the last four rounds (the first one grows the heap in any case).
PATTERN = """
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from sextant.core.allocator import keep_freed_memory
    print(keep_freed_memory(), file=sys.stderr)
def round_():
    bufs = [np.ones(1 << 18, dtype=np.float32) for _ in range(40)]
    del bufs
round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    round_()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")


def faults(mode: str, **env: str) -> int:
    out = subprocess.run([sys.executable, "-c", PATTERN, mode], capture_output=True, text=True,
                         timeout=60, check=True, env={"PATH": "/usr/bin:/bin", **env})
    return int(out.stdout)


@glibc
def test_kept_memory_stops_the_page_faults_of_a_repeated_step():
    default, kept = faults("default"), faults("keep")
    # 4 rounds x 40 MiB of fresh pages is ~40,000 faults when the heap is trimmed each round
    assert default > 5_000, f"glibc's defaults did not trim the heap here ({default} faults)"
    assert kept < default / 20, (kept, default)


@glibc
def test_system_and_preloaded_allocators_are_left_alone():
    assert faults("keep", SEXTANT_MALLOC="system") > 5_000
    got = allocator.keep_freed_memory({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"})
    assert got == "jemalloc (LD_PRELOAD)"
    assert allocator.current() == "jemalloc (LD_PRELOAD)"


def test_the_fingerprint_names_the_allocator():
    from sextant.measure.env import fingerprint

    allocator.keep_freed_memory({"SEXTANT_MALLOC": "system"})
    assert fingerprint()["allocator"].startswith(
        "glibc defaults" if platform.libc_ver()[0] == "glibc" else "system")
    json.dumps(fingerprint())
