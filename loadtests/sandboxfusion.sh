#!/usr/bin/env bash
# Install SandboxFusion from its public repository and serve it on loopback with its default local config.
#
#   loadtests/sandboxfusion.sh install          # once: source, venvs, dependencies under $SF_DIR
#   loadtests/sandboxfusion.sh serve [PORT]     # in the foreground on 127.0.0.1:PORT (8080)
#
# A documented command for loadtests/bench_sandboxfusion.py, not a CI step. Settings:
#   SF_DIR   where everything goes (/tmp/sandboxfusion); delete it to start again
#   SF_GIT   a git directory holding SandboxFusion (a mirror); unset: a shallow clone of
#            https://github.com/bytedance/SandboxFusion
#   SF_REF   the commit or branch to take (HEAD)
#   SF_PYTHON  a Python 3.11 or later, as its pyproject asks (python3.11, else python3)
#
# What SandboxFusion is served with: its own `sandbox/configs/local.yaml`, unchanged (no
# SANDBOX_CONFIG set): `isolation: none` (programs run as plain subprocesses of the server, no
# sandbox), `max_concurrency: 34`, no database. Its command is its Makefile's `run`:
# `uvicorn sandbox.server.server:app`.
#
# Workarounds, each because this machine is not its Docker image:
# - Its dependencies come from its poetry.lock through poetry (`poetry install --only main
#   --no-root`), poetry itself pip-installed into a venv of its own; PyPI is the only index.
# - Its Python runner finds "conda" by walking up from the server's interpreter to a folder
#   holding `condabin/`, then runs `source ROOT/bin/activate sandbox-runtime && which python`.
#   There is no conda here, so a fake conda root is made: ROOT/condabin/ (empty),
#   ROOT/bin/activate (a 3-line script putting ROOT/envs/NAME/bin first on PATH), the server's
#   venv at ROOT/envs/sandbox, and the programs' interpreter, a plain venv with nothing
#   installed, at ROOT/envs/sandbox-runtime. Its image's runtime has numpy and more installed;
#   the benchmark's programs import nothing.
# - HOME is an empty folder under SF_DIR while it installs and serves, so that it reads no
#   caller's configuration (pip, poetry, Hugging Face caches) and writes nothing into it.
# - Its server mounts its documentation site, built with npm in its image, from docs/build and
#   refuses to start without it: an empty docs/build is made (its web pages are not served).
# - Only the Python runner is set up: no Node, Go, Java, Lean or the rest of its image.
set -euo pipefail

SF_DIR=${SF_DIR:-/tmp/sandboxfusion}
SF_REF=${SF_REF:-HEAD}
ROOT=$SF_DIR/conda
SRC=$SF_DIR/src
export HOME=$SF_DIR/home

python_for_it() {
    if [ -n "${SF_PYTHON:-}" ]; then echo "$SF_PYTHON"; return; fi
    for candidate in python3.11 python3.12 python3; do
        if command -v "$candidate" >/dev/null; then command -v "$candidate"; return; fi
    done
    echo "no python3 found" >&2
    exit 1
}

install() {
    local python
    python=$(python_for_it)
    mkdir -p "$HOME" "$ROOT/condabin" "$ROOT/bin" "$ROOT/envs"
    if [ ! -d "$SRC" ]; then
        local tmp=$SF_DIR/src.tmp
        rm -rf "$tmp" && mkdir -p "$tmp"
        if [ -n "${SF_GIT:-}" ]; then
            git --git-dir="$SF_GIT" archive "$SF_REF" | tar -x -C "$tmp"
            git --git-dir="$SF_GIT" rev-parse "$SF_REF" >"$tmp/.commit"
        else
            rmdir "$tmp"
            git clone --quiet --depth 1 https://github.com/bytedance/SandboxFusion "$tmp"
            git -C "$tmp" rev-parse HEAD >"$tmp/.commit"
            rm -rf "$tmp/.git"
        fi
        mv "$tmp" "$SRC"
    fi
    mkdir -p "$SRC/docs/build"  # its server mounts its built docs site there; not built here
    cat >"$ROOT/bin/activate" <<EOF
# fake conda activate (loadtests/sandboxfusion.sh): ROOT/envs/NAME/bin first on PATH
export CONDA_DEFAULT_ENV="\${1:-base}"
export PATH="$ROOT/envs/\${1:-base}/bin:\$PATH"
EOF
    [ -x "$ROOT/envs/sandbox/bin/python" ] || "$python" -m venv "$ROOT/envs/sandbox"
    [ -x "$ROOT/envs/sandbox-runtime/bin/python" ] || "$python" -m venv "$ROOT/envs/sandbox-runtime"
    [ -x "$SF_DIR/poetry/bin/poetry" ] || {
        "$python" -m venv "$SF_DIR/poetry"
        "$SF_DIR/poetry/bin/pip" install --quiet poetry
    }
    (cd "$SRC" && VIRTUAL_ENV=$ROOT/envs/sandbox PATH=$ROOT/envs/sandbox/bin:$PATH \
        "$SF_DIR/poetry/bin/poetry" install --only main --no-root --no-interaction)
    echo "SandboxFusion $(cat "$SRC/.commit") installed in $SF_DIR"
}

serve() {
    local port=${1:-8080}
    [ -d "$SRC" ] || { echo "not installed: run '$0 install' first" >&2; exit 1; }
    cd "$SRC"
    unset SANDBOX_CONFIG
    exec "$ROOT/envs/sandbox/bin/python" -m uvicorn sandbox.server.server:app \
        --host 127.0.0.1 --port "$port"
}

case "${1:-}" in
    install) install ;;
    serve) shift; serve "$@" ;;
    *) echo "usage: $0 install | serve [PORT]" >&2; exit 2 ;;
esac
