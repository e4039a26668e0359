"""Load-test a sandbox service: ``python -m loadtests --url URL | --launch [options]``.

    python -m loadtests --launch --workload mixed --count 2000 --concurrency 256 --batch 32 \\
        --baseline naive --baseline-count 200 --out runs/mixed

drives the target with ``--count`` requests of a workload, ``--concurrency`` executions in
flight at once in batches of ``--batch`` (1: single requests), for at most ``--duration``
seconds (plus ``--drain`` for answers still out), checks every answer, shows progress, and
writes report.json, summary.md and PNG plots into ``--out``. A baseline (another URL, or
``naive``: a fresh interpreter per call) runs after the target, never at the same time, and
the summary gives the ratios. ``--api codejudge`` (and ``--baseline-api``) sends code-judge's
``/run/long-batch`` instead of the native API: to code-judge itself, or to this service's
front for it, with the same client, payloads and batch shape. Exits 1 if any execution was
lost or wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx

from loadtests import report
from loadtests.cluster import Cluster
from loadtests.generator import Plan, Run, measure
from loadtests.procwatch import Watcher, listening_pid
from loadtests.targets import CodeJudgeTarget, HttpTarget, NaiveTarget, Target
from loadtests.workloads import Context, Workload, WorkloadError, parse
from sandbox_service.service_process import launch

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
APIS = ("native", "codejudge")


def http_target(url: str, api: str, label: str, timeout_s: float) -> HttpTarget:
    if api == "codejudge":
        return CodeJudgeTarget(url, f"{label} via /run/long-batch", timeout_s)
    return HttpTarget(url, label, timeout_s)


def arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtests",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running service, e.g. http://127.0.0.1:8000; several "
                       "API nodes of one deployment separated by commas")  # fmt: skip
    where.add_argument("--launch", action="store_true", help="start an embedded service")
    p.add_argument(
        "--slots",
        type=int,
        default=None,
        help="--launch: slots (per worker node with --redis-workers; default: CPUs)",
    )
    p.add_argument(
        "--redis-workers",
        type=int,
        default=0,
        metavar="M",
        help="--launch: Redis mode, a throwaway redis-server and M worker nodes",
    )
    p.add_argument("--api-nodes", type=int, default=1,
                   help="--launch --redis-workers: API nodes; lanes spread over them")  # fmt: skip
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="--launch: a service setting, e.g. max_queue_depth=200000")  # fmt: skip
    p.add_argument("--api", choices=APIS, default="native",
                   help="the API to send to: this service's native one, or code-judge's "
                        "/run/long-batch (code-judge itself, or our front for it)")  # fmt: skip
    p.add_argument("--workload", default="trivial",
                   help="trivial, sympy, numpy, mixed, adversarial, file:PATH, or a mix "
                        "such as trivial:3,sympy:1")  # fmt: skip
    p.add_argument("--count", type=int, default=1000, help="executions to send")
    p.add_argument("--concurrency", type=int, default=64, help="executions in flight at once")
    p.add_argument("--batch", type=int, default=1, help="requests per HTTP call (1: single)")
    p.add_argument("--duration", type=float, default=600.0, help="seconds to keep sending")
    p.add_argument("--drain", type=float, default=300.0,
                   help="seconds after --duration for answers still out (then: lost)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for one answer")
    p.add_argument("--warmup", type=int, default=20, help="executions sent first, not counted")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload's random choices")
    p.add_argument("--server-pid", type=int, action="append", default=[],
                   help="a process of the service to sample: the API process first, then any "
                        "worker processes (default: the one listening on the URL's port, "
                        "when it is on this machine)")  # fmt: skip
    p.add_argument("--scratch-dir", action="append", default=[], metavar="DIR",
                   help="a directory the service writes in (its work root, TMPDIR), to count "
                        "what is left there; --launch adds its own")  # fmt: skip
    p.add_argument("--sample-interval", type=float, default=1.0, help="seconds between samples")
    p.add_argument("--baseline", help="a second target run after the first: a URL, or 'naive'")
    p.add_argument("--baseline-api", choices=APIS, help="the baseline URL's API (default: --api)")
    p.add_argument("--baseline-count", type=int, help="executions for the baseline "
                   "(default: --count for a URL, at most 1000 for naive)")  # fmt: skip
    p.add_argument("--baseline-concurrency", type=int, help="default: --concurrency")
    p.add_argument("--baseline-batch", type=int, help="default: --batch")
    p.add_argument("--naive-parallel", type=int, default=None,
                   help="interpreters at once in naive mode (default: CPUs)")  # fmt: skip
    p.add_argument("--out", help="report directory (default: runs/<time>)")
    p.add_argument("--title", help="title of the summary")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    args = p.parse_args(argv)
    if args.redis_workers < 0 or args.api_nodes < 1:
        p.error("--redis-workers must be >= 0 and --api-nodes >= 1")
    if (args.redis_workers or args.api_nodes != 1) and not args.launch:
        p.error("--redis-workers and --api-nodes start a deployment: they need --launch")
    if args.api_nodes != 1 and not args.redis_workers:
        p.error("--api-nodes needs --redis-workers (the embedded service is one node)")
    return args


def settings_of(args: argparse.Namespace, work_root: str) -> dict[str, Any]:
    settings: dict[str, Any] = {"work_root": work_root}
    if args.slots:
        settings["slots"] = args.slots
    for pair in args.set:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set {pair!r}: expected NAME=VALUE")
        settings[name.strip()] = value.strip()
    return settings


@contextlib.contextmanager
def service(args: argparse.Namespace, out_dir: str) -> Iterator[tuple[str, list[int], list[str]]]:
    """The URL to test, the PIDs to sample and the directories to check for leftovers;
    with ``--launch``, of an embedded service started with a private work root and TMPDIR."""
    if not args.launch:
        yield args.url, args.server_pid, args.scratch_dir
        return
    with tempfile.TemporaryDirectory(prefix="loadtest-") as scratch:
        work_root, tmp = os.path.join(scratch, "work"), os.path.join(scratch, "tmp")
        os.makedirs(tmp)
        settings = settings_of(args, work_root)
        scratch_dirs = [*args.scratch_dir, work_root, tmp]
        if args.redis_workers:
            slots = settings.pop("slots", None) or max(
                1, (os.cpu_count() or 1) // args.redis_workers
            )
            print(f"starting Redis mode: {args.api_nodes} API node(s), {args.redis_workers} "
                  f"worker node(s) of {slots} slot(s) ({settings}); logs: {out_dir}",
                  file=sys.stderr)  # fmt: skip
            with Cluster(out_dir, args.api_nodes, args.redis_workers, slots, settings,
                         {"TMPDIR": tmp}) as cluster:  # fmt: skip
                yield ",".join(cluster.urls), cluster.pids, scratch_dirs
            return
        log = os.path.join(out_dir, "service.log")
        print(f"starting an embedded service ({settings}); log: {log}", file=sys.stderr)
        with launch(log_path=log, extra_env={"TMPDIR": tmp}, **settings) as svc:
            yield svc.url, [svc.process.pid], scratch_dirs


def first(url: str) -> str:
    """The first of several API nodes' URLs (comma-separated): where status is asked."""
    return url.split(",")[0].strip()


