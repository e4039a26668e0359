"""Run every attack against each isolation mode this machine can run, and write the table.

    python -m tests.security.report                       # root mode only
    python -m tests.security.report --nonroot-python /var/tmp/sbx-nonroot/bin/python \\
        --write docs/SECURITY.md

The non-root mode runs the service as ``nobody`` through ``setpriv`` with a Python that user
can read (this machine's pyenv lives under /root); make one with
``/usr/bin/python3 -m venv /var/tmp/sbx-nonroot && /var/tmp/sbx-nonroot/bin/pip install .``.
The table goes between the attack-table markers of the file given to ``--write``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from sandbox_service.client import Retry, SandboxClient
from sandbox_service.service_process import start
from tests.security.attacks import ALL, Target

START, END = "<!-- attack-table:start -->", "<!-- attack-table:end -->"


@dataclass
class Mode:
    name: str
    python: list[str]
    settings: dict[str, Any]


def run_mode(mode: Mode) -> tuple[dict[str, str], dict[str, Any]]:
    """{attack name: observed outcome}, and the isolation the service reported."""
    log = os.path.join(tempfile.gettempdir(), f"attacks-{mode.name}.log")
    service = start(log, python=mode.python, slots=2, max_timeout_s=30, **mode.settings)
    observed: dict[str, str] = {}
    try:
        with SandboxClient(service.url, retry=Retry(attempts=2), concurrency=1) as client:
            status = client.status()
            target = Target(service.port, service.process.pid, status.slots[0].pid or 0)
            for attack in ALL:
                r = attack.run(client, target)
                if attack.contained(r):
                    observed[attack.name] = f"contained ({r.status.value})"
                else:
                    shown = (r.stdout or r.stderr).strip().splitlines()[-1:] or [""]
                    observed[attack.name] = f"**not contained**: {r.status.value} {shown[0][:60]}"
                after = client.execute("print('next')")
                if after.stdout != "next\n":
                    observed[attack.name] += "; **next execution failed**"
            isolation: dict[str, Any] = dict(client.status().isolation)
    finally:
        service.stop()
    return observed, isolation


def table(results: dict[str, tuple[dict[str, str], dict[str, object]]]) -> str:
    modes = list(results)
    lines = ["| attack | category | expected | " + " | ".join(modes) + " |",
             "|---|---|---|" + "---|" * len(modes)]  # fmt: skip
    for attack in ALL:
        cells = [results[m][0].get(attack.name, "not run") for m in modes]
        lines.append(f"| {attack.name} | {attack.category} | {attack.expected} | "
                     + " | ".join(cells) + " |")  # fmt: skip
    lines.append("")
    for mode, (_, isolation) in results.items():
        active = ", ".join(k for k, v in isolation.items() if v is True)
        lines.append(f"- **{mode}**: layers active: {active}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nonroot-python", help="a Python the nobody user can run, with this package"
    )
    parser.add_argument("--write", help="markdown file whose attack table to replace")
    args = parser.parse_args(argv)
    modes = [Mode("root, namespaces + seccomp", [sys.executable], {})]
    if args.nonroot_python:
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
                     args.nonroot_python]  # fmt: skip
        work_root = tempfile.mkdtemp(prefix="sbx-nonroot-")
        os.chmod(work_root, 0o777)
        modes.append(Mode("non-root fallback", as_nobody, {"work_root": work_root}))
    results = {mode.name: run_mode(mode) for mode in modes}
    text = table(results)
    print(text)
    if args.write:
        with open(args.write) as f:
            doc = f.read()
        pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
        with open(args.write, "w") as f:
            f.write(pattern.sub(lambda _: f"{START}\n{text}\n{END}", doc))
    escaped = any("not contained" in o for o in results[modes[0].name][0].values())
    return 1 if escaped else 0


if __name__ == "__main__":
    sys.exit(main())
