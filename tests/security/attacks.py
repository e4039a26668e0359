"""The attack programs: what model-written code might try, and what containment looks like.

Each attack is sent through the public API like any tool call. ``contained`` decides from the
result alone whether the attack failed; ``needs`` names the isolation layers whose promise it
tests (an attack is only held against a service that reports them active). Programs print
``ESCAPED`` when they get through and ``BLOCKED <reason>`` when they are stopped, so the verdict
does not depend on how each one is stopped.
"""

from __future__ import annotations

import platform
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from sandbox_service.client import SandboxClient
from sandbox_service.models import ExecuteResult, Status


@dataclass(frozen=True)
class Target:
    """What an attack may aim at: the service's own port and process, a zygote."""

    api_port: int
    service_pid: int
    zygote_pid: int


@dataclass(frozen=True)
class Attack:
    name: str
    category: str
    expected: str
    code: Callable[[Target], str]
    contained: Callable[[ExecuteResult], bool]
    needs: tuple[str, ...] = ()
    timeout_s: float = 5.0
    memory_mb: int = 1024
    tags: frozenset[str] = field(default_factory=frozenset)
    # Cells run first in a fresh session, then ``code`` in it (a session's history attacks).
    session: tuple[str, ...] = ()

    def run(self, client: SandboxClient, target: Target) -> ExecuteResult:
        """Send the attack as its tests and the report do."""
        limits = {"timeout_s": self.timeout_s, "memory_mb": self.memory_mb}
        if not self.session:
            return client.execute(self.code(target), **limits)
        session = f"attack-{secrets.token_hex(6)}"
        for cell in self.session:
            client.execute(cell, session_id=session, **limits)
        return client.execute(self.code(target), session_id=session, **limits)


def probe(body: str) -> str:
    """Wrap ``body`` (which raises when blocked) into an ESCAPED/BLOCKED report."""
    indented = "\n".join("    " + line for line in body.strip().splitlines())
    return (
        "try:\n"
        f"{indented}\n"
        "    print('ESCAPED')\n"
        "except BaseException as e:\n"
        "    print('BLOCKED', type(e).__name__, e)\n"
    )


def blocked(r: ExecuteResult) -> bool:
    return "BLOCKED" in r.stdout and "ESCAPED" not in r.stdout


def status_is(*statuses: Status) -> Callable[[ExecuteResult], bool]:
    return lambda r: r.status in statuses and "ESCAPED" not in r.stdout


def _c(code: str) -> Callable[[Target], str]:
    return lambda _t: code


X86 = platform.machine() == "x86_64"
LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"


def _syscall(nr: int, args: str, what: str) -> str:
    return LIBC + probe(
        f"ret = libc.syscall({nr}, {args})\n"
        f"if ret < 0: raise OSError(ctypes.get_errno(), '{what} refused')"
    )


