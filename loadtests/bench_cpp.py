"""C++ sent as verl sends it: the compile cache against compiling every request.

    python -m loadtests.bench_cpp [--problems 3] [--cases 20] [--runs 200] [--naive-runs 20]

One run, one machine, reports:

1. A C++ problem of ``--cases`` test cases sent verl's way: one ``/run_code`` request per
   case, all at once, the same solution in each. Seconds per problem and compiles per problem
   (distinct compile reports), for a service with its compile cache and for one with the
   cache off (``compile_cache_mb=0``: every request compiles, as SandboxFusion and
   code-judge do). Each problem is a new solution (nothing cached across problems).
2. C++ executions per second of one solution on many inputs: the service with its cache,
   the service with it off, and bare ``g++`` then ``./main`` in a subprocess per request with
   no sandbox at all (the naive way, without even the isolation's cost), ``--slots``
   requests at a time.

The services start one after the other (never both at once) with ``--slots`` slots; every
answer is checked, and wrong ones are counted.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import httpx

from sandbox_service.service_process import ServiceProcess, start

# A contest-style solution: the whole standard library included, as most are.
SOLUTION = """#include <bits/stdc++.h>
using namespace std;
int main() {
    int n; cin >> n;
    vector<long long> a(n);
    for (auto& x : a) cin >> x;
    sort(a.begin(), a.end());
    long long best = 0;
    for (int i = 1; i < n; i++) best = max(best, a[i] - a[i - 1]);
    cout << best << "\\n";
}
// problem %d
"""


def case(i: int) -> tuple[str, str]:
    """(stdin, expected stdout) of test case ``i``."""
    values = [(i * 7919 + k * k * 31) % 1000 for k in range(50)]
    ordered = sorted(values)
    gap = max(b - a for a, b in itertools.pairwise(ordered))
    return f"{len(values)}\n{' '.join(map(str, values))}\n", f"{gap}\n"


@dataclass
class Figures:
    seconds: float
    n: int
    wrong: int
    compiles: int = 0

    @property
    def per_s(self) -> float:
        return self.n / self.seconds


def run_code(client: httpx.Client, url: str, code: str, stdin: str) -> dict[str, Any]:
    body = {"code": code, "language": "cpp", "stdin": stdin, "compile_timeout": 30,
            "run_timeout": 10, "memory_limit_MB": 1024}  # fmt: skip
    answer: dict[str, Any] = client.post(f"{url}/run_code", json=body).json()
    return answer


def send(url: str, jobs: list[tuple[str, str, str]], at_once: int) -> Figures:
    """``jobs`` of (code, stdin, expected), ``at_once`` in flight."""
    with (
        httpx.Client(timeout=600) as client,
        concurrent.futures.ThreadPoolExecutor(at_once) as pool,
    ):
        start_s = time.perf_counter()
        answers = list(pool.map(lambda job: run_code(client, url, job[0], job[1]), jobs))
        seconds = time.perf_counter() - start_s
    wrong = sum(
        a.get("status") != "Success" or a["run_result"]["stdout"] != expected
        for a, (_, _, expected) in zip(answers, jobs, strict=True)
    )
    compiles = len({(a.get("compile_result") or {}).get("execution_time") for a in answers})
    return Figures(seconds, len(jobs), wrong, compiles)


def problems(service: ServiceProcess, first: int, count: int, cases: int) -> list[Figures]:
    """``count`` problems of ``cases`` cases each, verl's way: all cases of one at once."""
    out = []
    for p in range(first, first + count):
        code = SOLUTION % p
        jobs = [(code, *case(i)) for i in range(cases)]
        out.append(send(service.url, jobs, at_once=cases))
    return out


def throughput(service: ServiceProcess, runs: int, at_once: int, problem: int) -> Figures:
    code = SOLUTION % problem
    send(service.url, [(code, *case(0))], 1)  # compiled (when cached) before the clock starts
    return send(service.url, [(code, *case(i)) for i in range(runs)], at_once)


