"""The sampler's verdict from the kernel's high-water mark, for growth between two samples."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sandbox_service.executor import memory

# Run in a fresh interpreter, lean like the zygote: a child's resident set at fork counts
# its parent's anonymous pages but not the file pages it has not touched, so from a parent
# holding large mapped libraries (pytest after torch) the estimate would read short.
GROW_AND_EXIT = """
import json, os, sys
from sandbox_service.executor import memory
half_mb, limit_mb = int(sys.argv[1]), int(sys.argv[2])
sampler = memory.TreeSampler(limit_mb, memory.resident_bytes())
pid = os.fork()
if pid == 0:  # writes and exits before any sample: what remains is wait4's high-water mark
    held = [b"x" * (half_mb << 20) for _ in range(2)]
    os._exit(len(held))
_, _, usage = os.wait4(pid, 0)
sampler.reaped(usage.ru_maxrss * 1024)
outcome = sampler.outcome()
print(json.dumps(outcome and [outcome.peak_mb, outcome.oom_killed, outcome.how]))
"""


def _grow_and_exit(half_mb: int, limit_mb: int) -> list | None:
    done = subprocess.run(
        [sys.executable, "-c", GROW_AND_EXIT, str(half_mb), str(limit_mb)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


@pytest.mark.parametrize(("half_mb", "over"), [(100, True), (40, False)])
def test_the_high_water_mark_counts(half_mb: int, over: bool) -> None:
    outcome = _grow_and_exit(half_mb, 128)
    assert outcome is not None and outcome[1] is over, outcome
    # at most what the child added: what it shared with its parent at the fork is left out,
    # and more (file pages a child has not touched are not in its resident set)
    assert half_mb <= outcome[0] <= 2 * half_mb + 16, outcome
    assert ("high-water" in outcome[2]) is over


def test_nothing_measured_is_no_outcome() -> None:
    sampler = memory.TreeSampler(128, memory.resident_bytes())
    sampler.reaped(1 << 20)  # smaller than what the parent holds
    assert sampler.outcome() is None
