"""A slot pool run as whoever starts it (an unprivileged uid: no pid namespace), whose
execution double-forks a sleeper and is then cut off mid-run; run by test_nonroot_leftovers.

    python -m tests.security.nonroot_pool WORK_ROOT PYTHON_PATH (kill|stop)

``kill``: SIGKILL the zygote by its pid, recover the slot, print the pids of the service and
its zygotes, wait for a line on stdin, stop. ``stop``: shut the pool down during the run.
Prints one JSON object per step on stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time

from sandbox_service.executor.pool import SlotPool
from sandbox_service.executor.protocol import Limits, RunSpec
from sandbox_service.executor.slot import SlotCrashed
from sandbox_service.settings import Settings

SLEEPER = ["sleep", "4242"]  # what the execution leaves behind: its cmdline names it
DOUBLE_FORK = f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", {SLEEPER!r})
    os._exit(0)
time.sleep(300)
"""


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


def sleeper_running() -> bool:
    """Whether a process of this uid runs the sleeper."""
    marker = ("\0".join(SLEEPER) + "\0").encode()
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == os.getuid():
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read() == marker:
                        return True
    return False


async def wait_for_sleeper() -> None:
    deadline = time.monotonic() + 30
    while not sleeper_running():
        if time.monotonic() > deadline:
            raise TimeoutError("the execution's sleeper never appeared")
        await asyncio.sleep(0.05)


async def main(work_root: str, python_path: str, mode: str) -> None:
    settings = Settings(slots=1, preload=[], warmup="", light_zygote=False,
                        work_root=work_root, python_path=[python_path])  # fmt: skip
    pool = SlotPool(settings)
    await pool.start()
    slot = pool.slots[0]
    if not slot.healthy:
        raise RuntimeError(f"the slot did not start: {slot.last_error}")
    spec = RunSpec(code=DOUBLE_FORK, limits=Limits(timeout_s=120, memory_mb=256))
    run = asyncio.create_task(slot.execute(spec))
    await wait_for_sleeper()
    say(step="running", pid=slot.pid)
    if mode == "stop":
        await pool.stop()
        await asyncio.gather(run, return_exceptions=True)
        say(step="stopped")
        return
    assert slot.pid is not None
    os.kill(slot.pid, signal.SIGKILL)
    try:
        await run
    except SlotCrashed as exc:
        say(step="crashed", why=str(exc))
    await slot.recover()
    say(step="recovered", service=os.getpid(), zygotes=[s.pid for s in pool.zygotes])
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await pool.stop()
    say(step="stopped")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
