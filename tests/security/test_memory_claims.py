"""Issue 30, class 3: ``memory_limit`` means the limit was enforced, never "failed while large".

Each program below fills most of its limit (touching every page) and then fails in a way of its
own: it must be answered ``error`` (trainers mask or retry ``memory_limit``, so a program that
could claim it would escape its penalty). The controls reach the limit and must still be
``memory_limit``: the cgroup's OOM kill (or the sampler's) is what the parent saw. Both zygotes
of a slot; after each, every slot still answers correctly.
"""

from __future__ import annotations

import pytest

from sandbox_service.client import SandboxClient
from sandbox_service.models import Status
from tests.security.every_slot import ZYGOTES, assert_every_slot_answers, module_service

LIMIT_MB = 256
FILL = "block = bytearray(235 << 20)\nblock[::4096] = b'x' * len(block[::4096])\n"
CLAIMS = {
    "fill, then assert False": FILL + "assert False",
    "fill, then exit 3": FILL + "import sys\nsys.exit(3)",
    "fill, then raise MemoryError": FILL + "raise MemoryError('the limit, honestly')",
    "fill, then SIGKILL itself": FILL + "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    "a child fills and exits, then fail": (
        "import os\npid = os.fork()\nif pid == 0:\n"
        "    block = bytearray(235 << 20)\n    block[::4096] = b'x' * len(block[::4096])\n"
        "    os._exit(0)\nos.waitpid(pid, 0)\nraise ValueError('wrong answer')"
    ),
}
EARNED = {
    "growing to the limit": "x = []\nwhile True: x.append(' ' * 10**7)",
    "one allocation over the limit, touched": (
        "block = bytearray(400 << 20)\nblock[::4096] = b'x' * len(block[::4096])"
    ),
    "children over the limit together": (
        "import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n"
        "        b = bytearray(120 << 20); b[::4096] = b'x' * len(b[::4096])\n"
        "        time.sleep(1); os._exit(0)\nfor _ in range(3): os.wait()"
    ),
}

service, client = module_service("memory_claims")


@pytest.mark.parametrize("zygote", list(ZYGOTES))
@pytest.mark.parametrize("name", list(CLAIMS))
def test_failing_while_large_is_an_error(client: SandboxClient, zygote: str, name: str) -> None:
    r = client.execute(ZYGOTES[zygote] + CLAIMS[name], memory_mb=LIMIT_MB, timeout_s=20)
    assert r.status is Status.error, f"{name}: {r.status.value} {r.message!r} {r.peak_memory_mb}"
    assert r.peak_memory_mb >= 200, f"{name}: the program never filled its memory"
    assert_every_slot_answers(client, name)


@pytest.mark.parametrize("zygote", list(ZYGOTES))
@pytest.mark.parametrize("name", list(EARNED))
def test_the_limit_enforced_is_memory_limit(client: SandboxClient, zygote: str,
                                            name: str) -> None:  # fmt: skip
    r = client.execute(ZYGOTES[zygote] + EARNED[name], memory_mb=LIMIT_MB, timeout_s=20)
    assert r.status is Status.memory_limit, f"{name}: {r.status.value} {r.stderr[-300:]!r}"
    assert_every_slot_answers(client, name)
