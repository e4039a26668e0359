"""Class 7 of issue 21, pids: an execution finds no process of the host by probing pids
(``getpgid``, ``kill(pid, 0)``, ``pidfd_open``), only its own and its zygote's (pid 1 of
the zygote's own pid namespace). Full and light zygotes alike; after each probe every zygote
of every slot must answer a clean probe (``slots.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from sandbox_service.client import SandboxClient
from sandbox_service.models import Status
from tests.security.slots import attacked_service, every_zygote_is_clean

PROBES = {
    "getpgid": "os.getpgid(pid)",
    "kill 0": "os.kill(pid, 0)",
    "pidfd_open": "os.close(os.pidfd_open(pid))",
    "getsid": "os.getsid(pid)",
    "sched_getparam": "os.sched_getparam(pid)",
}
# Every pid up to 70,000 and the host pids the test knows; prints what answered, and for
# each, whether it is one of the execution's own processes.
SCAN = """
import os
mine = {{os.getpid()}}
found = []
for pid in [*range(1, 70_000), *{targets}]:
    try:
        {probe}
    except PermissionError:
        found.append(pid)  # refused, so it exists
    except OSError:
        continue
    else:
        found.append(pid)
print(sorted(set(found) - mine))
"""
KINDS = {"full": "import numpy\n", "light": ""}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SandboxClient, str]]:
    with attacked_service(str(tmp_path_factory.mktemp("pids"))) as pair:
        if os.geteuid() != 0:
            pytest.skip("a pid namespace per zygote needs root")
        yield pair


def _host_pids(client: SandboxClient) -> list[int]:
    status = client.status()
    keepers = [z.pid for z in status.slots + status.light_slots if z.pid]
    return [1, os.getpid(), os.getppid(), *keepers]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("probe", PROBES)
def test_probing_pids_finds_only_the_zygote(
    probe: str, kind: str, service: tuple[SandboxClient, str]
) -> None:
    client, _ = service
    code = SCAN.format(targets=_host_pids(client), probe=PROBES[probe])
    result = client.execute(KINDS[kind] + code, timeout_s=30)
    assert result.status is Status.ok, (result.status, result.stderr[-300:])
    assert result.stdout == "[1]\n", f"{probe} found processes: {result.stdout[:300]}"
    every_zygote_is_clean(client)


@pytest.mark.parametrize("kind", KINDS)
def test_a_child_finds_its_parent_and_nothing_else(
    kind: str, service: tuple[SandboxClient, str]
) -> None:
    """The execution's own tree stays visible to it (multiprocessing and the like work)."""
    client, _ = service
    code = (
        "import os, time\n"
        "kid = os.fork()\n"
        "if kid == 0:\n"
        "    time.sleep(2); os._exit(0)\n"
        + SCAN.format(targets=_host_pids(client), probe="os.getpgid(pid)")
        + "print(kid)\nos.kill(kid, 9); os.waitpid(kid, 0)\n"
    )
    result = client.execute(KINDS[kind] + code, timeout_s=30)
    found, child = result.stdout.splitlines()
    assert found == f"[1, {child}]", result.stdout
    every_zygote_is_clean(client)


def test_isolation_reports_the_pid_layer(service: tuple[SandboxClient, str]) -> None:
    assert service[0].status().isolation["pid"] is True
