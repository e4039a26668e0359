"""The one settings object: every knob of the service, from flags and ``SANDBOX_*`` variables.

Built once at start-up and passed to whatever needs it; nothing reads the environment on its
own. Each field's description is the text ``sandbox-service --help`` shows for its flag.
"""

from __future__ import annotations

import ipaddress
import math
import os
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from sandbox_service.executor.warmup import DEFAULT_WARMUP

DEFAULT_PRELOAD = [
    "numpy",
    "sympy",
    "math",
    "cmath",
    "fractions",
    "decimal",
    "itertools",
    "functools",
    "collections",
    "statistics",
    "random",
    "re",
    "json",
]

ISOLATION_LAYERS = ("net", "ipc", "pid", "mount", "uid", "seccomp", "memory", "rlimits")

CommaList = Annotated[list[str], NoDecode]
SLOTS_PER_CORE = 8
# A slot's full and light zygotes and launchers, ~82 MB PSS together (docs/benchmarks.md,
# "Stragglers"), and the API process with the rest: what the automatic memory budget keeps back.
ZYGOTE_MB = 96
SERVICE_MB = 512
MIN_MEMORY_BUDGET_MB = 256


def usable_cpus() -> int:
    """The CPUs this process may use: its affinity mask (a cpuset), or fewer where its cgroup's
    CPU quota says so (a Kubernetes CPU limit sets a quota, not the mask)."""
    cpus = len(os.sched_getaffinity(0)) or 1
    quota = _cpu_quota()
    return max(1, min(cpus, math.ceil(quota))) if quota else cpus


