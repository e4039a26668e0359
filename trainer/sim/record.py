"""Record the tool-latency distribution the simulation draws from, against a real service.

    python -m trainer.sim.record [--count 400] [--slots 2] [--url http://...] [--out PATH]

Starts an embedded ``sandbox-service serve`` (or uses ``--url``) and runs ``count`` programs
of a math-agent mix, each as one ``POST /v1/execute`` the way the trainer's tool calls go:
``repl`` mode, the trainer's default limits (10 s, 1 GiB). ``slots`` requests are in flight at
once, so a call never queues behind others: what is
measured is one call's round trip (HTTP, queue, fork, run, reap), as a rollout sees it.

The mix (``KINDS``, each kind exactly its share of ``count``): arithmetic, sympy (solve,
factor, integrate, primes), numpy linear algebra, brute-force searches, exact combinatorics,
programs that raise, and 1% that never end and are killed at the time limit. The weights are
ours, not measured from a policy's transcripts; the data file keeps them with the samples.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from sandbox_service.client import AsyncSandboxClient
from sandbox_service.models import ExecuteRequest, Mode
from sandbox_service.service_process import launch

DATA = Path(__file__).parent / "tool_latency.json"
TIMEOUT_S, MEMORY_MB = 10.0, 1024  # the trainer's defaults (tool.timeout_s, tool.memory_mb)


def _arithmetic(rng: random.Random) -> str:
    return f"{rng.randint(10, 999)} * {rng.randint(10, 999)} + {rng.randint(2, 99)}"


def _sympy(rng: random.Random) -> str:
    a, b, n = rng.randint(2, 40), rng.randint(-50, 50), rng.randint(2, 6)
    return rng.choice(
        [
            f"import sympy as sp\nx = sp.symbols('x')\nsp.solve(x**2 - {a}*x + {b}, x)",
            f"import sympy as sp\nx = sp.symbols('x')\nsp.factor(x**{n + 2} - {a}**{n + 2})",
            f"import sympy as sp\nx = sp.symbols('x')\nsp.integrate(sp.sin(x)**{n} * x, x)",
            f"import sympy as sp\n[p for p in sp.primerange({a * 1000}, {a * 1000 + 5000})][-3:]",
            f"import sympy as sp\nx, y = sp.symbols('x y')\n"
            f"sp.solve([x + y - {a}, x*y - {b}], [x, y])",
            f"import sympy as sp\nsp.nsimplify(sp.sqrt({a}) + sp.sqrt({a + 1}))**2",
        ]
    )


def _numpy(rng: random.Random) -> str:
    n = rng.choice([8, 32, 128, 256])
    return (
        f"import numpy as np\nA = np.random.default_rng({rng.randint(0, 99)}).random(({n}, {n}))\n"
        "float(np.linalg.det(A @ A.T + np.eye(len(A))))"
    )


def _search(rng: random.Random) -> str:
    limit = rng.choice([10**4, 10**5, 10**5, 10**6])
    return rng.choice(
        [
            f"sum(1 for n in range({limit}) if n % 7 == 3 and str(n) == str(n)[::-1])",
            f"max(n for n in range(2, {limit // 10}) "
            "if all(n % d for d in range(2, int(n**0.5) + 1)))",
            "import itertools\n"
            f"sum(1 for p in itertools.permutations(range({rng.randint(6, 9)})) if p[0] < p[-1])",
        ]
    )


def _exact(rng: random.Random) -> str:
    n = rng.randint(20, 200)
    return rng.choice(
        [
            f"from math import comb\ncomb({n}, {n // 3}) % 1000000007",
            f"from fractions import Fraction\nsum(Fraction(1, k) for k in range(1, {n}))",
            f"import math\nprint(math.factorial({n}) % 998244353)",
        ]
    )


def _raises(rng: random.Random) -> str:
    return rng.choice(
        [
            "print(undefined_name + 1)",
            f"{rng.randint(1, 9)} / 0",
            "def f(x):\n    return x +\nprint(f(1))",
            "import sympy as sp\nsp.solve(sp.symbols('x') ** 2 - 1, sp.symbols('y'))[0]",
            "[1, 2, 3][7]",
        ]
    )


def _never_ends(rng: random.Random) -> str:
    return rng.choice(["while True:\n    pass", "n = 0\nwhile n >= 0:\n    n += 1"])


KINDS: dict[str, tuple[float, Callable[[random.Random], str]]] = {
    "arithmetic": (0.30, _arithmetic),
    "sympy": (0.25, _sympy),
    "numpy": (0.08, _numpy),
    "search": (0.15, _search),
    "exact": (0.10, _exact),
    "raises": (0.11, _raises),
    "never_ends": (0.01, _never_ends),
}


def programs(count: int, seed: int) -> list[tuple[str, str]]:
    """``count`` (kind, code) pairs: each kind its weight's share (rounded), in random order."""
    rng = random.Random(seed)
    kinds = [kind for kind, (weight, _) in KINDS.items() for _ in range(round(weight * count))]
    rng.shuffle(kinds)
    return [(kind, KINDS[kind][1](rng)) for kind in kinds]


