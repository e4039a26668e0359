"""Isolation properties, each checked against a real attempt from inside the sandbox.

A layer the service reports as inactive on this host is skipped with the service's own reason;
what it reports as active must hold.
"""

from __future__ import annotations

import ast
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox_service.client import SandboxClient
from sandbox_service.models import Status
from sandbox_service.service_process import LaunchError, ServiceProcess, start
from tests.helpers import SECRET, processes_of


def _layer(client: SandboxClient, name: str) -> None:
    isolation = client.status().isolation
    if isolation.get(name) is not True:
        pytest.skip(f"{name} isolation inactive here: {isolation.get(f'{name}_note', 'off')}")


def test_layers_are_reported(client: SandboxClient) -> None:
    isolation = client.status().isolation
    assert {"net", "mount", "uid", "seccomp", "rlimits"} <= set(isolation)
    if os.geteuid() == 0:  # what this project's machines (root, namespaces, libseccomp) give
        assert all(isolation[k] is True for k in ("net", "mount", "uid", "seccomp", "rlimits"))


def test_cannot_connect_to_host_loopback(client: SandboxClient) -> None:
    _layer(client, "net")
    accepted: list[object] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(3)
        port = listener.getsockname()[1]

        def accept() -> None:
            try:
                accepted.append(listener.accept())
            except OSError:
                pass

        waiter = threading.Thread(target=accept)
        waiter.start()
        code = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')\n"
            "except OSError as e:\n"
            "    print('blocked', type(e).__name__)"
        )
        r = client.execute(code)
        waiter.join()
    assert r.stdout.startswith("blocked"), r.stdout + r.stderr
    assert accepted == []


def test_no_sockets_but_socketpair(client: SandboxClient) -> None:
    _layer(client, "seccomp")
    code = (
        "import socket\n"
        "for fam in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX):\n"
        "    try: socket.socket(fam); print('open')\n"
        "    except PermissionError: print('denied')\n"
        "a, b = socket.socketpair(); print('unix ok')\n"
        "import threading; t = threading.Thread(target=print, args=('thread ok',)); t.start(); t.join()"
    )
    assert client.execute(code).stdout == "denied\ndenied\ndenied\nunix ok\nthread ok\n"


def test_service_environment_is_not_visible(client: SandboxClient, service: ServiceProcess) -> None:
    r = client.execute("import os; print(dict(os.environ))")
    assert SECRET not in r.stdout and "SANDBOX_" not in r.stdout
    zygote = client.status().slots[0].pid
    pids = [service.process.pid, zygote, 1]
    code = (
        f"for pid in {pids!r}:\n"
        "    try: data = open(f'/proc/{pid}/environ', 'rb').read(); print(pid, 'read', len(data))\n"
        "    except OSError as e: print(pid, type(e).__name__)"
    )
    r = client.execute(code)
    assert SECRET not in r.stdout
    if client.status().isolation.get("uid") is True:
        assert " read " not in r.stdout, r.stdout  # hidden (mount layer) or refused (uid)
        assert r.stdout.count("Error") == 3, r.stdout


def test_runs_as_unprivileged_uid(client: SandboxClient) -> None:
    _layer(client, "uid")
    report = client.status()
    uids = {s.uid for s in report.slots + report.light_slots}
    r = client.execute("import os; print(os.getuid(), os.getgid(), os.getgroups())")
    uid, gid, groups = r.stdout.split(maxsplit=2)
    assert int(uid) in uids and int(gid) == int(uid) and groups.strip() == "[]"
    assert client.execute("import os; os.setuid(0)").status is Status.error


def test_cannot_write_outside_working_directory(client: SandboxClient) -> None:
    _layer(client, "mount")
    # A name of this run's own: a leftover of an earlier run (or of a non-root run, where /var/tmp
    # is writable) must not read as this run's escape.
    name = f"evil-{uuid.uuid4().hex}"
    targets = [f"{d}/{name}" for d in ("/etc", "/var/tmp", "/usr", os.getcwd(), "/root")]
    code = (
        "import os\n"
        f"for path in {targets!r}:\n"
        "    try: open(path, 'w').write('x'); print(path, 'WROTE')\n"
        "    except OSError as e: print(path, e.errno)\n"
        "open('here.txt', 'w').write('fine'); print(os.getcwd(), open('here.txt').read())"
    )
    r = client.execute(code)
    assert "WROTE" not in r.stdout, r.stdout
    assert r.stdout.strip().endswith("fine")
    for path in targets:
        assert not os.path.exists(path)


def test_home_of_service_is_hidden(client: SandboxClient) -> None:
    _layer(client, "mount")
    r = client.execute(
        "import os; print(sorted(os.listdir('/root')) if os.path.isdir('/root') else [])"
    )
    visible = ast.literal_eval(r.stdout)
    assert ".ssh" not in visible and ".bash_history" not in visible


