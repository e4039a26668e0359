"""The fallbacks for what gVisor lacks, run on this kernel: waiting for a child without a
pidfd (SIGCHLD through a pipe), and the names start failures give a kernel's refusal."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from sandbox_service.executor import isolation as iso

WAIT_WITHOUT_PIDFD = textwrap.dedent("""
    import os, signal, time
    from sandbox_service.executor import monitor
    monitor.SigchldExit.install()
    # a grandchild's end (an orphan's, a subprocess's) wakes the watch but is not the child's
    pid = os.fork()
    if pid == 0:
        if os.fork() == 0:
            os._exit(0)
        time.sleep(0.3)
        os._exit(3)
    child = monitor.SigchldExit(pid)
    start = time.monotonic()
    seen = monitor.watch(child, {}, 10, start)
    assert seen.exited and seen.reason is None, seen
    assert seen.end - start < 30, seen.end - start
    _, status, _ = os.wait4(pid, 0)  # not reaped by the watch: status and usage are still there
    assert os.waitstatus_to_exitcode(status) == 3
    # a wakeup lost (its byte taken before the watch began): seen at the next tick all the same
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    time.sleep(0.2)
    try:
        os.read(monitor.SigchldExit.pipe[0], 512)
    except BlockingIOError:
        pass
    start = time.monotonic()
    seen = monitor.watch(monitor.SigchldExit(pid), {}, 10, start)
    assert seen.exited and seen.end - start < 2, seen
    os.wait4(pid, 0)
    # a forked child neither has the handler nor writes into the zygote's pipe
    r, w = os.pipe()
    if os.fork() == 0:
        ok = signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL and signal.set_wakeup_fd(-1) == -1
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    assert os.read(r, 1) == b"1"
    print("ok")
""")


def test_a_childs_end_without_a_pidfd() -> None:
    done = subprocess.run([sys.executable, "-c", WAIT_WITHOUT_PIDFD], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.stdout == "ok\n", done.stderr


def test_a_refusal_names_the_call_and_its_errno() -> None:
    said = str(iso.failure(22, f"prctl({iso.PRCTL_NAMES[iso.PR_SET_CHILD_SUBREAPER]})"))
    assert said.endswith("prctl(PR_SET_CHILD_SUBREAPER): EINVAL (Invalid argument)"), said
