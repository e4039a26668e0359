"""What a forked child costs, by what its parent holds: the figures behind the zygote's lean
start-up (issue 17).

Each variant is a fresh interpreter that imports the light zygote's preloads, then what the
variant names, freezes its heap as a zygote does and forks ``--n`` children, each of which
writes ``2`` to a pipe through ``sys.stdout`` and ``_exit``s. Printed per variant: wall time
and CPU (parent and children, user and system) per fork, the best of ``--rounds`` runs taken
in turn, so that the machine's noise moves every variant alike.

    python -m loadtests.fork_cost [--n 1000] [--rounds 3]

Variants: ``bare`` (the preloads only); ``threading`` and ``pyseccomp`` (what libseccomp's
bindings bring: their after-fork hooks run in every child); ``zygote`` (the zygote's own
modules); ``zygote+confined`` (and the child's confinement: session, rlimits, the slot uid
when root, no_new_privs and the seccomp filter; the namespaces are the zygote's, entered
once); ``streams-in-child`` (``bare``, but the child makes its own stdin, stdout and
stderr, as a zygote did before it made them once at start).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from sandbox_service.executor.imports import stdlib_only
from sandbox_service.settings import DEFAULT_PRELOAD

PRELOADS = ", ".join(stdlib_only(DEFAULT_PRELOAD))  # the light zygote's
ZYGOTE = "import sandbox_service.executor.zygote"
CONFINEMENT = """
from sandbox_service.executor import isolation as iso, seccomp_filter
program = seccomp_filter.Program(seccomp_filter.build_bpf_apart())
def confine():
    os.setsid()
    iso.set_limits(address_space=4 << 30, cpu_seconds=11, file_size=64 << 20,
                   open_files=256, processes=64 if os.getuid() == 0 else None)
    if os.getuid() == 0:
        iso.drop_to(61999, 61999)
    iso.die_with_parent()
    iso.set_dumpable(True)
    iso.no_new_privs()
    program.load()
"""
VARIANTS = {
    "bare": "",
    "threading": "import threading",
    "pyseccomp": "import pyseccomp",
    "zygote": ZYGOTE,
    "zygote+confined": ZYGOTE + CONFINEMENT,
    "streams-in-child": "",
}

CHILD = f"""
import gc, io, os, sys, time
import {PRELOADS}
{{imports}}
confine = globals().get("confine", lambda: None)
def streams():
    return (io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8"),
            io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8"),
            io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                             line_buffering=True))
made = None if {{in_child}} else streams()
gc.collect()
gc.freeze()
n = {{n}}
before, start = os.times(), time.perf_counter()
for _ in range(n):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(w, 1)
        confine()
        sys.stdin, sys.stdout, sys.stderr = made or streams()
        print(1 + 1)
        sys.stdout.flush()
        os._exit(0)
    os.close(w)
    os.read(r, 16)
    os.close(r)
    os.waitpid(pid, 0)
wall, after = time.perf_counter() - start, os.times()
cpu = sum(getattr(after, a) - getattr(before, a)
          for a in ("user", "system", "children_user", "children_system"))
print(wall / n * 1e6, cpu / n * 1e6)
"""


def measure(variant: str, n: int) -> tuple[float, float]:
    """(wall µs, CPU µs) per fork of one run of ``variant``."""
    program = CHILD.format(imports=VARIANTS[variant], in_child=variant == "streams-in-child", n=n)
    out = subprocess.run(
        [sys.executable, "-P", "-c", program], capture_output=True, text=True, check=True
    )
    wall, cpu = out.stdout.split()
    return float(wall), float(cpu)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.fork_cost", description=__doc__)
    p.add_argument("--n", type=int, default=1000, help="forks per run")
    p.add_argument("--rounds", type=int, default=3, help="runs per variant, taken in turn")
    args = p.parse_args(argv)
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            wall, cpu = measure(variant, args.n)
            old = best.get(variant, (float("inf"), float("inf")))
            best[variant] = (min(old[0], wall), min(old[1], cpu))
    print(f"{'variant':18} {'wall µs':>9} {'CPU µs':>9}  (per fork, best of {args.rounds})")
    for variant, (wall, cpu) in best.items():
        print(f"{variant:18} {wall:9.0f} {cpu:9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