NETWORK = [
    Attack(
        "inet tcp to the internet",
        "network",
        "no route, no socket",
        _c(probe("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)")),
        blocked,
        ("net",),
    ),
    Attack(
        "inet6 tcp",
        "network",
        "no inet6 socket",
        _c(probe("import socket\ns = socket.socket(socket.AF_INET6)\ns.connect(('::1', 22))")),
        blocked,
        ("net",),
    ),
    Attack(
        "udp datagram",
        "network",
        "no udp socket",
        _c(
            probe(
                "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', 53))"
            )
        ),
        blocked,
        ("net",),
    ),
    Attack(
        "raw icmp socket",
        "network",
        "no raw socket",
        _c(
            probe(
                "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)"
            )
        ),
        blocked,
        ("net",),
    ),
    Attack(
        "packet socket",
        "network",
        "no packet socket",
        _c(probe("import socket\nsocket.socket(socket.AF_PACKET, socket.SOCK_RAW)")),
        blocked,
        ("net",),
    ),
    Attack(
        "netlink route dump",
        "network",
        "no netlink socket",
        _c(
            probe(
                "import socket\nsocket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).bind((0, 0))"
            )
        ),
        blocked,
        ("seccomp",),
    ),
    Attack(
        "dns lookup",
        "network",
        "resolution fails",
        _c(probe("import socket\nsocket.getaddrinfo('example.com', 80)")),
        blocked,
        ("net",),
    ),
    Attack(
        "redis on host loopback",
        "network",
        "cannot connect to 127.0.0.1:6379",
        _c(
            probe(
                "import socket\nsocket.create_connection(('127.0.0.1', 6379), timeout=2).sendall(b'PING\\r\\n')"
            )
        ),
        blocked,
        ("net",),
    ),
    Attack(
        "the API's own port",
        "network",
        "cannot reach the service",
        lambda t: probe(
            f"import socket\nsocket.create_connection(('127.0.0.1', {t.api_port}), timeout=2)"
        ),
        blocked,
        ("net",),
    ),
    Attack(
        "unix sockets under /run and /var",
        "network",
        "no unix socket() at all",
        _c(
            probe(
                "import socket\n"
                "for path in ('/run/postgresql/.s.PGSQL.5432', '/var/run/mysqld/mysqld.sock', '/run/docker.sock'):\n"
                "    s = socket.socket(socket.AF_UNIX)\n"
                "    try:\n"
                "        s.connect(path); break\n"
                "    except FileNotFoundError:\n"
                "        continue\n"
                "else:\n"
                "    raise OSError('no unix socket reachable')"
            )
        ),
        blocked,
        ("seccomp",),
    ),
    Attack(
        "abstract unix socket",
        "network",
        "no unix socket() at all",
        _c(probe("import socket\nsocket.socket(socket.AF_UNIX).connect('\\0/tmp/.X11-unix/X0')")),
        blocked,
        ("seccomp",),
    ),
]

FILES = [
    Attack(
        "read /etc/shadow",
        "files",
        "permission denied",
        _c(probe("open('/etc/shadow').read()")),
        blocked,
        ("uid",),
    ),
    Attack(
        "service command line and environment",
        "files",
        "not visible",
        lambda t: probe(
            f"print(open('/proc/{t.service_pid}/cmdline').read()[:40], open('/proc/{t.service_pid}/environ').read()[:40])"
        ),
        blocked,
        ("uid",),
    ),
    Attack(
        "/proc/1/environ",
        "files",
        "not visible",
        _c(probe("open('/proc/1/environ', 'rb').read()")),
        blocked,
        ("uid",),
    ),
    Attack(
        "the zygote in /proc",
        "files",
        "other processes are invisible",
        lambda t: probe(f"open('/proc/{t.zygote_pid}/status').read()"),
        blocked,
        ("mount",),
    ),
    Attack(
        "other executions' directories via /proc",
        "files",
        "only its own processes show",
        _c(
            probe(
                "import os\n"
                "mine = {os.getpid()}\n"
                "others = [p for p in os.listdir('/proc') if p.isdigit() and int(p) not in mine]\n"
                "if not others: raise OSError('no other process visible')\n"
                "print([os.readlink(f'/proc/{p}/cwd') for p in others])"
            )
        ),
        blocked,
        ("mount",),
    ),
    Attack(
        "write outside the working directory",
        "files",
        "read-only file system",
        _c(
            probe(
                "import sys, sysconfig\n"
                "ok = []\n"
                "for path in ('/etc/evil', '/usr/evil', '/var/tmp/evil', sysconfig.get_paths()['purelib'] + '/evil.py'):\n"
                "    try:\n"
                "        open(path, 'w').write('x'); ok.append(path)\n"
                "    except OSError:\n"
                "        pass\n"
                "if not ok: raise OSError('every write refused')\n"
                "print(ok)"
            )
        ),
        blocked,
        ("mount",),
    ),
    Attack(
        "fill the disk",
        "files",
        "bounded by the private /tmp; emptied after",
        _c(
            probe(
                "chunk = b'x' * (1 << 20)\nwith open('big', 'wb') as f:\n    for _ in range(100_000): f.write(chunk)"
            )
        ),
        blocked,
        ("mount",),
        timeout_s=20,
    ),
    Attack(
        "millions of files",
        "files",
        "bounded by the private /tmp's inodes",
        _c(probe("for i in range(2_000_000): open(f'f{i}', 'w').close()")),
        status_is(Status.ok, Status.error, Status.timeout),
        ("mount",),
        timeout_s=20,
    ),
    Attack(
        "symlink to /etc/shadow",
        "files",
        "permission denied through the link",
        _c(probe("import os\nos.symlink('/etc/shadow', 'link')\nopen('link').read()")),
        blocked,
        ("uid",),
    ),
    Attack(
        "hard link of /etc/shadow",
        "files",
        "cross-device or denied",
        _c(probe("import os\nos.link('/etc/shadow', 'hard')")),
        blocked,
        ("mount",),
    ),
    Attack(
        "read /dev/mem and /dev/kmsg",
        "files",
        "permission denied",
        _c(probe("open('/dev/mem', 'rb').read(16)\nopen('/dev/kmsg').read(16)")),
        blocked,
        ("uid",),
    ),
    Attack(
        "write /proc/sysrq-trigger",
        "files",
        "permission denied",
        _c(probe("open('/proc/sysrq-trigger', 'w').write('h')")),
        blocked,
        ("uid",),
    ),
    Attack(
        "home directories",
        "files",
        "hidden",
        _c(
            probe(
                "import os, sys\n"
                "needed = {p.split('/')[2] for p in [sys.prefix, sys.base_prefix, *sys.path] if p.startswith('/root/')}\n"
                "extra = set(os.listdir('/root')) - needed\n"
                "if not extra: raise OSError('only the interpreter is visible in /root')\n"
                "print(sorted(extra))"
            )
        ),
        blocked,
        ("mount",),
    ),
]

