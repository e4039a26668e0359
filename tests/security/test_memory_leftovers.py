"""Issue 21, class 5: an execution cannot read an earlier execution's input or output from its
own memory.

A child is a copy of its zygote. The attacker runs right after a victim on the same zygote (one
slot here, so both land on it: the light zygote for standard-library programs, the full one
with numpy) and scans every anonymous mapping of its own memory through ``/proc/self/mem`` for
markers the victim sent or produced: in its code, stdin, files, stdout, stderr, a session
history, payloads large enough to take other paths (a grown buffer, pages dropped rather than
overwritten), and a victim cut short by its time limit. The attacker's own code holds each
marker only reversed, and searches with a pattern that never holds it whole, so that what it
finds can only come from the victim.
"""

from __future__ import annotations

import base64
import secrets

import pytest

from sandbox_service.client import SandboxClient
from sandbox_service.models import Status
from tests.security.every_slot import ZYGOTES, assert_every_slot_answers, module_service

SCAN = """
import os, re
needles = {needles!r}
patterns = {{name: re.compile(re.escape(rev[::-1][:1]) + b'[' + rev[::-1][1:2] + b']'
                              + re.escape(rev[::-1][2:])) for name, rev in needles.items()}}
found = set()
buf = bytearray(1 << 22)
mem = os.open('/proc/self/mem', os.O_RDONLY)
for line in open('/proc/self/maps').read().splitlines():
    fields = line.split()
    if 'r' not in fields[1] or (len(fields) > 5 and not fields[5].startswith('[h')):
        continue  # file-backed: the interpreter's and libraries' own pages
    start, end = (int(x, 16) for x in fields[0].split('-'))
    pos = start
    while pos < end:
        n = min(len(buf), end - pos)
        try:
            got = os.preadv(mem, [memoryview(buf)[:n]], pos)
        except OSError:
            break
        view = bytes(buf[:got])
        for name, pattern in patterns.items():
            if pattern.search(view):
                found.add(name)
        pos += max(got - 64, 1) if got == n and pos + n < end else n
print('LEAK ' + ' '.join(sorted(found)) if found else 'CLEAN')
"""


def _marker(kind: str) -> str:
    return f"{kind.upper()}-{secrets.token_hex(12)}"  # 6 + 1 + 24 characters, base64-clean


# Before the marker: a victim of another size than the attacker, so that the attacker's own
# request does not happen to land on (and overwrite) the memory the victim's request held.
PAD = "#" * 200_000


def _victim(kind: str, marker: str) -> tuple[dict, list[str]]:
    """(the victim's request, the forms of the marker the attacker looks for)."""
    rev = marker[::-1]
    plain = [marker]
    if kind == "code":
        return {"code": f"{PAD}\n# {marker}\nprint('victim')"}, plain
    if kind == "stdin":
        return {"code": "import sys\nsys.stdin.read()", "stdin": f"{PAD}{marker}\n"}, plain
    if kind == "file":
        data = base64.b64encode(PAD[:199_998].encode() + marker.encode()).decode()
        return {"code": "open('secret.txt').read()", "files": {"secret.txt": data}}, [
            marker, data[-32:]]  # fmt: skip
    if kind == "stdout":
        return {"code": f"print({PAD!r} + {rev!r}[::-1])"}, plain
    if kind == "stderr":
        return {"code": f"import sys\nsys.stderr.write({PAD!r} + {rev!r}[::-1])"}, plain
    if kind == "big stdin":  # more than the buffer's slack: it grows
        return {"code": "import sys\nsys.stdin.read()",
                "stdin": "x" * (6 << 20) + marker}, plain  # fmt: skip
    if kind == "big stdout":  # zeroed by dropping its pages
        return {"code": f"print('y' * (3 << 20) + {rev!r}[::-1])"}, plain
    if kind == "timed out":
        return {"code": f"print({rev!r}[::-1], flush=True)\nwhile True: pass",
                "timeout_s": 1}, plain  # fmt: skip
    raise ValueError(kind)


KINDS = ["code", "stdin", "file", "stdout", "stderr", "big stdin", "big stdout", "timed out"]


service, client = module_service("leftovers", slots=1, max_output_bytes=8 << 20)


def _scan(client: SandboxClient, prefix: str, forms: dict[str, str]) -> str:
    needles = {name: form[::-1].encode() for name, form in forms.items()}
    r = client.execute(prefix + SCAN.format(needles=needles), timeout_s=30)
    assert r.status is Status.ok, f"the scan failed: {r.status.value} {r.stderr[-500:]}"
    return r.stdout.strip()


@pytest.mark.parametrize("zygote", list(ZYGOTES))
@pytest.mark.parametrize("kind", KINDS)
def test_the_next_execution_finds_nothing_of_the_last(client: SandboxClient, zygote: str,
                                                      kind: str) -> None:  # fmt: skip
    marker = _marker(kind.replace(" ", ""))
    request, forms = _victim(kind, marker)
    request["code"] = ZYGOTES[zygote] + request["code"]
    victim = client.execute(request["code"], **{k: v for k, v in request.items() if k != "code"})
    assert victim.status in (Status.ok, Status.timeout), victim
    found = _scan(client, ZYGOTES[zygote], {f"form{i}": f for i, f in enumerate(forms)})
    assert found == "CLEAN", f"{kind} of the previous execution found in memory: {found}"
    assert_every_slot_answers(client, f"leftovers: {kind}")


@pytest.mark.parametrize("zygote", list(ZYGOTES))
def test_a_session_history_is_not_left_behind(client: SandboxClient, zygote: str) -> None:
    """A session's cells travel in every later call's request (the replay)."""
    marker = _marker("session")
    session = f"leftover-{zygote}"
    first = client.execute(ZYGOTES[zygote] + f"x = 1  # {PAD} {marker}", session_id=session)
    second = client.execute("y = x + 1", session_id=session)
    assert (first.status, second.status) == (Status.ok, Status.ok)
    assert _scan(client, ZYGOTES[zygote], {"history": marker}) == "CLEAN"
    assert_every_slot_answers(client, "leftovers: session")


def test_the_scan_finds_what_is_there(client: SandboxClient) -> None:
    """The attack works: a marker in its own memory (made from pieces, as a victim's output
    would be) is found."""
    marker = _marker("self")
    code = f"planted = {marker[::-1]!r}[::-1].encode() * 2\n"
    needles = {"self": marker[::-1].encode()}
    r = client.execute(code + SCAN.format(needles=needles), timeout_s=30)
    assert r.stdout.strip() == "LEAK self", r
