"""Programs built around the caller's code, and how their output is read back.

Three features need more than one plain execution gives: files read back after the program
(SandboxFusion's ``fetch_files``), notebook cells reported one by one (``/run_jupyter``), and
a session's earlier cells replayed before a new one (``session_id``). Each is one ordinary
execution of the driver (``cell_driver``): its code is the driver alone, its stdin the spec
(cells, each with its own stdin, and the nonce), which the driver reads only once the cells'
process is forked off, so no cell ever holds it. Nothing in the executor, the queue or the
workers knows about them, so they work unchanged on every worker of every node.
"""

from __future__ import annotations

import inspect
import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from sandbox_service import cell_driver

DRIVER_SOURCE = inspect.getsource(cell_driver)


def new_nonce() -> str:
    """The marker that separates the driver's reports from the cells' output: unguessable, so a
    program cannot forge a report by accident (on purpose it can only spoil its own)."""
    return f"\x00sbx-{secrets.token_hex(8)}\x00"


@dataclass(frozen=True)
class Cell:
    code: str
    mode: str = "script"
    stdin: str = ""


@dataclass(frozen=True)
class Program:
    """What one driver execution is sent: ``code`` and ``stdin`` of an ordinary request."""

    code: str
    stdin: str


DRIVER_CODE = (
    "_driver = {'__name__': 'sandbox_driver'}\n"
    f"exec(compile({DRIVER_SOURCE!r}, '<driver>', 'exec'), _driver)\n"
    "_driver['main']()\n"
)


def program(
    cells: list[Cell],
    nonce: str,
    *,
    replay: list[Cell] | None = None,
    fetch: list[str] | None = None,
    notebook: bool = False,
    cell_timeout_s: float = 0.0,
    seed: int | None = None,
) -> Program:
    """The code and stdin of one execution that runs the driver with this spec."""
    spec = {
        "nonce": nonce,
        "cells": [c.__dict__ for c in cells],
        "replay": [c.__dict__ for c in replay or []],
        "fetch": fetch or [],
        "notebook": notebook,
        "cell_timeout_s": cell_timeout_s,
        "seed": seed,
    }
    return Program(DRIVER_CODE, json.dumps(spec))


def _event(text: str) -> dict[str, Any] | None:
    try:
        event = json.loads(text)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


@dataclass
class Driven:
    """A driver execution's streams taken apart: each visible cell's stdout and stderr (a cell
    cut short by a limit has no report, and its output is the last segment) and the reports."""

    outputs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    cells: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    replay_failed: dict[str, Any] | None = None

    @property
    def stdout(self) -> str:
        return "".join(self.outputs)

    @property
    def stderr(self) -> str:
        return "".join(self.errors)


def parse(stdout: str, stderr: str, nonce: str) -> Driven:
    parts = stdout.split(nonce)
    if len(parts) % 2 == 0:  # cut inside a report (output limit): drop the partial report
        parts.pop()
    driven = Driven(outputs=parts[0::2], errors=stderr.split(nonce))
    for text in parts[1::2]:
        event = _event(text)
        if event is None:
            continue
        if "cell" in event:
            driven.cells.append(event)
        elif "files" in event:
            driven.files = event["files"]
        elif "replay_failed" in event:
            driven.replay_failed = event
    return driven
