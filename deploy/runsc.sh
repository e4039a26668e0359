#!/usr/bin/env bash
# gVisor for the Docker engine: installs Debian's runsc (release 20221219 in Debian 12) if
# absent and registers it as the runtime `runsc` in /etc/docker/daemon.json (deploy/
# runsc_runtime.py says which arguments and why). A running dockerd is told to reload its
# configuration (SIGHUP: `runtimes` is reloaded live, its containers keep running); one not
# started yet reads it when it starts. `make image` and `make test-image` run it.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[runsc] %s\n' "$*" >&2; }
if ! command -v runsc > /dev/null; then
    say "installing Debian's runsc (gVisor)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runsc >&2
fi
if python3 deploy/runsc_runtime.py /etc/docker/daemon.json "$(command -v runsc)"; then
    if pid=$(pidof dockerd); then
        say "registered runsc; dockerd (pid $pid) reloads its runtimes (SIGHUP)"
        kill -HUP $pid
        sleep 1
    fi
fi