def usable_memory_mb(root: str = "/sys/fs/cgroup", meminfo: str = "/proc/meminfo") -> int:
    """The memory this process may use: its cgroup's limit (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``) where one is set, else the machine's ``MemTotal``."""
    with open(meminfo) as f:
        total = next(int(line.split()[1]) // 1024 for line in f if line.startswith("MemTotal:"))
    for path in (f"{root}/memory.max", f"{root}/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                limit = f.read().strip()
        except OSError:
            continue
        if limit.isdigit():
            return min(total, int(limit) // (1024 * 1024))  # v1's "no limit" is a huge number
    return total


def _cpu_quota(root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs' worth of this cgroup's CPU quota (v2 ``cpu.max``, or v1's CFS files), if set."""
    try:
        with open(f"{root}/cpu.max") as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        try:
            with (
                open(f"{root}/cpu/cpu.cfs_quota_us") as f,
                open(f"{root}/cpu/cpu.cfs_period_us") as g,
            ):
                quota, period = f.read().strip(), g.read().strip()
        except OSError:
            return None
    if quota in ("max", "-1") or not period.isdigit() or not quota.isdigit():
        return None
    return int(quota) / int(period)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SANDBOX_", extra="ignore")

    # Network front.
    host: str = Field(default="127.0.0.1", description="Address the HTTP API listens on.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port the HTTP API listens on.")
    log_level: str = Field(default="info", description="Log level: debug, info, warning, error.")

    # Executor (mechanism).
    slots: int = Field(
        default_factory=lambda: SLOTS_PER_CORE * usable_cpus(),
        ge=1,
        description="Executions that may run at once on this node (one zygote process each): "
        f"{SLOTS_PER_CORE} per core by default, so that programs that sleep or hang past "
        "straggler_after_s hold a slot, not a core.",
    )
    cores: int = Field(
        default_factory=lambda: usable_cpus(),
        ge=1,
        description="Executions that start at full speed at once: a slot takes a job only with "
        "one of these free (default: the CPUs this process may use).",
    )
    starved_extension: float = Field(
        default=0.0,
        ge=0,
        le=3,
        description="Extend an execution's wall-clock limit by the time it waited, runnable, "
        "for a CPU that other executions held (the kernel's run-queue delay of its first "
        "process), by at most this many times timeout_s; 0: the limit is wall clock, as "
        "requested. Exact for programs starved by stragglers, but hung ones then last longer.",
    )
    memory_budget_mb: int | None = Field(
        default=None,
        ge=0,
        description="The memory_mb of the executions running at once, summed, stays under this "
        "(a job waits until enough is free); 0: no bound. Unset: the memory this process may "
        f"use (its cgroup's limit, else the machine's) less {ZYGOTE_MB} MB per slot for the "
        f"zygotes and {SERVICE_MB} MB for the rest, so that slots above cores cannot together "
        "ask for more than the node has.",
    )
    straggler_after_s: float = Field(
        default=0.05,
        ge=0,
        description="An execution still running this long after its start gives its core back "
        "to the next job and runs on beside it; 0: it holds its core to the end.",
    )
    preload: CommaList = Field(
        default_factory=lambda: list(DEFAULT_PRELOAD),
        description="Modules each zygote imports once, so executions start with them loaded.",
    )
    python_path: CommaList = Field(
        default_factory=list,
        description="Directories added to the executions' import path, for packages a task "
        "needs (a reward's scorer, a checker): `pip install --no-deps --target DIR` (they come "
        "before site-packages, so a package there would override the service's own numpy or "
        "sympy). Keep them unwritable by the slots' uids; name a module of one in preload to "
        "import it once per zygote.",
    )
    warmup: str = Field(
        default=DEFAULT_WARMUP,
        description=(
            "Python run once in each zygote after the preloads, so children start warm "
            "(default: common sympy and numpy calls; empty to skip)."
        ),
    )
    require_isolation: CommaList = Field(
        default_factory=list,
        description=(
            "Isolation layers that must be active or start-up fails: "
            f"any of {', '.join(ISOLATION_LAYERS)}."
        ),
    )
    disable_isolation: CommaList = Field(
        default_factory=list,
        description="Isolation layers to turn off even where available (debugging only).",
    )
    uid_base: int = Field(
        default=61000,
        ge=1,
        description=(
            "When run as root, slot i runs code as uid/gid uid_base+i. Each service claims "
            "its range on the host at start: left at the default, a range in use moves to "
            "the next free one; set explicitly, it is a start-up error."
        ),
    )
    light_zygote: bool = Field(
        default=True,
        description=(
            "Give each slot a second zygote that preloads only the standard-library part of "
            "--preload; programs that import nothing else fork from it, which costs less "
            "(docs/benchmarks.md). Not with the docker executor backend."
        ),
    )
    canary_interval_s: float = Field(
        default=60.0,
        ge=0,
        description=(
            "How often each idle slot reruns its canary program (it also runs at start and "
            "after every zygote restart); 0: only then."
        ),
    )
    work_root: str = Field(
        default="/tmp/sandbox-service",
        description="Where working directories live when no private mount namespace is possible.",
    )
    hide_paths: CommaList = Field(
        default_factory=lambda: ["/root", "/home", "/run"],
        description="Host directories executions cannot see (the interpreter's files excepted).",
    )
    tmpfs_mb: int = Field(
        default=256,
        ge=1,
        description="Size of each execution's private /tmp (its working directory), in MiB.",
    )
    max_processes: int = Field(
        default=64, ge=1, description="Processes and threads one execution may have at once."
    )
    max_open_files: int = Field(default=256, ge=16, description="Open files per process.")
    max_file_mb: int = Field(default=64, ge=1, description="Largest file an execution may write.")
    max_output_bytes: int = Field(
        default=256 * 1024,
        ge=1024,
        description="Captured bytes per stream (stdout, stderr); more is truncated and killed.",
    )
    compile_cache_mb: int = Field(
        default=256,
        ge=0,
        description="Compiled programs a worker keeps (cpp, java), by content, in MiB; 0: "
        "none (every request compiles).",
    )

    # API (policy).
    max_timeout_s: float = Field(default=120.0, gt=0, description="Largest timeout_s accepted.")
    max_memory_mb: int = Field(default=8192, gt=0, description="Largest memory_mb accepted.")
    max_code_chars: int = Field(
        default=1_000_000, gt=0, description="Longest program accepted, in characters (413 beyond)."
    )
    max_stdin_chars: int = Field(
        default=16_000_000, gt=0, description="Longest stdin accepted, in characters (413 beyond)."
    )
    max_files_bytes: int = Field(
        default=16 * 1024 * 1024,
        gt=0,
        description="Most decoded bytes of files in one request (413 beyond).",
    )
    max_batch: int = Field(default=1024, ge=1, description="Most requests in one batch.")
    max_body_mb: int = Field(default=64, ge=1, description="Largest HTTP request body, in MiB.")
    max_body_values: int = Field(
        default=262_144,
        ge=1024,
        description="Most JSON values in one request body (a full batch needs ~12 per request); "
        "beyond, 413 before parsing: parsing costs ~150 bytes and ~0.3 us of held GIL per value.",
    )
    max_response_mb: int = Field(
        default=64,
        ge=1,
        description="Largest response of one batch as sent, in MiB: beyond, every output stream "
        "is trimmed to an equal share and flagged *_truncated. A stream alone is at most twice "
        "max_output_bytes as sent.",
    )
    http_read_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A connection that has not sent a whole request (head and body) this long "
        "after it opened or after its last response is closed.",
    )
    max_connections: int = Field(
        default=0,
        ge=0,
        description="Open client connections at most; beyond, the longest idle one is closed "
        "(none idle: the new one is). 0: the descriptor limit less a reserve for slots.",
    )

    # Queue.
    max_queue_depth: int = Field(
        default=100_000, ge=1, description="Jobs waiting or running at most; beyond, 429."
    )
    max_queue_wait_s: float = Field(
        default=300.0,
        gt=0,
        description="A job not started this long after it was queued is answered queue_timeout.",
    )
    retry_after_s: int = Field(default=1, ge=1, description="Retry-After sent with a 429.")
    result_ttl_s: float = Field(
        default=600.0, ge=0, description="How long results are kept for idempotent re-submission."
    )
    graceful_shutdown_s: float = Field(
        default=30.0, ge=0, description="On SIGTERM, how long in-flight work may take to finish."
    )

    # ---- Redis mode: API nodes and worker nodes sharing one Redis (sandbox-service api/worker).
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="Redis the API nodes and worker nodes share (redis:// or rediss:// URL).",
    )
    redis_prefix: str = Field(
        default="sandbox",
        min_length=1,
        description="Prefix of every Redis key (the job stream is <prefix>:jobs).",
    )
    chunk_size: int = Field(
        default=16,
        ge=1,
        le=1024,
        description="Most jobs in one chunk: a worker takes a chunk whole, in one round trip.",
    )
    visibility_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Jobs held by a worker silent this long are reclaimed by another worker.",
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        description="Times a job may start on workers that then vanish; then internal_error.",
    )
    heartbeat_interval_s: float = Field(
        default=2.0,
        gt=0,
        description="How often a worker reports itself and keeps its jobs from being reclaimed.",
    )
    worker_name: str = Field(
        default="", description="Name of this worker node in Redis [default: host-pid]."
    )
    worker_metrics_port: int = Field(
        default=9100,
        ge=0,
        le=65535,
        description="Port of a worker node's /metrics, /healthz and /readyz.",
    )

    @field_validator(
        "preload",
        "python_path",
        "require_isolation",
        "disable_isolation",
        "hide_paths",
        mode="before",
    )
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("require_isolation", "disable_isolation")
    @classmethod
    def _known_layers(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(ISOLATION_LAYERS))
        if unknown:
            raise ValueError(
                f"unknown isolation layer(s) {unknown}; known: {', '.join(ISOLATION_LAYERS)}"
            )
        return value

    def memory_budget(self) -> int:
        """``memory_budget_mb``, or the automatic one where it is unset (0: no bound)."""
        if self.memory_budget_mb is not None:
            return self.memory_budget_mb
        spare = usable_memory_mb() - self.slots * ZYGOTE_MB - SERVICE_MB
        return max(MIN_MEMORY_BUDGET_MB, spare)

    # ---- Sessions and compatibility fronts (session_replay, api/sandboxfusion, api/codejudge)
    session_ttl_s: float = Field(
        default=1800.0, gt=0, description="A session not used for this long is forgotten."
    )
    session_max_cells: int = Field(
        default=64,
        ge=1,
        description="Successful cells one session keeps (every call replays them); beyond, 422.",
    )
    session_max: int = Field(
        default=10_000,
        ge=1,
        description="Sessions kept at once; beyond, the least recently used is forgotten.",
    )
    sandboxfusion_start_slack_s: float = Field(
        default=10.0,
        ge=0,
        description="A /run_code request not started within its run_timeout plus this many "
        "seconds (verl gives up on it at compile_timeout + run_timeout + 10 s) is answered 504, "
        "which verl's client retries, instead of running for a client that has gone.",
    )
    codejudge_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Time limit of one code-judge submission (its MAX_EXECUTION_TIME).",
    )
    codejudge_memory_mb: int = Field(
        default=1024, gt=0, description="Address-space limit of one code-judge submission."
    )
    codejudge_max_output_chars: int = Field(
        default=1000,
        ge=0,
        description="code-judge results keep this many characters of stdout and of stderr "
        "(its MAX_STDOUT_ERROR_LENGTH); 0 keeps all.",
    )

    # ------------------------------------------------------------ executor backend
    # Appended for deployment (issue 6): where zygotes run. `docker` is optional and needs the
    # `docker` extra and a Docker engine; see sandbox_service/executor/docker_backend.py.
    executor_backend: str = Field(
        default="local",
        pattern="^(local|docker)$",
        description=(
            "Where each slot's zygote runs: `local` (a child process) or `docker` (a long-lived "
            "container per slot: no network, read-only root, pids and memory limits)."
        ),
    )
    docker_image: str = Field(
        default="sandbox-service:latest",
        description="Image of the slot containers (docker backend); it must hold this package.",
    )
    docker_runtime: str = Field(
        default="",
        description="OCI runtime of the slot containers, e.g. runsc for gVisor (docker backend; "
        "empty: the engine's default).",
    )
    docker_memory_mb: int = Field(
        default=4096,
        ge=256,
        description="Memory limit of each slot container, swap included, in MiB (docker backend).",
    )
    docker_pids_limit: int = Field(
        default=256,
        ge=16,
        description="Most processes and threads in each slot container (docker backend).",
    )
    docker_cpus: float = Field(
        default=1.0, gt=0, description="CPUs each slot container may use (docker backend)."
    )

    # ------------------------------------------------------------ tenants (issue 16)
    # Auth is off unless a key file is given: then every request is the tenant `default`.
    api_keys_file: str = Field(
        default="",
        description="File of API keys ('sha256:<hex> tenant [options]' lines, see `sandbox-service "
        "keys`); when set, every route but /healthz and /readyz needs 'Authorization: Bearer "
        "KEY'. Reloaded when it changes and on SIGHUP. Empty: auth off, one tenant 'default'.",
    )
    auth_max_failures: int = Field(
        default=20,
        ge=1,
        description="Failed authentications one source address may make per auth_failure_window_s; "
        "beyond, it is answered 429 until the window has passed.",
    )
    auth_failure_window_s: float = Field(
        default=60.0, gt=0, description="The window of auth_max_failures, in seconds."
    )
    metrics_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="With auth on, serve /metrics on this port of `host` without a key (for a "
        "scraper on a private network) instead of behind an admin key on the API port. "
        "0: on the API port.",
    )
    sandboxfusion_tenant: str = Field(
        default="",
        description="Auth on: requests to the SandboxFusion routes (/run_code, /run_jupyter) that "
        "carry no key run as this tenant (one of the key file's), for clients that send no "
        "headers. Empty: they need a key.",
    )
    sandboxfusion_networks: CommaList = Field(
        default_factory=list,
        description="With sandboxfusion_tenant: only sources in these networks (CIDRs, e.g. "
        "10.0.0.0/8) may go without a key. Empty: any source.",
    )
    codejudge_tenant: str = Field(
        default="",
        description="As sandboxfusion_tenant, for the code-judge routes (/run..., /judge...).",
    )
    codejudge_networks: CommaList = Field(
        default_factory=list,
        description="As sandboxfusion_networks, for the code-judge routes.",
    )
    tenant_reserve_slots: int = Field(
        default=1,
        ge=0,
        description="While several tenants are active, a tenant beyond its weighted share of the "
        "slots leaves this many free ones to the others (their latency beside a flood). "
        "0: any free slot goes to whoever has work (embedded mode; see docs/tenants.md).",
    )
    tenant_active_window_s: float = Field(
        default=5.0,
        gt=0,
        description="A tenant counts as active for fair sharing this long after its last job.",
    )
    max_tenant_labels: int = Field(
        default=100,
        ge=1,
        description="Distinct tenant labels in /metrics at most; later tenants count as 'other'.",
    )
    redis_username: str = Field(
        default="", description="Redis ACL user (instead of one in redis_url)."
    )
    redis_password_file: str = Field(
        default="",
        description="File holding the Redis password (its first line), instead of one in "
        "redis_url: a mounted Secret.",
    )
    redis_tls_ca_file: str = Field(
        default="", description="CA bundle that signed Redis's certificate (rediss:// URLs)."
    )
    redis_tls_cert_file: str = Field(
        default="", description="Client certificate for Redis, if it asks for one (rediss://)."
    )
    redis_tls_key_file: str = Field(
        default="", description="The client certificate's private key (rediss://)."
    )
    redis_sentinels: CommaList = Field(
        default_factory=list,
        description="Redis Sentinels (host:port,...) to ask for the primary, followed across "
        "failovers; redis_url then gives only the scheme, credentials and database.",
    )
    redis_sentinel_master: str = Field(
        default="sandbox", min_length=1, description="The primary's name in the Sentinels."
    )
    redis_sentinel_password_file: str = Field(
        default="",
        description="File holding the Sentinels' own password (their requirepass), if they "
        "have one.",
    )

    @field_validator("redis_sentinels", mode="before")
    @classmethod
    def _split_sentinels(cls, value: object) -> object:
        return cls._split(value)

    @field_validator("redis_sentinels")
    @classmethod
    def _sentinel_addresses(cls, value: list[str]) -> list[str]:
        for address in value:
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"{address!r} is not host:port")
        return value

    @field_validator("sandboxfusion_networks", "codejudge_networks", mode="before")
    @classmethod
    def _split_networks(cls, value: object) -> object:
        return cls._split(value)

    @field_validator("sandboxfusion_networks", "codejudge_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for network in value:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError as exc:
                raise ValueError(f"{network!r} is not a network: {exc}") from None
        return value
