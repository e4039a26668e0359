"""Slot uids are claimed per host: two services never share one (``executor.uids``)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import httpx
import pytest

from sandbox_service.executor import uids
from sandbox_service.service_process import LaunchError, start
from sandbox_service.settings import Settings

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="slot uids are used only as root")


def _base() -> int:
    return random.randrange(3_000_000, 4_000_000, 64)


def test_a_claimed_range_is_refused_or_moved_past_and_free_again_once_released() -> None:
    base = _base()
    first = uids.claim(base, 2, movable=False)
    with pytest.raises(uids.UidsInUse, match=rf"slot uid {base} \(uid_base {base}, 2 slots\)"):
        uids.claim(base, 2, movable=False)
    moved = uids.claim(base, 2, movable=True)
    assert moved.base == base + 2
    overlapping = uids.claim(base + 1, 2, movable=True)  # base+1 is held: the next range
    assert overlapping.base == base + 5
    for claim in (first, moved, overlapping):
        claim.release()
    uids.claim(base, 2, movable=False).release()


@root_only
def test_a_second_service_on_an_explicit_range_refuses_to_start(tmp_path: Path) -> None:
    base = _base()
    first = start(str(tmp_path / "a.log"), slots=1, preload="math", warmup="", uid_base=base)
    try:
        with pytest.raises(LaunchError, match="is in use by another sandbox service"):
            start(str(tmp_path / "b.log"), slots=1, preload="math", warmup="", uid_base=base,
                  ready_timeout_s=30)  # fmt: skip
        status = httpx.get(f"{first.url}/v1/status").json()  # the first one is untouched
        assert [s["uid"] for s in status["slots"]] == [base] and status["slots"][0]["pid"]
    finally:
        first.stop()


@root_only
def test_a_default_range_in_use_moves_to_the_next_free_one(tmp_path: Path) -> None:
    default = Settings.model_fields["uid_base"].default
    try:
        held = uids.claim(default, 2, movable=False)
    except uids.UidsInUse:
        pytest.skip("another service on this host holds the default slot uids")
    try:
        service = start(str(tmp_path / "s.log"), slots=2, preload="math", warmup="",
                        uid_base=None)  # fmt: skip
        try:
            status = httpx.get(f"{service.url}/v1/status").json()
            slot_uids = [s["uid"] for s in status["slots"]]
            assert slot_uids[0] >= default + 2 and slot_uids[1] == slot_uids[0] + 1
            assert "are in use by another service on this host" in service.log()
            ran = httpx.post(
                f"{service.url}/v1/execute", json={"code": "import os; print(os.getuid())"}
            )
            assert ran.json()["stdout"] in {f"{u}\n" for u in slot_uids}
        finally:
            service.stop()
    finally:
        held.release()