def local_pid(url: str) -> int | None:
    parts = urlsplit(first(url))
    if parts.hostname not in LOOPBACK:
        return None
    return listening_pid(parts.port or 80)


def watcher_for(
    url: str, pids: list[int], scratch: list[str], args: argparse.Namespace
) -> Watcher | None:
    if not pids:
        found = local_pid(url)
        if found is None:
            print(f"not sampling the server of {url}: no local PID (give --server-pid)",
                  file=sys.stderr)  # fmt: skip
            return None
        pids = [found]
    return Watcher(pids, first(url), scratch, args.sample_interval)


def service_status(url: str) -> dict[str, Any]:
    try:
        data = httpx.get(f"{first(url).rstrip('/')}/v1/status", timeout=10).json()
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": repr(exc)}
    keep = ("mode", "isolation", "zygote", "limits", "workers")
    return {k: data.get(k) for k in keep}


async def one_run(
    target: Target,
    workload: Workload,
    plan: Plan,
    args: argparse.Namespace,
    watcher: Watcher | None,
    name: str,
) -> Run:
    port = (urlsplit(first(name)).port or 80) if name.startswith("http") else 0
    ctx = Context(port=port)
    if args.warmup:
        warm = Plan(args.warmup, min(plan.concurrency, 16), min(plan.batch, 16), 120, 60)
        await measure(target, workload.items(args.warmup, args.seed + 1, ctx), warm,
                      workload=workload.name, target_name=name, progress=False)  # fmt: skip
    return await measure(
        target,
        workload.items(plan.count, args.seed, ctx),
        plan,
        workload=workload.name,
        target_name=name,
        watcher=watcher,
        progress=not args.quiet,
    )