PROCESSES = [
    Attack(
        "fork bomb",
        "processes",
        "process limit, then killed at the timeout",
        _c("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass"),
        status_is(Status.timeout),
        ("uid",),
        timeout_s=2,
    ),
    Attack(
        "double-fork daemon",
        "processes",
        "killed when the execution ends",
        _c(
            "import os, time\nif os.fork() == 0:\n    if os.fork() == 0:\n        time.sleep(300)\n    os._exit(0)\nprint('launched')"
        ),
        status_is(Status.ok),
    ),
    Attack(
        "setsid child outliving the timeout",
        "processes",
        "found as an orphan and killed",
        _c("import os, time\nif os.fork() == 0:\n    os.setsid(); time.sleep(300)\ntime.sleep(30)"),
        status_is(Status.timeout),
        timeout_s=1,
    ),
    Attack(
        "kill(-1)",
        "processes",
        "refused; the service lives on",
        _c(probe("import os, signal\nos.kill(-1, signal.SIGKILL)")),
        lambda r: "ESCAPED" not in r.stdout,
        ("seccomp",),
    ),
    Attack(
        "signal the zygote",
        "processes",
        "not permitted",
        lambda t: probe(f"import os, signal\nos.kill({t.zygote_pid}, signal.SIGKILL)"),
        blocked,
        ("uid",),
    ),
    Attack(
        "ptrace the zygote",
        "processes",
        "not permitted",
        lambda t: (
            LIBC
            + probe(
                f"if libc.ptrace(16, {t.zygote_pid}, 0, 0) != 0: raise OSError(ctypes.get_errno(), 'ptrace refused')"
            )
        ),
        blocked,
        ("seccomp",),
    ),
    Attack(
        "ignore SIGTERM and spin",
        "processes",
        "SIGKILL at the timeout",
        _c("import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: pass"),
        status_is(Status.timeout),
        timeout_s=1,
    ),
    Attack(
        "setuid(0)",
        "processes",
        "not permitted",
        _c(probe("import os\nos.setuid(0)")),
        blocked,
        ("uid",),
    ),
    Attack(
        "raise own rlimits",
        "processes",
        "hard limits cannot be raised",
        _c(
            probe(
                "import resource\nresource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))"
            )
        ),
        blocked,
    ),
    Attack(
        "unshare a user namespace",
        "processes",
        "refused by seccomp",
        _c(_syscall(272, "0x10000000", "unshare") if X86 else probe("raise OSError('x86 only')")),
        blocked,
        ("seccomp",),
    ),
]

