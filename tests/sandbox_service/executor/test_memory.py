"""The sampler's verdict from the kernel's high-water mark, for growth between two samples."""

from __future__ import annotations

import os

import pytest

from sandbox_service.executor import memory


def _grow_and_exit(mb: int, limit_mb: int) -> memory.TreeSampler:
    """A forked child that writes ``mb`` MiB and exits before any sample: what remains is
    ``wait4``'s high-water mark."""
    sampler = memory.TreeSampler(limit_mb, memory.resident_bytes())
    pid = os.fork()
    if pid == 0:
        held = [b"x" * (mb << 20) for _ in range(2)]
        os._exit(len(held))
    _, _, usage = os.wait4(pid, 0)
    sampler.reaped(usage.ru_maxrss * 1024)
    return sampler


@pytest.mark.parametrize(("half_mb", "over"), [(100, True), (40, False)])
def test_the_high_water_mark_counts(half_mb: int, over: bool) -> None:
    outcome = _grow_and_exit(half_mb, 128).outcome()
    assert outcome is not None and outcome.oom_killed is over, outcome
    # at most what the child added: what it shared with its parent at the fork is left out,
    # and more (file pages a child has not touched are not in its resident set)
    assert half_mb <= outcome.peak_mb <= 2 * half_mb + 16, outcome
    assert ("high-water" in outcome.how) is over


def test_nothing_measured_is_no_outcome() -> None:
    sampler = memory.TreeSampler(128, memory.resident_bytes())
    sampler.reaped(1 << 20)  # smaller than what the parent holds
    assert sampler.outcome() is None
