"""The program that runs other programs: several cells in one sandboxed interpreter, then files.

This module is not imported by the service; ``programs.py`` sends its source, compiled under
the name ``<driver>``, as the code of an ordinary execution, with a spec (JSON, base64) saying
what to do. Inside the confined child it:

- runs each cell with the executor's own ``runner.run`` in one shared ``__main__`` namespace,
  so tracebacks, exit codes and repl display are exactly those of a plain execution;
- runs *silent* cells (a session's history, replayed) with stdout and stderr sent to
  ``/dev/null`` and each cell's own recorded stdin, stopping at the first that fails;
- can seed ``random`` and numpy first, so a replayed history draws the same numbers again;
- can give each visible cell a time limit (``SIGALRM`` raises ``TimeoutError`` in it), and
  collect what a notebook reports per cell: displayed values and the error;
- reads the requested files from the working directory once the cells are done.

What it reports besides the cells' own output travels on stdout as ``NONCE json NONCE``
events, and after each visible cell a bare ``NONCE`` marks the end of its stderr; the API
splits the streams at the nonce (a fresh random one per request). Only the standard library
and the runner are used: this runs after confinement, where nothing new can be installed.
"""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import sys
import traceback
import types
from typing import Any


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except InterruptedError:
            continue
        except OSError:
            return


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()  # type: ignore[union-attr]
        except Exception:  # a stream the cell closed or replaced must not stop the driver
            pass


def _emit(nonce: bytes, event: dict[str, Any]) -> None:
    _flush()
    _write_all(1, nonce + json.dumps(event).encode() + nonce)


class _Silenced:
    """stdout and stderr (the descriptors, so C-level writes too) go to /dev/null."""

    def __enter__(self) -> None:
        _flush()
        self.saved = (os.dup(1), os.dup(2))
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)

    def __exit__(self, *exc: object) -> None:
        _flush()
        for fd, saved in zip((1, 2), self.saved, strict=True):
            os.dup2(saved, fd)
            os.close(saved)


class _CellTimeout:
    """Raise TimeoutError in the running cell after ``seconds`` (0: no limit)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def _fire(self, signum: int, frame: object) -> None:
        raise TimeoutError(f"cell exceeded its time limit of {self.seconds:g} s")

    def __enter__(self) -> None:
        if self.seconds > 0:
            signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc: object) -> None:
        if self.seconds > 0:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)


def _error_of(status: int) -> list[dict[str, Any]]:
    """The notebook's ``error`` list for a cell that ended with ``status``."""
    exc = getattr(sys, "last_value", None)
    if exc is None:
        if status == 0:
            return []
        return [{"ename": "SystemExit", "evalue": str(status), "traceback": []}]
    tb = traceback.format_exception(type(exc), exc, getattr(sys, "last_traceback", None))
    return [{"ename": type(exc).__name__, "evalue": str(exc), "traceback": tb}]


def _seed(seed: int) -> None:
    import random

    random.seed(seed)
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed(seed % 2**32)


def _fresh_main() -> dict[str, Any]:
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    return main.__dict__


def _fetch(paths: list[str]) -> dict[str, str]:
    files = {}
    for path in paths:
        try:
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    files[path] = base64.b64encode(f.read()).decode()
        except (OSError, MemoryError):
            pass  # as SandboxFusion: what cannot be read is left out
    return files


def _run_cell(
    cell: dict[str, Any], namespace: dict[str, Any], notebook: bool, limit: float
) -> tuple[int, dict[str, Any]]:
    from sandbox_service.executor import runner

    shown: list[dict[str, str]] = []
    sys.last_type = sys.last_value = sys.last_traceback = None
    stdin = cell.get("stdin")
    real_stdin = sys.stdin
    if stdin is not None:
        sys.stdin = io.StringIO(stdin)
    # A notebook shows a final expression as a display entry; other cells print its repr.
    show = {"display": lambda value: shown.append({"text/plain": repr(value)})} if notebook else {}
    try:
        with _CellTimeout(limit):
            status = runner.run(cell["code"], cell["mode"], namespace, **show)
    finally:
        sys.stdin = real_stdin
    return status, {"display": shown, "error": _error_of(status) if notebook else []}


def _replay(cells: list[dict[str, Any]], namespace: dict[str, Any], nonce: bytes) -> bool:
    for index, cell in enumerate(cells):
        with _Silenced():
            status, _ = _run_cell(cell, namespace, False, 0)
        if status != 0:
            [error] = _error_of(status)
            _emit(nonce, {"replay_failed": index, "error": f"{error['ename']}: {error['evalue']}"})
            return False
    return True


def main(spec_b64: str) -> None:
    """Run the spec; exit with the last visible cell's status (0 for a notebook)."""
    spec = json.loads(base64.b64decode(spec_b64))
    nonce = spec["nonce"].encode()
    notebook = bool(spec.get("notebook"))
    namespace = _fresh_main()
    if spec.get("seed") is not None:
        _seed(int(spec["seed"]))
    status = 0
    if not _replay(spec.get("replay", []), namespace, nonce):
        _flush()
        os._exit(1)
    for index, cell in enumerate(spec["cells"]):
        status, report = _run_cell(cell, namespace, notebook, float(spec.get("cell_timeout_s", 0)))
        _emit(nonce, {"cell": index, "status": status, **report})
        _write_all(2, nonce)
    if spec.get("fetch"):
        _emit(nonce, {"files": _fetch(spec["fetch"])})
    _flush()
    os._exit(0 if notebook else status)
