"""After an attack: every zygote of every slot, full and light, still answers correctly and
shows nothing of what the attack left.

Each zygote runs code as a uid of its own (slot i: ``uid_base + i``; its light zygote: after
the full ones'), so a program names the zygote it ran on by printing ``os.getuid()``. The
check sends batches that keep both kinds of zygote of every slot busy until each uid has
answered a clean report, and fails naming the zygote that did not.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

from sandbox_service.client import Retry, SandboxClient
from sandbox_service.models import ExecuteResult, Status
from sandbox_service.service_process import start
from tests.security.every_slot import full_prefix, light_prefix, suite_slots

# What a clean zygote shows a new execution: empty scratch directories (but the
# interpreter's own entries, where it lives under /tmp), no IPC object, the standard
# library's modules (not a planted copy), an ordinary answer.
PROBE = """
import colorsys, fractions, json, os, sys
def listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        return [type(exc).__name__]
kept = {p.split('/')[2] for p in sys.path if p.startswith('/tmp/')}
ipc = {}
for kind in ('shm', 'sem', 'msg'):
    with open('/proc/sysvipc/' + kind) as f:
        ipc[kind] = len(f.read().splitlines()) - 1
report = {
    'uid': os.getuid(),
    'tmp': [n for n in listing('/tmp') if n not in kept],
    'shm': listing('/dev/shm'),
    'ipc': ipc,
    'modules': [m.__file__ for m in (colorsys, fractions)],
    'workdir_is_tmp': os.getcwd() == '/tmp',
    'answer': 6 * 7,
}
print(json.dumps(report))
"""


def _problems(result: ExecuteResult, stdlib: str) -> tuple[int | None, list[str]]:
    if result.status is not Status.ok:
        return None, [f"{result.status.value}: {result.message} {result.stderr[-300:]}"]
    report = json.loads(result.stdout)
    bad = []
    if report["tmp"] and report["workdir_is_tmp"]:
        bad.append(f"/tmp holds {report['tmp'][:5]}")
    if report["shm"]:
        bad.append(f"/dev/shm holds {report['shm'][:5]}")
    if any(report["ipc"].values()):
        bad.append(f"IPC objects visible: {report['ipc']}")
    planted = [m for m in report["modules"] if not m.startswith(stdlib)]
    if planted:
        bad.append(f"modules imported from outside the standard library: {planted}")
    if report["answer"] != 42:
        bad.append("wrong answer")
    return report["uid"], bad


def every_zygote_is_clean(client: SandboxClient, timeout_s: float = 90.0) -> None:
    """Every zygote of every slot (full and light) answers a probe, and shows nothing left
    behind; AssertionError naming what is wrong otherwise."""
    status = client.status()
    zygotes = status.slots + status.light_slots
    expected = {z.uid for z in zygotes} if all(z.uid for z in zygotes) else {None}
    stdlib = _stdlib(client)
    seen: set[int | None] = set()
    deadline = time.monotonic() + timeout_s
    rounds = 0
    while seen != expected or rounds < 2:  # without slot uids, zygotes look alike: 2 rounds
        rounds += 1
        n = len(status.slots)
        batch = [full_prefix(n) + PROBE] * n + [light_prefix(n) + PROBE] * len(status.light_slots)
        for result in client.execute_batch(batch):
            uid, bad = _problems(result, stdlib)
            assert not bad, f"zygote of uid {uid} after the attack: {'; '.join(bad)}"
            seen.add(uid if None not in expected else None)
        assert time.monotonic() < deadline, f"zygotes {expected - seen} never answered"
        status = client.status()


def _stdlib(client: SandboxClient) -> str:
    r = client.execute("import os; print(os.path.dirname(os.__file__))")
    assert r.status is Status.ok, r
    return r.stdout.strip()


@contextlib.contextmanager
def attacked_service(log_dir: str, **settings: Any) -> Iterator[tuple[SandboxClient, str]]:
    """A service of ``suite_slots`` slots (full and light zygotes each) for one module of attacks: a
    client of it that retries nothing the service answers, and its URL."""
    svc = start(f"{log_dir}/service.log", slots=suite_slots(), max_timeout_s=60, **settings)
    try:
        with SandboxClient(svc.url, retry=Retry(attempts=2), concurrency=4) as client:
            yield client, svc.url
    finally:
        svc.stop()