def baseline_run(args: argparse.Namespace, workload: Workload) -> tuple[Target, Plan, str]:
    naive = args.baseline == "naive"
    if naive and not workload.unconfined_safe:
        raise SystemExit(f"workload {workload.name!r} is not safe to run unconfined; "
                         "the naive baseline refuses it")  # fmt: skip
    count = args.baseline_count or (min(args.count, 1000) if naive else args.count)
    plan = Plan(
        count,
        args.baseline_concurrency or args.concurrency,
        args.baseline_batch or args.batch,
        args.duration,
        args.drain,
    )
    if naive:
        return NaiveTarget(args.naive_parallel), plan, "naive: subprocess.run([python, '-c', code])"
    api = args.baseline_api or args.api
    return http_target(args.baseline, api, "baseline", args.timeout), plan, args.baseline


def host_info() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


async def main_async(args: argparse.Namespace, out_dir: str) -> list[Run]:
    workload = parse(args.workload)
    plan = Plan(args.count, args.concurrency, args.batch, args.duration, args.drain)
    second = baseline_run(args, workload) if args.baseline else None  # refuse before running
    runs: list[Run] = []
    with service(args, out_dir) as (url, pids, scratch):
        watcher = watcher_for(url, pids, scratch, args)
        target = http_target(url, args.api, "service", args.timeout)
        runs.append(await one_run(target, workload, plan, args, watcher, url))
        runs[0].notes.append(f"service status at the end: {service_status(url)}")
    if second is not None:
        btarget, bplan, name = second
        bwatch = watcher_for(args.baseline, [], [], args) if name.startswith("http") else None
        runs.append(await one_run(btarget, workload, bplan, args, bwatch, name))
    return runs


def print_targets(fig: dict[str, Any]) -> None:
    print("\ntargets (printed, not asserted):")
    for name, v in report.targets(fig).items():
        print(f"  {name}: {v['verdict']} ({v['detail']})")


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    out_dir = args.out or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out_dir, exist_ok=True)
    started = host_info()
    try:
        runs = asyncio.run(main_async(args, out_dir))
    except WorkloadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    figs = [report.figures(r) for r in runs]
    title = args.title or f"Load test: {args.workload}, {args.count} executions"
    meta = {"command": sys.argv if argv is None else ["python -m loadtests", *argv],
            "host": {**started, "load_average_end": os.getloadavg()}}  # fmt: skip
    paths = report.write(out_dir, figs, title, meta, runs, plots=not args.no_plots)
    print()
    print(report.table(figs))
    if len(figs) == 2:
        print(f"\nratios {figs[0]['label']} / {figs[1]['label']}: "
              f"{report.ratios(figs[0], figs[1])}")  # fmt: skip
    print_targets(figs[0])
    print(f"\nwritten: {', '.join(paths)}")
    return 1 if any(f["lost"] or f["wrong"] for f in figs) else 0


if __name__ == "__main__":
    sys.exit(main())
