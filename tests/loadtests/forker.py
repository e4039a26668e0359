"""A parent of four CPU-burning children, for the tests of per-process CPU accounting."""

from __future__ import annotations

import subprocess

# Forks four children that each burn 0.2 s of user CPU, reaps them, says so, and waits.
FORKER = """
import os, sys, time
sys.stdin.readline()
for _ in range(4):
    if os.fork() == 0:
        t = time.process_time()
        while time.process_time() - t < 0.2:
            sum(range(20000))  # user time: the clock is read (a system call) seldom
        os._exit(0)
    os.wait()
print("done", flush=True)
sys.stdin.readline()
"""


def run_forker(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "done\n"
