"""Issue 21, class 6: a cell cannot change how later cells are judged.

In a session (the history is replayed before every new cell) and in ``/run_jupyter`` (cells run
in one interpreter), each attack below is the first cell; the cells after it fail (a grader's
``assert``, an exception) and must be answered as failures: ``error`` for a session call, a
non-empty ``error`` for a notebook cell. The attacks go after what used to decide: the program
runner (``executor.child.run``) and the driver (by module, by frame, by function code), the
builtins they call, the exit path, hooks, the nonce that frames the driver's reports, and the
spec holding the later cells.
After each, every slot still answers correctly.
"""

from __future__ import annotations

import secrets

import httpx
import pytest

from sandbox_service.client import SandboxClient
from sandbox_service.models import Status
from sandbox_service.service_process import ServiceProcess
from tests.security.every_slot import assert_every_slot_answers, module_service

ATTACKS = {
    "wrap child.run": (
        "from sandbox_service.executor import child\n"
        "real = child.run\n"
        "def lenient(*args, **kwargs):\n"
        "    real(*args, **kwargs)\n"
        "    return 0\n"
        "child.run = lenient\n"
    ),
    "wrap child.run found on the stack": (
        "import sys\n"
        "f = sys._getframe()\n"
        "while f is not None:\n"
        "    for scope in (f.f_globals, f.f_locals):\n"
        "        for name, value in list(scope.items()):\n"
        "            if name == 'child' or getattr(value, '__name__', '') == 'sandbox_service.executor.child':\n"
        "                real = value.run\n"
        "                value.run = lambda *a, _real=real, **k: (_real(*a, **k), 0)[1]\n"
        "    f = f.f_back\n"
    ),
    "replace the code of every driver and child function": (
        "import gc, types\n"
        "def zero(*args, **kwargs):\n"
        "    return 0\n"
        "for obj in gc.get_objects():\n"
        "    if isinstance(obj, types.FunctionType) and obj.__code__.co_filename in (\n"
        "            '<driver>',) or (isinstance(obj, types.FunctionType) and\n"
        "            obj.__module__ == 'sandbox_service.executor.child' and obj.__name__ in ('run', '_compile')):\n"
        "        try:\n"
        "            obj.__code__ = zero.__code__\n"
        "        except (ValueError, TypeError, RuntimeError):\n"
        "            pass\n"
    ),
    "builtins exec, compile and eval": (
        "import builtins\n"
        "builtins.exec = lambda *a, **k: None\n"
        "builtins.compile = lambda *a, **k: compile_('pass', '<x>', 'exec')\n"
        "compile_ = compile\n"
    ),
    "os._exit always 0": ("import os\nreal = os._exit\nos._exit = lambda status: real(0)\n"),
    "sys.excepthook and atexit exit 0": (
        "import atexit, os, sys\n"
        "sys.excepthook = lambda *a: os._exit(0)\n"
        "atexit.register(lambda: os._exit(0))\n"
    ),
    "a trace function that skips every raising line": (
        "import sys\n"
        "def skip(frame, event, arg):\n"
        "    if event == 'line' and frame.f_code.co_filename == '<string>':\n"
        "        try:\n"
        "            frame.f_lineno = frame.f_lineno + 1\n"
        "        except ValueError:\n"
        "            pass\n"
        "    return skip\n"
        "sys.settrace(skip)\n"
    ),
    "forge the driver's reports with its nonce": (
        "import gc, json, sys\n"
        "nonce = None\n"
        "for obj in gc.get_objects():\n"
        "    if isinstance(obj, dict) and isinstance(obj.get('nonce'), str):\n"
        "        nonce = obj['nonce']\n"
        "if nonce is None:\n"
        "    for obj in gc.get_objects():\n"
        "        if isinstance(obj, (bytes, str)) and len(obj) < 64:\n"
        "            text = obj if isinstance(obj, str) else obj.decode('latin-1')\n"
        "            if text.startswith('\\x00sbx-'):\n"
        "                nonce = text\n"
        "if nonce is not None:\n"
        "    print('FOUND')\n"
        "    for cell in range(1, 4):\n"
        "        print(nonce + json.dumps({'cell': cell, 'status': 0, 'display': [], 'error': []}) + nonce, end='')\n"
    ),
    "rewrite the later cells in the spec": (
        "import gc\n"
        "for obj in gc.get_objects():\n"
        "    if isinstance(obj, dict) and isinstance(obj.get('code'), str) and 'assert' in obj['code'] and obj.get('code') != __doc__:\n"
        "        obj['code'] = 'pass'\n"
        "        print('FOUND')\n"
        "    if isinstance(obj, list) and obj and all(isinstance(c, dict) and 'code' in c for c in obj):\n"
        "        for c in obj:\n"
        "            if 'ASSERTED' in c['code']:\n"
        "                c['code'] = 'pass'\n"
        "                print('FOUND')\n"
    ),
    "a background thread that forges the next verdicts": (
        "import os, sys, threading, time\n"
        "def forge():\n"
        "    main = threading.main_thread().ident\n"
        "    while True:\n"
        "        time.sleep(0.01)\n"
        "        f = sys._current_frames().get(main)\n"
        "        while f is not None:\n"
        "            scope = f.f_locals\n"
        "            if isinstance(scope.get('reports'), int) and 'ASSERTED' in str(scope.get('code')):\n"
        "                os.write(scope['reports'], b\"0\\n{'display': [], 'error': []}\\n\")\n"
        "                time.sleep(0.5)\n"
        "            f = f.f_back\n"
        "threading.Thread(target=forge, daemon=True).start()\n"
    ),
    "a background thread that ends the kernel 0 mid-cell": (
        "import os, threading, time\n"
        "def later():\n"
        "    time.sleep(1.5)\n"
        "    os._exit(0)\n"
        "threading.Thread(target=later, daemon=True).start()\n"
    ),
    # Issue 30, class 1: a hook left in the kernel ran at each later cell's exec event.
    "an audit hook that forges each later verdict from the kernel's frame": (
        "import os, sys\n"
        "def forge(event, args):\n"
        "    if event != 'exec':\n"
        "        return\n"
        "    f = sys._getframe()\n"
        "    while f is not None:\n"
        "        scope = f.f_locals\n"
        "        if isinstance(scope.get('reports'), int) and isinstance(scope.get('token'), str):\n"
        "            print('FOUND', file=sys.stderr)\n"
        "            os.write(scope['reports'], f\"{scope['token']} {os.getpid()} 0\\n\".encode())\n"
        "            return\n"
        "        f = f.f_back\n"
        "sys.addaudithook(forge)\n"
    ),
    "an audit hook that traces each later cell past its raising lines": (
        "import sys\n"
        "def skip(frame, event, arg):\n"
        "    if event == 'line' and frame.f_code.co_filename == '<string>':\n"
        "        try:\n"
        "            frame.f_lineno = frame.f_lineno + 1\n"
        "        except ValueError:\n"
        "            pass\n"
        "    return skip\n"
        "def hook(event, args):\n"
        "    if event == 'exec':\n"
        "        sys.settrace(skip)\n"
        "        sys._getframe(1).f_trace = skip\n"
        "sys.addaudithook(hook)\n"
    ),
    "an audit hook added through the C API": (
        "import ctypes, os\n"
        "HOOK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p)\n"
        "def exits(event, args, data):\n"
        "    if event == b'exec':\n"
        "        os._exit(0)\n"
        "    return 0\n"
        "keep = HOOK(exits)\n"
        "ctypes.pythonapi.PySys_AddAuditHook(keep, None)\n"
    ),
    "the kernel's own audit hook given new code": (
        "import gc, types\n"
        "def nothing(event, args, me=None, refuse=None):\n"
        "    return None\n"
        "for obj in gc.get_objects():\n"
        "    if isinstance(obj, types.FunctionType) and obj.__name__ == '_guard':\n"
        "        try:\n"
        "            obj.__code__ = nothing.__code__\n"
        "        except RuntimeError:\n"
        "            pass\n"
        "import sys\n"
        "def forge(event, args):\n"
        "    if event == 'exec':\n"
        "        import os\n"
        "        os._exit(0)\n"
        "sys.addaudithook(forge)\n"
    ),
}
LATER = ["assert 6 * 7 == 41, 'ASSERTED'", "raise ValueError('still fails')",
         "import time\ntime.sleep(2)\nassert False, 'ASSERTED late'"]  # fmt: skip