RESOURCES = [
    Attack(
        "python memory bomb",
        "resources",
        "memory_limit",
        _c("x = []\nwhile True: x.append(' ' * 10**7)"),
        status_is(Status.memory_limit),
        timeout_s=20,
    ),
    Attack(
        "numpy memory bomb",
        "resources",
        "refused at once: the program's MemoryError",
        _c("import numpy as np\na = np.ones(10**10)"),
        lambda r: r.status is Status.error and "MemoryError" in r.stderr,
    ),
    Attack(
        "mmap bomb",
        "resources",
        "address-space limit",
        _c(probe("import mmap\nm = mmap.mmap(-1, 64 * 1024**3)\nm[0:1] = b'x'")),
        blocked,
    ),
    Attack(
        "thread bomb",
        "resources",
        "cannot start more threads; contained",
        _c(
            probe(
                # daemon: the program ends without waiting 10 s for them, as CPython would not
                "import threading, time\nts = []\nfor _ in range(100_000):\n    t = threading.Thread(target=time.sleep, args=(10,), daemon=True); t.start(); ts.append(t)"
            )
        ),
        blocked,
        timeout_s=10,
    ),
    Attack(
        "cpu hog in many processes",
        "resources",
        "all killed at the timeout",
        _c(
            "import multiprocessing as mp\ndef spin():\n    while True: pass\nps = [mp.Process(target=spin) for _ in range(4)]\n[p.start() for p in ps]\n[p.join() for p in ps]"
        ),
        status_is(Status.timeout),
        timeout_s=1,
    ),
    Attack(
        "huge stdout",
        "resources",
        "output_limit, truncated",
        _c("while True: print('x' * 1000)"),
        lambda r: r.status is Status.output_limit and r.stdout_truncated,
    ),
    Attack(
        "huge stderr",
        "resources",
        "output_limit, truncated",
        _c("import sys\nwhile True: sys.stderr.write('e' * 1000)"),
        lambda r: r.status is Status.output_limit and r.stderr_truncated,
    ),
    Attack(
        "unterminated output, then hang",
        "resources",
        "timeout, partial output kept",
        _c("import sys, time\nsys.stdout.write('partial'); sys.stdout.flush()\ntime.sleep(60)"),
        lambda r: r.status is Status.timeout and r.stdout == "partial",
        timeout_s=1,
    ),
    Attack(
        "binary output",
        "resources",
        "delivered, invalid UTF-8 replaced",
        _c("import sys, os\nsys.stdout.buffer.write(os.urandom(4096))"),
        status_is(Status.ok),
    ),
]

