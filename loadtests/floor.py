"""The floor beside the service: as many floor processes as slots, started and driven as one.

``loadtests.floor_process`` says what one process does. A run writes ``n`` ``g`` tokens and one
``s`` per taking part process into the pipe they share, so that they split the executions as
slots pulling from one queue would, and finish together; it lasts from the first token to the
end of the last execution. ``preload=None`` is ``floor-light``: a bare CPython.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from loadtests.floor_process import recv, send

WARM = 4  # executions per process before each run, not counted


class FloorError(RuntimeError):
    pass


@dataclass(frozen=True)
class FloorRun:
    latencies: list[float]
    seconds: float
    wrong: int
    example: str


def environment() -> dict[str, str]:
    """As bare as a zygote's: the package's parent on the path, nothing of ours; one BLAS
    thread, as the service's executions and the naive baseline have (else a light child
    that imports numpy starts a thread per CPU)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONPATH": root,
            "PYTHONDONTWRITEBYTECODE": "1", "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # fmt: skip


class Floor:
    def __init__(self, processes: int, preload: list[str] | None, warmup: str = "") -> None:
        self.size = processes
        self.config = {"preload": preload, "warmup": warmup}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ready: list[dict[str, Any]] = []
        self._tokens_r, self._tokens_w = os.pipe()
        self._active = 0

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self) -> None:
        for _ in range(self.size):
            proc = subprocess.Popen(
                [sys.executable, "-m", "loadtests.floor_process", str(self._tokens_r)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=[self._tokens_r],
                env=environment(),
            )  # fmt: skip
            self.procs.append(proc)
            send(self._fd(proc, "in"), self.config)
        self.ready = [self._expect(proc, "ready") for proc in self.procs]
        failed = [f for r in self.ready for f in r.get("preload_failed", [])]
        if failed:
            self.stop()
            raise FloorError(f"preload failed in a floor process: {failed}")

    @staticmethod
    def _fd(proc: subprocess.Popen[bytes], which: str) -> int:
        stream = proc.stdin if which == "in" else proc.stdout
        assert stream is not None
        return stream.fileno()

    def _expect(self, proc: subprocess.Popen[bytes], op: str) -> dict[str, Any]:
        message = recv(self._fd(proc, "out"))
        if not isinstance(message, dict) or message.get("op") != op:
            self.stop()
            raise FloorError(f"floor process {proc.pid}: expected {op!r}, got {message!r}")
        return message

    def prepare(self, code: str, expected: str, active: int | None = None, warm: int = WARM) -> int:
        """Send the next run's program to every process and let each warm up; ``active``
        processes (default: all) take part. Returns how many do."""
        active = self.size if active is None else min(active, self.size)
        for i, proc in enumerate(self.procs):
            cmd = {"code": code, "expected": expected, "warm": warm, "active": i < active}
            send(self._fd(proc, "in"), cmd)
        for proc in self.procs:
            self._expect(proc, "warmed")
        self._active = active
        return active

    def go(self, n: int) -> FloorRun:
        """Run ``n`` executions of the prepared program over the taking part processes."""
        start = time.monotonic()
        os.write(self._tokens_w, b"g" * n + b"s" * self._active)
        done = [self._expect(proc, "done") for proc in self.procs[: self._active]]
        ends = [d["ended"] for d in done if d["ended"] is not None]
        latencies = [x for d in done for x in d["latencies"]]
        example = next((d["example"] for d in done if d["example"]), "")
        seconds = (max(ends) - start) if ends else 0.0
        return FloorRun(latencies, seconds, sum(d["wrong"] for d in done), example)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.close()  # its end of commands: it exits
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        self.procs = []
        for fd in (self._tokens_r, self._tokens_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._tokens_r = self._tokens_w = -1