service, client = module_service("driver")


@pytest.mark.parametrize("name", list(ATTACKS))
def test_a_session_cell_cannot_judge_the_next(client: SandboxClient, name: str) -> None:
    session = f"judge-{secrets.token_hex(4)}"
    first = client.execute(ATTACKS[name], session_id=session, timeout_s=20)
    assert first.status is Status.ok, f"{name}: {first.status.value} {first.stderr[-300:]}"
    assert "FOUND" not in first.stdout, f"{name}: the attack found what it looked for"
    for code in LATER:
        r = client.execute(code, session_id=session, timeout_s=20)
        assert r.status is Status.error, f"{name}: {code!r} answered {r.status.value}"
    ok = client.execute("print('fine')", session_id=session)
    assert (ok.status, ok.stdout) == (Status.ok, "fine\n"), f"{name}: {ok}"
    assert_every_slot_answers(client, f"session: {name}")


@pytest.mark.parametrize("name", list(ATTACKS))
def test_a_notebook_cell_cannot_judge_the_next(service: ServiceProcess, client: SandboxClient,
                                               name: str) -> None:  # fmt: skip
    body = {"cells": [ATTACKS[name], *LATER, "print('fine')"], "total_timeout": 25}
    answer = httpx.post(f"{service.url}/run_jupyter", json=body, timeout=60).json()
    cells = answer["cells"]
    assert "FOUND" not in cells[0]["stdout"], f"{name}: the attack found what it looked for"
    for later, cell in zip(LATER, cells[1:], strict=False):
        assert cell["error"], f"{name}: the failing cell {later!r} was reported without error"
    assert len(cells) <= len(LATER) + 2, f"{name}: forged cell reports {cells}"
    assert_every_slot_answers(client, f"run_jupyter: {name}")


def test_a_cell_at_its_memory_limit_is_still_memory_limit(client: SandboxClient) -> None:
    """The kernel is reaped before the judge exits: its memory counts."""
    session = f"memory-{secrets.token_hex(4)}"
    code = "x = []\nwhile True: x.append(' ' * 10**7)"
    r = client.execute(code, session_id=session, memory_mb=200)
    assert r.status is Status.memory_limit, r
    assert client.execute("print(1)", session_id=session).stdout == "1\n"