NATIVE = [
    Attack(
        "ctypes socket syscall",
        "native",
        "refused by seccomp",
        _c(_syscall(41, "2, 1, 0", "socket") if X86 else probe("raise OSError('x86 only')")),
        blocked,
        ("seccomp",),
    ),
    Attack(
        "ctypes mount",
        "native",
        "refused",
        _c(
            LIBC
            + probe(
                "if libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) != 0: raise OSError(ctypes.get_errno(), 'mount refused')"
            )
        ),
        blocked,
        ("uid",),
    ),
    Attack(
        "bpf syscall",
        "native",
        "refused by seccomp",
        _c(_syscall(321, "0, 0, 0", "bpf") if X86 else probe("raise OSError('x86 only')")),
        blocked,
        ("seccomp",),
    ),
    Attack(
        "keyctl syscall",
        "native",
        "refused by seccomp",
        _c(_syscall(250, "0, 0, 0, 0, 0", "keyctl") if X86 else probe("raise OSError('x86 only')")),
        blocked,
        ("seccomp",),
    ),
    Attack(
        "perf_event_open",
        "native",
        "refused by seccomp",
        _c(
            _syscall(298, "0, 0, -1, -1, 0", "perf_event_open")
            if X86
            else probe("raise OSError('x86 only')")
        ),
        blocked,
        ("seccomp",),
    ),
    Attack(
        "io_uring_setup",
        "native",
        "refused by seccomp",
        _c(_syscall(425, "8, 0", "io_uring_setup") if X86 else probe("raise OSError('x86 only')")),
        blocked,
        ("seccomp",),
    ),
    Attack(
        "compiled native code",
        "native",
        "runs, but under the same confinement",
        _c(
            probe(
                "import ctypes, os, shutil, subprocess\n"
                "if not shutil.which('gcc'): raise OSError('no compiler')\n"
                "open('m.c', 'w').write('#include <sys/socket.h>\\nint f(void){return socket(2, 1, 0);}')\n"
                "subprocess.run(['gcc', '-shared', '-fPIC', '-o', 'm.so', 'm.c'], check=True)\n"
                "if ctypes.CDLL(os.path.abspath('m.so')).f() < 0: raise OSError('socket refused in native code')"
            )
        ),
        blocked,
        ("seccomp",),
        timeout_s=20,
    ),
    Attack(
        "shell commands",
        "native",
        "confined like Python",
        _c(
            probe(
                "import subprocess\nsubprocess.run('cat /etc/shadow', shell=True, check=True, capture_output=True)"
            )
        ),
        blocked,
        ("uid",),
    ),
    Attack(
        "core dump",
        "native",
        "abort, no core file written",
        _c("import os\nos.abort()"),
        lambda r: r.status is Status.error and r.signal == 6,
    ),
]

# Issue 21: the reset, IPC, the memory of a whole tree, pids. Each class has a module of its
# own with variants (test_reset.py, test_ipc.py, test_memory.py, test_pids.py, test_files.py);
# one attack of each is here, for the table of results per isolation mode.
ISSUE_21 = [
    Attack(
        "directory tree 2,000 levels deep",
        "files",
        "emptied after the run (iteratively); the slot stays usable",
        _c(
            "import os\nfd = os.open('.', os.O_RDONLY)\nfor _ in range(2000):\n"
            "    os.mkdir('d', dir_fd=fd); n = os.open('d', os.O_RDONLY, dir_fd=fd)\n"
            "    os.close(fd); fd = n\nprint('deep')"
        ),
        status_is(Status.ok),
    ),
    Attack(
        "SysV IPC of the host",
        "ipc",
        "an IPC namespace per zygote: nothing listed",
        _c(
            probe(
                "rows = [r for k in ('shm', 'sem', 'msg') "
                "for r in open('/proc/sysvipc/' + k).read().splitlines()[1:]]\n"
                "if not rows: raise OSError('no IPC object visible')\nprint(len(rows))"
            )
        ),
        blocked,
        ("ipc",),
    ),
    Attack(
        "ten forked children of 110 MiB under 128",
        "resources",
        "memory_limit: the limit holds for the tree",
        _c(
            "import os, time\nfor _ in range(10):\n    if os.fork() == 0:\n"
            "        b = bytearray(110 << 20); b[::4096] = b'x' * len(b[::4096])\n"
            "        time.sleep(1); os._exit(0)\n"
            "for _ in range(10): os.wait()\nprint('ESCAPED')"
        ),
        status_is(Status.memory_limit),
        timeout_s=20,
        memory_mb=128,
    ),
    Attack(
        "probe the host's pids",
        "processes",
        "a pid namespace per zygote: only pid 1 and its own",
        lambda t: probe(
            "import os\nfound = []\n"
            f"for pid in [*range(2, 70_000), {t.service_pid}]:\n"
            "    try:\n        os.getpgid(pid); found.append(pid)\n"
            "    except OSError:\n        pass\n"
            "found = [p for p in found if p != os.getpid()]\n"
            "if not found: raise OSError('no other process answers')\nprint(len(found))"
        ),
        blocked,
        ("pid",),
        timeout_s=20,
    ),
]

