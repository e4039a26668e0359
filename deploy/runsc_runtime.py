"""Registers gVisor's runsc as the Docker engine's runtime `runsc` in daemon.json (kept as is
otherwise); exit status 0 when the file changed (the engine must reload it), 1 when it
already said so.

The arguments are what this release (Debian 12's runsc, 20221219) needs on a host like ours:
`--platform=ptrace` (no KVM in a VM without nested virtualisation; `systrap` is newer than
this release) and `--network=host` (its own network stack needs to open the container's
network namespace through /proc/1/ns/net, which root cannot here).
Usage: python3 deploy/runsc_runtime.py /etc/docker/daemon.json /usr/bin/runsc
"""

from __future__ import annotations

import json
import os
import sys

ARGS = ["--platform=ptrace", "--network=host"]


def main(path: str, runsc: str) -> int:
    try:
        with open(path) as f:
            config = json.load(f)
    except FileNotFoundError:
        config = {}
    wanted = {"path": runsc, "runtimeArgs": ARGS}
    runtimes = config.setdefault("runtimes", {})
    if runtimes.get("runsc") == wanted:
        return 1
    runtimes["runsc"] = wanted
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".part", "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    os.replace(path + ".part", path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
