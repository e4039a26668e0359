#!/usr/bin/env bash
# Builds the service's image (deploy/Dockerfile) on a Debian machine that reaches Debian's
# packages and a Python package index but no image registry (`make image` runs it):
#   1. the engine: installs Debian's docker.io if no dockerd exists, and gVisor's runsc as its
#      runtime `runsc` (deploy/runsc.sh); starts dockerd if none answers (log:
#      $CACHE/dockerd.log, pid: $CACHE/dockerd.pid);
#   2. the base images, made from Debian's packages with mmdebstrap through this host's own apt
#      sources and loaded with `docker import`: Python for PYTHON_IMAGE, and Redis for the
#      compose shape of the container tests; each tarball is cached in $CACHE and its image
#      is tagged by a hash of what went into it, so a second run makes neither again;
#   3. the image, built with BuildKit's built-in frontend (no frontend image to pull), its pip
#      given this host's pip configuration and certificate authorities as build secrets
#      (deploy/pip_for_build.py says which settings travel), on the host's network.
# Settings (environment): IMAGE (sandbox-service:dev), CACHE (.cache/image), SUITE (bookworm).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-sandbox-service:dev}
CACHE=${CACHE:-.cache/image}
SUITE=${SUITE:-bookworm}
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)

say() { printf '[image %4ss] %s\n' "$SECONDS" "$*" >&2; }
apt_install() {
    [ -n "${APT_UPDATED:-}" ] || { apt-get update -qq; APT_UPDATED=1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}

# The engine's own client: it speaks BuildKit without a buildx plugin (a newer docker CLI
# elsewhere on PATH refuses to build with BuildKit when buildx is missing).
DOCKER=${DOCKER:-/usr/bin/docker}

# ---------------------------------------------------------------- 1. the engine
if ! command -v dockerd > /dev/null || [ ! -x "$DOCKER" ]; then
    say "no Docker engine here: installing Debian's docker.io"
    apt_install docker.io
fi
deploy/runsc.sh
if ! "$DOCKER" info > /dev/null 2>&1; then
    say "starting dockerd (log: $CACHE/dockerd.log)"
    setsid dockerd --pidfile "$CACHE/dockerd.pid" > "$CACHE/dockerd.log" 2>&1 < /dev/null &
    for _ in $(seq 60); do
        "$DOCKER" info > /dev/null 2>&1 && break
        kill -0 $! 2> /dev/null || break
        sleep 1
    done
    if ! "$DOCKER" info > /dev/null 2>&1; then
        say "dockerd did not start; the last lines of its log:"
        tail -n 20 "$CACHE/dockerd.log" >&2
        exit 1
    fi
    say "dockerd is up, pid $(cat "$CACHE/dockerd.pid")"
fi

# ---------------------------------------------------------------- 2. base images
SOURCES=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources)
existing_sources() { for f in "${SOURCES[@]}"; do [ -f "$f" ] && printf '%s\n' "$f"; done; }

# base NAME PACKAGES...: prints the image made from Debian's SUITE with PACKAGES.
base() {
    local name=$1 key tag tarball
    shift
    key=$(printf '%s %s\n' "$SUITE" "$*" | sha256sum | cut -c1-12)
    tag="sandbox-$name-base:$SUITE-$key"
    tarball="$CACHE/$name-$SUITE-$key.tar"
    if ! "$DOCKER" image inspect "$tag" > /dev/null 2>&1; then
        if [ ! -f "$tarball" ]; then
            command -v mmdebstrap > /dev/null || apt_install mmdebstrap
            say "making $tarball from Debian's packages: $*"
            mapfile -t mirrors < <(existing_sources)
            mmdebstrap --quiet --format=tar --variant=minbase --include="$(IFS=,; echo "$*")" \
                --aptopt='Acquire::Languages "none"' \
                --dpkgopt='path-exclude=/usr/share/{doc,man,locale}/*' \
                "$SUITE" "$tarball.part" "${mirrors[@]}" >&2
            mv "$tarball.part" "$tarball"
        fi
        say "importing $tarball as $tag"
        "$DOCKER" import \
            --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'CMD ["/bin/bash"]' "$tarball" "$tag" > /dev/null
    fi
    printf '%s\n' "$tag"
}

PYTHON_IMAGE=$(base python python3 python3-venv libseccomp2 ca-certificates)
REDIS_IMAGE=$(base redis redis-server)
"$DOCKER" tag "$REDIS_IMAGE" sandbox-redis:dev

# ---------------------------------------------------------------- 3. the image
python3 deploy/pip_for_build.py "$CACHE/pip" >&2
say "building $IMAGE on $PYTHON_IMAGE"
DOCKER_BUILDKIT=1 "$DOCKER" build --network host --progress plain \
    --build-arg "PYTHON_IMAGE=$PYTHON_IMAGE" \
    --secret "id=pip.conf,src=$CACHE/pip/pip.conf" \
    --secret "id=pip-ca.crt,src=$CACHE/pip/ca.crt" \
    -f deploy/Dockerfile -t "$IMAGE" .
say "built $IMAGE"
