"""What one allowed request can cost the API process: the figures behind issue 30's items 9
and 4.

``bomb``: while a body of tiny JSON values (``{"code": "print(1)", "x": [[], [], ...]}``,
``--bomb-mib`` MiB) is posted to ``/v1/execute``, ``/readyz`` is asked every 50 ms; printed:
the bomb's answer and time, the slowest ``/readyz``, the API process's peak RSS (VmHWM) and
its RSS after. ``escape``: ``--concurrent`` single requests at once, then one batch of
``--batch``, each program writing ``max_output_bytes`` of ``\\x01`` (six bytes each in JSON)
to stdout and to stderr; printed: bytes of the largest single response and of the batch's,
and the API process's peak RSS. Each starts its own embedded service.

    python -m loadtests.api_bounds [--bomb-mib 60] [--concurrent 64] [--batch 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import time
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event

import httpx

from sandbox_service.service_process import ServiceProcess, launch

CAP_CODE = "import os; n = {n}; os.write(1, b'\\x01' * n); os.write(2, b'\\x01' * n)"


def _rss(service: ServiceProcess) -> tuple[float, float]:
    """(peak, current) RSS of the API process in MiB."""
    fields = {}
    with open(f"/proc/{service.process.pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            fields[name] = value
    return int(fields["VmHWM"].split()[0]) / 1024, int(fields["VmRSS"].split()[0]) / 1024


def _poll(url: str, done: Event, slowest: Synchronized) -> None:  # type: ignore[type-arg]
    """In a process of its own, so that the client building the bomb does not slow it."""
    with httpx.Client(timeout=120) as client:
        while not done.is_set():
            start = time.monotonic()
            client.get(url)
            slowest.value = max(slowest.value, time.monotonic() - start)
            time.sleep(0.05)


def bomb(mib: int) -> None:
    count = mib * 1024 * 1024 // 3
    body = b'{"code": "print(1)", "x": [' + b"[]," * (count - 1) + b"[]]}"
    with launch(slots=1, max_timeout_s=30) as service:
        before = _rss(service)[1]
        done, slowest = multiprocessing.Event(), multiprocessing.Value("d", 0.0)
        poller = multiprocessing.Process(
            target=_poll, args=(service.url + "/readyz", done, slowest)
        )
        poller.start()
        time.sleep(1.0)
        idle = slowest.value
        start = time.monotonic()
        response = httpx.post(service.url + "/v1/execute", content=body, timeout=300)
        took = time.monotonic() - start
        time.sleep(0.5)
        done.set()
        poller.join()
        peak, after = _rss(service)
        print(f"bomb {len(body) / 2**20:.0f} MiB: answered {response.status_code} in {took:.2f} s;"
              f" slowest /readyz {slowest.value:.2f} s ({idle:.2f} s before the bomb); API RSS"
              f" {before:.0f} MiB before, peak {peak:.0f} MiB, {after:.0f} MiB after")  # fmt: skip


async def _escape(service: ServiceProcess, concurrent: int, batch: int, cap: int) -> None:
    code = CAP_CODE.format(n=cap)
    async with httpx.AsyncClient(timeout=600) as client:
        singles = await asyncio.gather(
            *(
                client.post(service.url + "/v1/execute", json={"code": code})
                for _ in range(concurrent)
            )
        )
        largest = max(len(r.content) for r in singles)
        statuses = {r.json()["status"] for r in singles}
        peak_single = _rss(service)[0]
        requests = [{"code": code} for _ in range(batch)]
        response = await client.post(service.url + "/v1/execute/batch", json={"requests": requests})
        results = response.json()["results"]
        trimmed = sum(r["stdout_truncated"] for r in results)
    peak, after = _rss(service)
    print(f"escape: {concurrent} single requests at once (statuses {sorted(statuses)}): largest"
          f" response {largest / 2**20:.2f} MiB, API peak {peak_single:.0f} MiB; batch of"
          f" {batch}: response {len(response.content) / 2**20:.1f} MiB ({trimmed} stdout"
          f" trimmed), API peak {peak:.0f} MiB, {after:.0f} MiB after")  # fmt: skip


def escape(concurrent: int, batch: int) -> None:
    with launch(slots=2, max_batch=max(batch, 1024)) as service:
        cap = int(service.settings.get("max_output_bytes", 256 * 1024))
        asyncio.run(_escape(service, concurrent, batch, cap))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bomb-mib", type=int, default=60)
    parser.add_argument("--concurrent", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--only", choices=["bomb", "escape"])
    args = parser.parse_args()
    if args.only != "escape":
        bomb(args.bomb_mib)
    if args.only != "bomb":
        escape(args.concurrent, args.batch)


if __name__ == "__main__":
    main()
