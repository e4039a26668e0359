"""Workloads: streams of requests, each with the answer it must get, for the load generator.

A workload is a weighted set of templates; a template makes one ``Item`` (a native request and
what a correct answer looks like) from a random generator, so every answer is checked and no
two requests need be identical. Shipped: ``trivial``, ``sympy``, ``numpy``, ``mixed`` (the shape
of math tool calls: mostly short arithmetic, sympy and numpy, some errors, a few timeouts),
``adversarial`` (loops, memory bombs, floods, fork bombs, network attempts) and
``file:PATH`` (a user's JSONL of requests). Mixes are written ``trivial:3,sympy:1``.

Expected outputs are computed here with plain Python, never by running sympy or numpy in the
client, so the generator's CPU goes to sending requests.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from pydantic import ValidationError

from sandbox_service.models import ExecuteRequest

# What a program may end as; the rest are the service's verdicts and never a correct answer
# unless an item asks for them.
PROGRAM_STATUSES = frozenset({"ok", "error", "timeout", "memory_limit", "output_limit"})
EXPECTATION_KEYS = ("expected_stdout", "expected_status")


@dataclass(frozen=True)
class Item:
    """One request and what a correct answer to it is: a status among ``statuses`` and, when
    ``stdout`` is given, exactly that standard output."""

    kind: str
    request: dict[str, Any]
    stdout: str | None = None
    statuses: frozenset[str] = frozenset({"ok"})

    def check(self, result: dict[str, Any]) -> bool:
        if result.get("status") not in self.statuses:
            return False
        return self.stdout is None or result.get("stdout") == self.stdout


@dataclass(frozen=True)
class Context:
    """What templates may need to know about the target (the network probe aims at its port)."""

    port: int = 8000


Make = Callable[[random.Random, Context], Item]


@dataclass(frozen=True)
class Workload:
    """Weighted templates. ``unconfined_safe`` is False where running the items outside a
    sandbox (the naive baseline) would harm the host."""

    name: str
    templates: Sequence[tuple[float, Make]]
    unconfined_safe: bool = True
    ordered: bool = field(default=False)  # a file replays its lines in order

    def items(self, count: int, seed: int = 0, ctx: Context | None = None) -> Iterator[Item]:
        rng = random.Random(seed)
        ctx = ctx or Context()
        makers = [make for _, make in self.templates]
        if self.ordered:
            for make in itertools.islice(itertools.cycle(makers), count):
                yield make(rng, ctx)
            return
        weights = list(itertools.accumulate(w for w, _ in self.templates))
        for _ in range(count):
            yield rng.choices(makers, cum_weights=weights)[0](rng, ctx)

    def every_template(self, seed: int = 0, ctx: Context | None = None) -> list[Item]:
        """One item of each template: what a test runs to check every expectation once."""
        rng = random.Random(seed)
        return [make(rng, ctx or Context()) for _, make in self.templates]


def ok(kind: str, code: str, stdout: str, **fields: Any) -> Item:
    return Item(kind, {"code": code, **fields}, stdout)


def fails(kind: str, code: str, status: str, stdout: str | None = "", **fields: Any) -> Item:
    return Item(kind, {"code": code, **fields}, stdout, frozenset({status}))


# ----------------------------------------------------------------- trivial and arithmetic


def trivial_sum(rng: random.Random, _: Context) -> Item:
    n = rng.randint(100, 10_000)
    return ok("trivial.sum", f"print(sum(range({n})))", f"{n * (n - 1) // 2}\n")


def arith_expr(rng: random.Random, _: Context) -> Item:
    a, b, c = rng.randint(2, 10**6), rng.randint(2, 10**6), rng.randint(-999, 999)
    return ok("arith.expr", f"print({a} * {b} + {c})", f"{a * b + c}\n")


def arith_powmod(rng: random.Random, _: Context) -> Item:
    a, k, m = rng.randint(2, 10**9), rng.randint(10, 10**6), rng.randint(3, 10**9 + 7)
    return ok("arith.powmod", f"print(pow({a}, {k}, {m}))", f"{pow(a, k, m)}\n")


def arith_gcd(rng: random.Random, _: Context) -> Item:
    a, b = rng.randint(1, 10**12), rng.randint(1, 10**12)
    return ok("arith.gcd", f"import math\nprint(math.gcd({a}, {b}))", f"{math.gcd(a, b)}\n")


def arith_repl(rng: random.Random, _: Context) -> Item:
    a, b = rng.randint(2, 10**4), rng.randint(2, 10**4)
    return ok("arith.repl", f"x = {a}\ny = {b}\nx * y", f"{a * b}\n", mode="repl")


# ----------------------------------------------------------------- sympy

SYMPY = "import sympy as sp\nx = sp.Symbol('x')\n"


def sympy_solve(rng: random.Random, _: Context) -> Item:
    a, b = rng.sample(range(-20, 21), 2)
    code = f"{SYMPY}print(sorted(sp.solve(x**2 - ({a + b})*x + ({a * b}), x)))"
    return ok("sympy.solve", code, f"[{min(a, b)}, {max(a, b)}]\n")


def sympy_factor(rng: random.Random, _: Context) -> Item:
    a = rng.randint(2, 50)
    return ok("sympy.factor", f"{SYMPY}print(sp.factor(x**2 - {a * a}))", f"(x - {a})*(x + {a})\n")


def sympy_integrate(rng: random.Random, _: Context) -> Item:
    n = rng.randint(1, 12)
    return ok("sympy.integrate", f"{SYMPY}print(sp.integrate(x**{n}, x))", f"x**{n + 1}/{n + 1}\n")


def sympy_rational(rng: random.Random, _: Context) -> Item:
    a, b, c, d = (rng.randint(1, 99) for _ in range(4))
    code = f"import sympy as sp\nprint(sp.Rational({a}, {b}) + sp.Rational({c}, {d}))"
    return ok("sympy.rational", code, f"{Fraction(a, b) + Fraction(c, d)}\n")


# ----------------------------------------------------------------- numpy

NUMPY = "import numpy as np\n"


def numpy_sum(rng: random.Random, _: Context) -> Item:
    n = rng.randint(10, 100_000)
    return ok("numpy.sum", f"{NUMPY}print(int(np.arange({n}).sum()))", f"{n * (n - 1) // 2}\n")


def numpy_dot(rng: random.Random, _: Context) -> Item:
    n = rng.randint(10, 10_000)
    code = f"{NUMPY}a = np.arange({n})\nprint(int(a @ a))"
    return ok("numpy.dot", code, f"{(n - 1) * n * (2 * n - 1) // 6}\n")


def numpy_solve(rng: random.Random, _: Context) -> Item:
    a, b = rng.randint(-50, 50), rng.randint(-50, 50)
    code = (
        f"{NUMPY}m = np.array([[2.0, 0.0], [0.0, 4.0]])\n"
        f"print(np.linalg.solve(m, np.array([{2 * a}.0, {4 * b}.0])).round(6).tolist())"
    )
    return ok("numpy.solve", code, f"[{float(a)}, {float(b)}]\n")


def numpy_trace(rng: random.Random, _: Context) -> Item:
    n = rng.randint(2, 30)
    code = f"{NUMPY}a = np.arange({n * n}.0).reshape({n}, {n})\nprint(int(np.trace(a)))"
    return ok("numpy.trace", code, f"{sum(i * n + i for i in range(n))}\n")


# ----------------------------------------------------------------- errors and timeouts


def error_zero(rng: random.Random, _: Context) -> Item:
    return fails("error.zerodiv", f"print({rng.randint(1, 99)} / 0)", "error")


def error_name(_: random.Random, __: Context) -> Item:
    return fails("error.name", "print(undefined_name)", "error")


def error_syntax(_: random.Random, __: Context) -> Item:
    return fails("error.syntax", "def f(:\n    pass", "error")


def error_partial(rng: random.Random, _: Context) -> Item:
    n = rng.randint(1, 99)
    return fails("error.partial", f"print({n})\nraise ValueError('late')", "error", f"{n}\n")


def timeout_loop(_: random.Random, __: Context) -> Item:
    return fails("timeout.loop", "while True:\n    pass", "timeout", None, timeout_s=0.5)


def timeout_sleep(_: random.Random, __: Context) -> Item:
    return fails("timeout.sleep", "import time\ntime.sleep(30)", "timeout", None, timeout_s=0.5)


# ----------------------------------------------------------------- adversarial


# Refused at once, far beyond the limit: the program's own MemoryError (error) in the service,
# which sees no memory used (executor/judge.py); memory_limit where stderr decides (naive).
REFUSED = frozenset({"error", "memory_limit"})


def bomb_bytearray(_: random.Random, __: Context) -> Item:
    return Item("memory.bytearray", {"code": "b = bytearray(16 * 1024**3)"}, None, REFUSED)


def bomb_list(_: random.Random, __: Context) -> Item:
    code = "a = []\nwhile True:\n    a.append(' ' * 10**7)"
    return fails("memory.list", code, "memory_limit", None, memory_mb=256)


def bomb_numpy(_: random.Random, __: Context) -> Item:
    code = f"{NUMPY}a = np.ones((1024, 1024, 1024))"
    return Item("memory.numpy", {"code": code, "memory_mb": 512}, None, REFUSED)


def flood_stdout(_: random.Random, __: Context) -> Item:
    return fails("flood.stdout", "while True:\n    print('x' * 4096)", "output_limit", None)


def flood_stderr(_: random.Random, __: Context) -> Item:
    code = "import sys\nwhile True:\n    sys.stderr.write('y' * 4096)"
    return fails("flood.stderr", code, "output_limit", None)


def fork_bomb(_: random.Random, __: Context) -> Item:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    return fails("fork.bomb", code, "timeout", None, timeout_s=1.0)


def fork_until_refused(_: random.Random, __: Context) -> Item:
    # The process limit must refuse a fork long before the timeout; the children sleep on and
    # are killed with the process group.
    code = (
        "import os, time\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "except OSError:\n"
        "    print('refused')"
    )
    return ok("fork.limited", code, "refused\n", timeout_s=5.0)


def _network_probe(kind: str, attempt: str) -> Item:
    code = f"try:\n    {attempt}\n    print('connected')\nexcept Exception:\n    print('blocked')"
    return ok(kind, code, "blocked\n")


# Aimed at the service's own port on loopback: the one address an escape would surely reach.
def net_connect(_: random.Random, ctx: Context) -> Item:
    attempt = f"__import__('socket').create_connection(('127.0.0.1', {ctx.port}), timeout=1)"
    return _network_probe("net.connect", attempt)


def net_http(_: random.Random, ctx: Context) -> Item:
    url = f"http://127.0.0.1:{ctx.port}/healthz"
    attempt = f"__import__('urllib.request').request.urlopen({url!r}, timeout=1)"
    return _network_probe("net.http", attempt)


# ----------------------------------------------------------------- the shipped workloads

TRIVIAL = Workload("trivial", [(1, trivial_sum)])
SYMPY_WORKLOAD = Workload(
    "sympy", [(3, sympy_solve), (3, sympy_factor), (2, sympy_integrate), (2, sympy_rational)]
)
NUMPY_WORKLOAD = Workload(
    "numpy", [(3, numpy_sum), (3, numpy_dot), (2, numpy_solve), (2, numpy_trace)]
)
# Percent of calls: 35 arithmetic, 27 sympy, 20 numpy, 8 repl, 9 errors, 1 timeouts.
MIXED = Workload(
    "mixed",
    [
        (15, arith_expr), (10, arith_powmod), (10, arith_gcd), (8, arith_repl),
        (9, sympy_solve), (8, sympy_factor), (5, sympy_integrate), (5, sympy_rational),
        (6, numpy_sum), (6, numpy_dot), (4, numpy_solve), (4, numpy_trace),
        (3, error_zero), (2, error_name), (2, error_syntax), (2, error_partial),
        (0.5, timeout_loop), (0.5, timeout_sleep),
    ],
)  # fmt: skip
ADVERSARIAL = Workload(
    "adversarial",
    [
        (1, timeout_loop), (1, timeout_sleep), (1, bomb_bytearray), (1, bomb_list),
        (1, bomb_numpy), (1, flood_stdout), (1, flood_stderr), (1, fork_bomb),
        (1, fork_until_refused), (1, net_connect), (1, net_http),
    ],
    unconfined_safe=False,
)  # fmt: skip

SHIPPED = {w.name: w for w in (TRIVIAL, SYMPY_WORKLOAD, NUMPY_WORKLOAD, MIXED, ADVERSARIAL)}


class WorkloadError(ValueError):
    pass


def _file_item(line_no: int, data: object) -> Make:
    if not isinstance(data, dict):
        raise WorkloadError(f"line {line_no}: expected a JSON object, got {type(data).__name__}")
    request = {k: v for k, v in data.items() if k not in EXPECTATION_KEYS}
    try:
        ExecuteRequest.model_validate(request)
    except ValidationError as exc:
        raise WorkloadError(f"line {line_no}: not a valid request: {exc}") from None
    status = data.get("expected_status")
    if status is None:
        statuses = PROGRAM_STATUSES
    else:
        statuses = frozenset([status] if isinstance(status, str) else status)
    stdout = data.get("expected_stdout")
    item = Item(f"file.{line_no}", request, stdout, statuses)
    return lambda _rng, _ctx: item


def from_file(path: str) -> Workload:
    """A JSONL file: one native request a line, optionally with ``expected_stdout`` and
    ``expected_status`` (a status or a list). Without them, any status a program can end in
    counts as correct, and the service's own failures (internal_error, queue_timeout, ...)
    do not. Lines are replayed in order, cycling when the count is larger."""
    makers: list[tuple[float, Make]] = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{path} line {line_no}: not JSON: {exc}") from None
            makers.append((1.0, _file_item(line_no, data)))
    if not makers:
        raise WorkloadError(f"{path}: no requests in the file")
    return Workload(f"file:{path}", makers, unconfined_safe=True, ordered=True)


def parse(spec: str) -> Workload:
    """``mixed``, ``file:PATH`` or a weighted mix such as ``trivial:3,sympy:1``."""
    if spec.startswith("file:"):
        return from_file(spec[len("file:") :])
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise WorkloadError("empty workload")
    chosen: list[tuple[float, Workload]] = []
    for part in parts:
        name, _, weight = part.partition(":")
        if name not in SHIPPED:
            known = ", ".join([*SHIPPED, "file:PATH"])
            raise WorkloadError(f"unknown workload {name!r}; known: {known}")
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            raise WorkloadError(f"weight of {name!r} is not a number: {weight!r}") from None
        chosen.append((w, SHIPPED[name]))
    if len(chosen) == 1:
        return chosen[0][1]
    return mix(chosen, name=spec)


def mix(parts: Sequence[tuple[float, Workload]], name: str) -> Workload:
    """Each workload gets its weight, shared among its templates by their own weights."""
    templates: list[tuple[float, Make]] = []
    for weight, workload in parts:
        total = sum(w for w, _ in workload.templates)
        templates.extend((weight * w / total, make) for w, make in workload.templates)
    safe = all(w.unconfined_safe for _, w in parts)
    return Workload(name, templates, unconfined_safe=safe)
