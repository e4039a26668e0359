"""Which zygote a program forks from: the scan of its imports, and the service's routing."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_service.client import SandboxClient
from sandbox_service.executor.imports import imports_only_stdlib, stdlib_only
from sandbox_service.service_process import start

LIGHT = [
    "print(sum(range(1000)))",
    "import math, itertools as it\nprint(math.gcd(4, 6))",
    "from math import (gcd,\n    lcm)",
    "from collections.abc import Mapping",
    "import os.path",
    "from __future__ import annotations",
    "# important: nothing here imports\nprint(2)",
    "x = eval('2 + 3')",
]
FULL = [
    "import numpy as np",
    "import math, numpy",
    "x = 1; import sympy",
    "def f():\n    import scipy.linalg",
    "from sympy import *",
    "from . import helper",
    "import helper  # a file sent in `files`",
    "exec('import sympy')",
    "__import__('numpy')",
    "import importlib; importlib.import_module('math')",
    "print('import numpy')",  # a string counts: the scan may only err towards the full one
]


@pytest.mark.parametrize("code", LIGHT)
def test_stdlib_programs_go_light(code: str) -> None:
    assert imports_only_stdlib(code)


@pytest.mark.parametrize("code", FULL)
def test_anything_else_goes_full(code: str) -> None:
    assert not imports_only_stdlib(code)


def test_the_light_preloads_are_the_stdlib_part() -> None:
    assert stdlib_only(["numpy", "sympy", "math", "collections.abc", "json"]) == [
        "math",
        "collections.abc",
        "json",
    ]


def test_programs_run_on_the_zygote_their_imports_ask_for(client: SandboxClient) -> None:
    report = client.status()
    n = len(report.slots)
    assert [s.index for s in report.light_slots] == [n + i for i in range(n)]
    assert all(s.healthy for s in report.light_slots)
    light = client.execute("import sys; print('numpy' in sys.modules)")
    full = client.execute("import sys, numpy; print('sympy' in sys.modules)")
    assert light.stdout == "False\n" and int(light.worker.rsplit("/", 1)[1]) >= n
    # Nor what the zygote needed only at start (libseccomp's bindings bring threading and
    # subprocess, whose after-fork hooks every child would run).
    lean = client.execute(
        "import sys; print(sorted({'threading', 'subprocess'} & set(sys.modules)))"
    )
    assert lean.stdout == "[]\n", lean
    assert full.stdout == "True\n" and int(full.worker.rsplit("/", 1)[1]) < n
    # A light program that imports numpy after all still gets it (at the import's price).
    hidden = "import builtins\ngetattr(builtins, '__imp' + 'ort__')('numpy').ones(2).sum().item()"
    late = client.execute(hidden, mode="repl")
    assert late.stdout == "2.0\n" and int(late.worker.rsplit("/", 1)[1]) >= n


def test_light_zygotes_can_be_turned_off(tmp_path: Path) -> None:
    service = start(str(tmp_path / "service.log"), slots=1, preload="math,json,numpy",
                    warmup="", light_zygote=False)  # fmt: skip
    try:
        with SandboxClient(service.url) as client:
            assert client.status().light_slots == []
            assert client.execute("print(1)").worker.endswith("/0")
    finally:
        service.stop()
