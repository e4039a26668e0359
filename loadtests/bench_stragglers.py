"""Stragglers: batches with hung programs, against the same batch without them and the ideal.

    python -m loadtests.bench_stragglers [--short 400] [--rounds 2] [--json F]

Two configurations of the embedded service, both started first, then measured in turn (the
order reversed every other round, so that the machine's noise hits both alike):

- ``one-per-core``: as before issue 31, one slot per core and no straggling
  (``slots = cores``, ``straggler_after_s = 0``);
- ``default``: the shipped defaults (4 slots per core; an execution past
  ``straggler_after_s`` gives its core to the next job).

Batches, each sent as one ``POST /v1/execute/batch``:

- ``short``: ``--short`` programs of the mixed workload (its timeouts left out);
- ``short+hung``: the same with 12 hung ones spread among them (8 ``while True: pass``, 4
  ``time.sleep(60)``), ``timeout_s`` 2;
- ``hung``: 16 ``while True: pass`` at ``timeout_s`` 1 (issue 31's side-by-side with
  SandboxFusion, which ran them all at once: 7.1/s there);
- ``rl-mix``: ``--short`` programs, 2 % spinning and 1 % sleeping (``timeout_s`` 2), the rest
  mixed.

Printed per configuration: wall time and exec/s of each batch (best of the rounds), and for
the batches with hangers the ratio to the ideal, the hung programs' timeout plus the short
programs' own batch time in the same configuration. Every answer is checked.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx

from loadtests.workloads import MIXED, Item, fails
from sandbox_service.service_process import ServiceProcess, start
from sandbox_service.settings import SLOTS_PER_CORE, usable_cpus

HUNG_TIMEOUT_S = 2.0


def spinning(timeout_s: float) -> Item:
    return fails("hung.spin", "while True:\n    pass", "timeout", None, timeout_s=timeout_s)


def sleeping(timeout_s: float) -> Item:
    return fails("hung.sleep", "import time\ntime.sleep(60)", "timeout", None, timeout_s=timeout_s)


def short_programs(count: int, seed: int) -> list[Item]:
    items: list[Item] = []
    for item in MIXED.items(count * 2, seed):
        if not item.kind.startswith("timeout") and len(items) < count:
            items.append(item)
    return items


def spread(base: list[Item], extra: list[Item], seed: int) -> list[Item]:
    """``base`` with ``extra`` put at random places among it."""
    rng = random.Random(seed)
    batch = list(base)
    for item in extra:
        batch.insert(rng.randrange(len(batch) + 1), item)
    return batch


def batches(short: int, seed: int = 0) -> dict[str, list[Item]]:
    plain = short_programs(short, seed)
    hung = [spinning(HUNG_TIMEOUT_S)] * 8 + [sleeping(HUNG_TIMEOUT_S)] * 4
    rl_spin, rl_sleep = round(short * 0.02), round(short * 0.01)
    rl_hung = [spinning(HUNG_TIMEOUT_S)] * rl_spin + [sleeping(HUNG_TIMEOUT_S)] * rl_sleep
    rl_base = short_programs(short - rl_spin - rl_sleep, seed + 1)
    return {
        "short": plain,
        "short+hung": spread(plain, hung, seed),
        "hung": [spinning(1.0)] * 16,
        "rl-mix": spread(rl_base, rl_hung, seed + 1),
    }


@dataclass
class Run:
    config: str
    batch: str
    size: int
    wall_s: float
    wrong: int

    @property
    def rate(self) -> float:
        return self.size / self.wall_s


def send(client: httpx.Client, url: str, items: list[Item]) -> Run:
    body = {"requests": [item.request for item in items]}
    began = time.perf_counter()
    response = client.post(f"{url}/v1/execute/batch", json=body)
    wall = time.perf_counter() - began
    response.raise_for_status()
    results = response.json()["results"]
    wrong = sum(not item.check(r) for item, r in zip(items, results, strict=True))
    return Run("", "", len(items), wall, wrong)


CONFIGS: dict[str, dict[str, Any]] = {
    "one-per-core": {"slots": usable_cpus(), "straggler_after_s": 0},
    "default": {},
}


def rounds(order: list[str], count: int) -> Iterator[list[str]]:
    for i in range(count):
        yield order if i % 2 == 0 else order[::-1]


def measure(
    services: dict[str, ServiceProcess], work: dict[str, list[Item]], count: int
) -> list[Run]:
    best: dict[tuple[str, str], Run] = {}
    with httpx.Client(timeout=600) as client:
        for order in rounds(list(services), count):
            for config in order:
                for name, items in work.items():
                    run = send(client, services[config].url, items)
                    run.config, run.batch = config, name
                    key = (config, name)
                    if key not in best or run.wall_s < best[key].wall_s:
                        best[key] = run
    return list(best.values())


def report(runs: list[Run]) -> list[dict[str, Any]]:
    by = {(r.config, r.batch): r for r in runs}
    rows = []
    for r in runs:
        row: dict[str, Any] = {"config": r.config, "batch": r.batch, "size": r.size,
                               "wall_s": round(r.wall_s, 3), "exec_per_s": round(r.rate, 1),
                               "wrong": r.wrong}  # fmt: skip
        if r.batch in ("short+hung", "rl-mix"):
            ideal = HUNG_TIMEOUT_S + by[(r.config, "short")].wall_s
            row["ideal_s"] = round(ideal, 3)
            row["vs_ideal"] = round(r.wall_s / ideal, 2)
        rows.append(row)
    return rows


def finish(rows: list[dict[str, Any]], json_path: str | None) -> int:
    """Write ``rows`` to ``json_path`` if given; the exit status: 1 if any answer was wrong."""
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if any(row["wrong"] for row in rows) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--slots", type=int, help="the default configuration's slots")
    parser.add_argument("--straggler-after-s", type=float, help="... and straggler_after_s")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    for name in ("slots", "straggler_after_s"):
        if getattr(args, name) is not None:
            CONFIGS["default"][name] = getattr(args, name)
    work = batches(args.short)
    cores = usable_cpus()
    print(f"{cores} cores; default: {SLOTS_PER_CORE * cores} slots", file=sys.stderr)
    with ExitStack() as stack, tempfile.TemporaryDirectory() as logs:
        services = {}
        for name, settings in CONFIGS.items():
            service = start(os.path.join(logs, f"{name}.log"), **settings)
            stack.callback(service.stop)
            services[name] = service
        rows = report(measure(services, work, args.rounds))
    print(f"{'config':<14}{'batch':<12}{'n':>5}{'wall s':>9}{'exec/s':>9}{'ideal s':>9}"
          f"{'x ideal':>9}{'wrong':>7}")  # fmt: skip
    for row in rows:
        print(f"{row['config']:<14}{row['batch']:<12}{row['size']:>5}{row['wall_s']:>9.2f}"
              f"{row['exec_per_s']:>9.1f}{row.get('ideal_s', ''):>9}{row.get('vs_ideal', ''):>9}"
              f"{row['wrong']:>7}")  # fmt: skip
    return finish(rows, args.json)


if __name__ == "__main__":
    sys.exit(main())