async def measure(url: str, count: int, seed: int, in_flight: int) -> list[dict[str, object]]:
    todo = list(programs(count, seed))
    samples: list[dict[str, object]] = []
    async with AsyncSandboxClient(url, concurrency=in_flight) as client:

        async def worker() -> None:
            while todo:
                kind, code = todo.pop(0)
                request = ExecuteRequest(
                    code=code, timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB, mode=Mode.repl
                )
                start = time.perf_counter()
                result = await client.execute(request)
                samples.append(
                    {
                        "kind": kind,
                        "status": result.status.value,
                        "latency_s": round(time.perf_counter() - start, 5),
                        "run_s": round(result.wall_time_s, 5),
                    }
                )

        await asyncio.gather(*(worker() for _ in range(in_flight)))
    return samples


def write_record(path: Path, record: dict[str, object]) -> None:
    """JSON with one sample a line, so that the file reads and diffs well."""
    head = {k: v for k, v in record.items() if k != "samples"}
    samples = record["samples"]
    assert isinstance(samples, list)
    lines = ",\n".join("  " + json.dumps(sample) for sample in samples)
    path.write_text(json.dumps(head, indent=1)[:-2] + ',\n "samples": [\n' + lines + "\n ]\n}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slots", type=int, default=2, help="slots of the embedded service")
    parser.add_argument("--url", help="a running service instead of an embedded one")
    parser.add_argument("--out", type=Path, default=DATA)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(launch(slots=args.slots)).url
        samples = asyncio.run(measure(url, args.count, args.seed, in_flight=args.slots))
    record = {
        "what": "round-trip seconds of single tool calls (POST /v1/execute, repl mode) "
        "against a sandbox service; see trainer/sim/record.py",
        "command": f"python -m trainer.sim.record --count {args.count} --seed {args.seed} "
        f"--slots {args.slots}",
        "recorded": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), "
        f"Python {platform.python_version()}",
        "service": "embedded" if args.url is None else "given url",
        "slots": args.slots,
        "mix": {kind: weight for kind, (weight, _) in KINDS.items()},
        "limits": {"timeout_s": TIMEOUT_S, "memory_mb": MEMORY_MB},
        "samples": samples,
    }
    write_record(args.out, record)
    latencies = sorted(float(s["latency_s"]) for s in samples)  # type: ignore[arg-type]
    print(
        f"{len(samples)} calls: p50 {latencies[len(latencies) // 2] * 1e3:.1f} ms, "
        f"p90 {latencies[int(len(latencies) * 0.9)] * 1e3:.1f} ms, max {latencies[-1]:.2f} s "
        f"-> {args.out}"
    )


if __name__ == "__main__":
    main()