def test_executions_do_not_see_each_other(client: SandboxClient) -> None:
    # /tmp may hold the interpreter's own directories (a venv under /tmp): they stay.
    baseline = client.execute("import os; print(sorted(os.listdir('.')))").stdout
    marker = f"marker-{uuid.uuid4().hex}"
    write = f"open('/tmp/{marker}', 'w').write('secret'); open('{marker}.local', 'w').write('x')"
    assert client.execute(write).status is Status.ok
    look = (
        "import os\n"
        f"print(os.path.exists('/tmp/{marker}'), os.path.exists('{marker}.local'))\n"
        "print(sorted(os.listdir('.')))"
    )
    for r in client.execute_batch([look] * 6):  # both slots, several times
        assert r.stdout == "False False\n" + baseline, r.stdout
    assert not os.path.exists(f"/tmp/{marker}")  # nothing reached the host's temp area


def test_fork_bomb_is_contained(client: SandboxClient) -> None:
    bomb = "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass"
    start = time.monotonic()
    r = client.execute(bomb, timeout_s=2)
    assert r.status is Status.timeout
    assert time.monotonic() - start < 10
    assert client.execute("print('still here')").stdout == "still here\n"
    if client.status().isolation.get("uid") is True:
        assert (
            processes_of({s.uid for s in client.status().slots + client.status().light_slots}) == []
        )


def test_setsid_daemon_does_not_survive(client: SandboxClient) -> None:
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(120)\n"
        "    os._exit(0)\n"
        "time.sleep(0.2)\n"
        "print('parent done')"
    )
    r = client.execute(code)
    assert r.stdout == "parent done\n"
    time.sleep(0.2)
    if client.status().isolation.get("uid") is True:
        assert (
            processes_of({s.uid for s in client.status().slots + client.status().light_slots}) == []
        )
    assert client.execute("print(1)").stdout == "1\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="slot uids are used only as root")
def test_a_slot_uid_that_cannot_reach_its_files_is_not_used_silently(tmp_path: Path) -> None:
    """Without the mount layer, children work in work_root and import from the interpreter's
    directories as the slot uid: a work root under a directory closed to other users (as
    pytest's tmp_path is) would fail every execution, so the uid layer reports itself
    inactive, saying why, and a service that requires it refuses to start."""
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    settings: dict[str, Any] = {"slots": 1, "preload": "math", "warmup": "",
                "work_root": str(closed / "work"), "disable_isolation": "mount"}  # fmt: skip
    service = start(str(tmp_path / "a.log"), **settings)
    try:
        status = httpx.get(f"{service.url}/v1/status").json()
        assert status["isolation"]["uid"] is False
        assert "cannot read /" in status["isolation"]["uid_note"]  # the first path it cannot
        ran = httpx.post(f"{service.url}/v1/execute", json={"code": "import csv; print(1)"})
        assert ran.json()["stdout"] == "1\n"
    finally:
        service.stop()
    with pytest.raises(LaunchError, match=r"uid: PermissionError: slot uid \d+ cannot read"):
        start(str(tmp_path / "b.log"), require_isolation="uid", ready_timeout_s=60, **settings)


def test_read_small_reads_a_file_whole(tmp_path: Path) -> None:
    from sandbox_service.executor.isolation import my_children, read_small

    big = os.urandom(200_000)  # more than one read's 64 KiB
    (tmp_path / "f").write_bytes(big)
    assert read_small(str(tmp_path / "f")) == big
    assert read_small("/proc/sysvipc/shm").startswith(b"       key")
    pid = os.fork()
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    try:
        assert pid in my_children()
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def _sweep_a_subreaper() -> bytes:
    """In a throwaway child, made a subreaper: a child of its own session, an orphan of a
    setsid double-fork, and a child in a session of its own forked by another thread; what
    ``kill_adopted_orphans`` killed, and who of them is alive after it."""
    import json
    import subprocess

    from sandbox_service.executor import isolation as iso

    iso.become_subreaper()
    own = subprocess.Popen(["sleep", "60"])  # what the service starts: its own session
    r, w = os.pipe()
    if (pid := os.fork()) == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            os.execv("/bin/sleep", ["sleep", "60"])
        os._exit(0)
    os.waitpid(pid, 0)
    orphan = int(os.read(r, 32))
    threaded: list[subprocess.Popen[bytes]] = []
    done = threading.Event()

    def fork_in_thread() -> None:
        threaded.append(subprocess.Popen(["sleep", "60"], start_new_session=True))
        done.wait()  # this thread stays its parent until the sweep is over

    thread = threading.Thread(target=fork_in_thread)
    thread.start()
    while not threaded:
        time.sleep(0.001)
    adopted = orphan in iso.children_of_every_thread()
    killed = iso.kill_adopted_orphans()
    alive = [os.path.exists(f"/proc/{p}") for p in (orphan, threaded[0].pid)]
    alive.append(own.poll() is None)
    done.set()
    thread.join()
    own.kill()
    own.wait()
    return json.dumps({"adopted": adopted, "killed": killed, "alive": alive}).encode()


def test_kill_adopted_orphans_spares_the_services_own_children() -> None:
    import json

    from sandbox_service.executor.isolation import in_throwaway_child

    swept = json.loads(in_throwaway_child(_sweep_a_subreaper))
    # the orphan came back to the subreaper; it and the other thread's child are gone
    assert swept == {"adopted": True, "killed": 2, "alive": [False, False, True]}
