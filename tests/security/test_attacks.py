"""The attack suite: every attack through the public API is contained, the next ordinary
execution still works, and afterwards nothing is left behind (process, zombie, file, descriptor).

The service here is started for this module alone so that its descriptors and processes can be
counted before and after. ``python -m tests.security.report`` runs the same attacks per
isolation mode and writes the table in docs/SECURITY.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from sandbox_service.client import Retry, SandboxClient
from sandbox_service.service_process import ServiceProcess, start
from tests.helpers import processes_of
from tests.security.attacks import ALL, Attack, Target
from tests.security.every_slot import suite_slots


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    svc = start(
        str(tmp_path_factory.mktemp("attacks") / "service.log"),
        slots=suite_slots(),
        max_timeout_s=30,
    )
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def baseline(service: ServiceProcess) -> dict[str, int]:
    with SandboxClient(service.url) as warm:
        warm.execute("print(1)")
    time.sleep(0.3)
    return {"fds": _fd_count(service.process.pid)}


@pytest.fixture(scope="module")
def client(service: ServiceProcess, baseline: dict[str, int]) -> Iterator[SandboxClient]:
    with SandboxClient(service.url, retry=Retry(attempts=2), concurrency=1) as c:
        yield c


@pytest.fixture(scope="module")
def target(service: ServiceProcess, client: SandboxClient) -> Target:
    return Target(service.port, service.process.pid, client.status().slots[0].pid or 0)


@pytest.mark.parametrize("attack", ALL, ids=[a.name for a in ALL])
def test_attack_is_contained(attack: Attack, client: SandboxClient, target: Target) -> None:
    isolation = client.status().isolation
    missing = [layer for layer in attack.needs if isolation.get(layer) is not True]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}, inactive here")
    if target.zygote_pid != client.status().slots[0].pid:
        pytest.fail("an attack killed or replaced the zygote")
    result = attack.run(client, target)
    assert attack.contained(result), (
        f"{attack.name}: expected {attack.expected}; got {result.status.value} "
        f"stdout={result.stdout[-300:]!r} stderr={result.stderr[-300:]!r}"
    )
    after = client.execute("print('next')")
    assert after.stdout == "next\n", f"the execution after {attack.name!r} failed: {after}"


def test_nothing_left_behind(service: ServiceProcess, client: SandboxClient,
                             baseline: dict[str, int]) -> None:  # fmt: skip
    status = client.status()
    zygotes = status.slots + status.light_slots  # most attacks import only the stdlib
    assert all(s.restarts == 0 for s in zygotes), "an attack made a zygote die"
    time.sleep(0.3)
    uids = {s.uid for s in zygotes if s.uid is not None}
    assert processes_of(uids) == [], "a process of a slot's uid survived"
    keeper = status.isolation.get("pid") is True  # the zygote is the keeper's only child
    for slot in zygotes:
        [zygote] = _children(slot.pid or 0) if keeper else [slot.pid or 0]
        assert _children(zygote) == [], f"zygote {zygote} has children (zombies?)"
    leftovers = [os.path.join(d, n) for d, _, names in os.walk(service_work_root()) for n in names]
    assert leftovers == [], "files left in the work area"
    assert not any(
        d.startswith("run-") for _, dirs, _ in os.walk(service_work_root()) for d in dirs
    )
    assert _files_owned_by(uids, "/tmp") == [], "a file reached the host's /tmp"
    client.close()
    time.sleep(0.5)
    assert _fd_count(service.process.pid) == baseline["fds"], "the service leaked descriptors"


def service_work_root() -> str:
    return "/tmp/sandbox-service"


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _files_owned_by(uids: set[int], root: str) -> list[str]:
    found = []
    for entry in os.scandir(root):
        try:
            if entry.stat(follow_symlinks=False).st_uid in uids:
                found.append(entry.path)
        except FileNotFoundError:
            continue
    return found