def bare_compile_and_run(i: int) -> bool:
    """The naive way, without a sandbox: a fresh directory, g++, run, compare."""
    stdin, expected = case(i)
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "main.cpp"), "w") as f:
            f.write(SOLUTION % 10_000)
        subprocess.run(["g++", "-O2", "-std=c++17", "-pipe", "-o", "main", "main.cpp"],
                       cwd=work, check=True, capture_output=True)  # fmt: skip
        done = subprocess.run(["./main"], cwd=work, input=stdin, capture_output=True, text=True)
    return done.stdout == expected


def bare(runs: int, at_once: int) -> Figures:
    with concurrent.futures.ThreadPoolExecutor(at_once) as pool:
        start_s = time.perf_counter()
        right = list(pool.map(bare_compile_and_run, range(runs)))
        seconds = time.perf_counter() - start_s
    return Figures(seconds, runs, right.count(False))


def with_service(cache_mb: int, slots: int, log: str) -> ServiceProcess:
    return start(log, slots=slots, compile_cache_mb=cache_mb, max_timeout_s=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=3)
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--naive-runs", type=int, default=20)
    parser.add_argument("--slots", type=int, default=2)
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    logs = tempfile.mkdtemp(prefix="bench-cpp-")
    for name, cache_mb, runs in [("cache", 256, args.runs), ("no cache", 0, args.naive_runs)]:
        service = with_service(cache_mb, args.slots, os.path.join(logs, f"{cache_mb}.log"))
        try:
            problems(service, 1000, 1, 2)  # warm: first compile, first runs
            solved = problems(service, 0, args.problems, args.cases)
            runs_figures = throughput(service, runs, 2 * args.slots, 5000)
        finally:
            service.stop()
        results[name] = {"problems": solved, "throughput": runs_figures}
    naive = bare(args.naive_runs, args.slots)
    report(args, results, naive)


def report(args: argparse.Namespace, results: dict[str, dict[str, Any]], naive: Figures) -> None:
    print(f"C++ ({args.slots} slots; g++ -O2 -std=c++17; {os.cpu_count()} CPUs here)\n")
    print(f"1. a {args.cases}-test-case problem sent verl's way (one /run_code per case, "
          f"all at once), {args.problems} problems each")  # fmt: skip
    print("| service | s per problem (each) | compiles per problem | wrong |")
    print("|---|---|---|---|")
    for name, r in results.items():
        solved: list[Figures] = r["problems"]
        each = ", ".join(f"{f.seconds:.2f}" for f in solved)
        mean = sum(f.seconds for f in solved) / len(solved)
        compiles = sorted({f.compiles for f in solved})
        wrong = sum(f.wrong for f in solved)
        print(f"| {name} | {mean:.2f} ({each}) | {compiles} | {wrong} |")
    cached = sum(f.seconds for f in results["cache"]["problems"])
    uncached = sum(f.seconds for f in results["no cache"]["problems"])
    print(f"\nwithout the cache / with it: {uncached / cached:.1f}x the time per problem\n")
    print(f"2. C++ executions per second, {2 * args.slots} requests in flight "
          f"(bare: {args.slots})")  # fmt: skip
    print("| way | runs | s | exec/s | wrong |")
    print("|---|---|---|---|---|")
    rows = [("service, compile cache", results["cache"]["throughput"]),
            ("service, compile per request", results["no cache"]["throughput"]),
            ("bare g++ + ./main per request, no sandbox", naive)]  # fmt: skip
    for name, f in rows:
        print(f"| {name} | {f.n} | {f.seconds:.2f} | {f.per_s:.1f} | {f.wrong} |")
    base = results["cache"]["throughput"].per_s
    print(f"\ncache against compile-per-request: {base / rows[1][1].per_s:.0f}x (service), "
          f"{base / naive.per_s:.0f}x (bare)")  # fmt: skip


if __name__ == "__main__":
    main()