# Issue 21, classes 4 and 6 (more variants, and class 5, which needs two executions on one
# zygote: test_verdict.py, test_driver.py, test_memory_leftovers.py).
VERDICT = [
    Attack(
        "forge setup_error on the status pipe",
        "verdict",
        "error (the pipe is closed), not internal_error",
        _c("import os\nos.write(3, b'setup_error: forged')\n1/0"),
        status_is(Status.error),
    ),
    Attack(
        "forge memory_error on the status pipe",
        "verdict",
        "error, not memory_limit",
        _c("import os\nos.write(3, b'memory_error\\n')\nraise SystemExit(1)"),
        status_is(Status.error),
    ),
    Attack(
        "SIGXCPU to itself after 7 ms",
        "verdict",
        "error, not timeout (the tree's CPU is far below the limit)",
        _c("import os, signal, time\ntime.sleep(0.007)\nos.kill(os.getpid(), signal.SIGXCPU)"),
        status_is(Status.error),
    ),
    Attack(
        "SIGKILL to itself",
        "verdict",
        "error, not killed or memory_limit",
        _c("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"),
        status_is(Status.error),
    ),
    Attack(
        "a MemoryError it raised itself",
        "verdict",
        "error, not memory_limit (no memory was used)",
        _c("raise MemoryError('fake')"),
        status_is(Status.error),
    ),
    Attack(
        "a session cell that wraps child.run",
        "verdict",
        "a later failing cell is still error",
        _c("assert 6 * 7 == 41"),
        status_is(Status.error),
        session=(
            "from sandbox_service.executor import child\nreal = child.run\n"
            "child.run = lambda *a, **k: (real(*a, **k), 0)[1]\n",
        ),
    ),
    Attack(
        "a session cell that patches builtins and os._exit",
        "verdict",
        "a later failing cell is still error",
        _c("raise ValueError('fails')"),
        status_is(Status.error),
        session=(
            "import builtins, os\nbuiltins.exec = lambda *a, **k: None\n"
            "real = os._exit\nos._exit = lambda status: real(0)\n",
        ),
    ),
]

# Issue 30 (more variants: test_driver.py, test_memory_claims.py, test_endings.py,
# test_page_cache.py, which needs two executions on one zygote).
ISSUE_30 = [
    Attack(
        "a session cell that leaves an audit hook forging verdicts",
        "verdict",
        "the hook is refused: a later failing cell is still error",
        _c("assert 6 * 7 == 41"),
        status_is(Status.error),
        session=(
            "import os, sys\n"
            "def forge(event, args):\n"
            "    f = sys._getframe()\n"
            "    while event == 'exec' and f is not None:\n"
            "        s = f.f_locals\n"
            "        if isinstance(s.get('reports'), int) and isinstance(s.get('token'), str):\n"
            "            os.write(s['reports'], f\"{s['token']} {os.getpid()} 0\\n\".encode())\n"
            "        f = f.f_back\n"
            "sys.addaudithook(forge)\n",
        ),
    ),
    Attack(
        "fill most of the memory limit, then fail",
        "verdict",
        "error, not memory_limit (the limit was never enforced)",
        _c("b = bytearray(235 << 20)\nb[::4096] = b'x' * len(b[::4096])\nassert False"),
        status_is(Status.error),
        memory_mb=256,
    ),
    Attack(
        "an atexit handler exits 0 after a failing assert",
        "verdict",
        "error: nothing after a failed main part runs",
        _c("import atexit, os\natexit.register(os._exit, 0)\nassert False"),
        status_is(Status.error),
    ),
    Attack(
        "the deep-recursion idiom in a thread",
        "verdict",
        "ok with its output: non-daemon threads are joined",
        _c(
            "import sys, threading\nsys.setrecursionlimit(1 << 20)\n"
            "threading.stack_size(1 << 26)\n"
            "def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\n"
            "threading.Thread(target=lambda: print(f(50000))).start()"
        ),
        lambda r: r.status is Status.ok and r.stdout == "50000\n",
    ),
]

ALL: list[Attack] = NETWORK + FILES + PROCESSES + RESOURCES + NATIVE + ISSUE_21 + VERDICT + ISSUE_30
