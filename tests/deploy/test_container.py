"""The Dockerfile (linted, and its commands checked against the CLI), the compose file (valid
against the Compose specification) and the image's health check (run against a real socket)."""

from __future__ import annotations

import fnmatch
import http.server
import json
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from sandbox_service import cli
from sandbox_service.http_server import DELIVERY_GRACE_S
from sandbox_service.settings import Settings
from tests.deploy.manifests import (
    DEPLOY,
    OVERLAYS,
    REDIS_SETTINGS,
    ROOT,
    WORKER_CAPABILITIES,
    WORKER_DRAIN_MARGIN_S,
    WORKER_METRICS_PORT,
    container,
    kustomize_command,
    load_script,
    render,
)

DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "compose.yaml"
ROLES = {"serve", "api", "worker"}


# ---------------------------------------------------------------- Dockerfile


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def final_stage(parsed: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last = max(i for i, (word, _) in enumerate(parsed) if word == "FROM")
    return parsed[last:]


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list), f"use the exec form: {args}"
    return value


def test_hadolint_is_clean() -> None:
    # The venv's bin folder may not be on PATH when pytest runs as `.venv/bin/python -m pytest`.
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if hadolint is None:
        pytest.skip("hadolint not installed (the `test` extra installs it on x86-64 Linux)")
    out = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerfile_is_multi_stage_pinned_and_non_root() -> None:
    parsed = instructions(DOCKERFILE.read_text())
    froms = [args for word, args in parsed if word == "FROM"]
    assert len(froms) >= 2, "build and runtime stages"
    [base] = [args for word, args in parsed if word == "ARG" and args.startswith("PYTHON_IMAGE=")]
    assert re.fullmatch(r"PYTHON_IMAGE=python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base)
    runtime = final_stage(parsed)
    [user] = [args for word, args in runtime if word == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "non-root by default"
    assert any(word == "HEALTHCHECK" for word, _ in runtime)
    assert not any(word == "ADD" for word, _ in parsed), "COPY, not ADD"


def _dockerignore_allows(path: str) -> bool:
    """BuildKit's rule for deploy/Dockerfile.dockerignore: the last matching pattern wins."""
    allowed = True
    for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate, pattern = line.startswith("!"), line.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
            allowed = negate
    return allowed


def test_every_copied_path_exists_and_reaches_the_build_context() -> None:
    for word, args in instructions(DOCKERFILE.read_text()):
        if word != "COPY" or args.startswith("--from"):
            continue
        *sources, _ = shlex.split(args)
        for source in sources:
            assert (ROOT / source).exists(), source
            assert _dockerignore_allows(source.rstrip("/")), f"{source} is dockerignored"
    assert not _dockerignore_allows(".venv")
    assert not _dockerignore_allows("tests")


def test_entrypoint_is_the_console_script_and_cmd_a_command() -> None:
    runtime = final_stage(instructions(DOCKERFILE.read_text()))
    [entry] = [exec_form(args) for word, args in runtime if word == "ENTRYPOINT"]
    [cmd] = [exec_form(args) for word, args in runtime if word == "CMD"]
    scripts = {e.name: e.value for e in metadata.entry_points(group="console_scripts")}
    assert entry == ["sandbox-service"]
    assert scripts["sandbox-service"] == "sandbox_service.cli:main"
    assert cmd[0] in cli.COMMANDS
    cli.parser().parse_args(cmd)
    [health] = [exec_form(args.removeprefix("CMD").strip()) for word, args in runtime
                if word == "HEALTHCHECK" for args in [args.split(" CMD ", 1)[1]]]  # fmt: skip
    copied = {shlex.split(a)[-1]: shlex.split(a)[0] for w, a in runtime if w == "COPY"
              and not a.startswith("--from")}  # fmt: skip
    assert health[0] == "python3" and copied[health[1]] == "deploy/healthcheck.py"


def test_image_environment_and_ports_match_the_settings() -> None:
    runtime = final_stage(instructions(DOCKERFILE.read_text()))
    pairs = [p.split("=", 1) for w, a in runtime if w == "ENV" for p in shlex.split(a)]
    env = {k: v for k, v in pairs}
    sandbox = {k.removeprefix("SANDBOX_").lower() for k in env if k.startswith("SANDBOX_")}
    assert sandbox - REDIS_SETTINGS <= set(Settings.model_fields)
    assert env["SANDBOX_HOST"] == "0.0.0.0"
    exposed = {int(p) for w, a in runtime if w == "EXPOSE" for p in a.split()}
    metrics = int(env.get("SANDBOX_WORKER_METRICS_PORT", WORKER_METRICS_PORT))
    assert {int(env["SANDBOX_PORT"]), metrics} == exposed


# ---------------------------------------------------------------- compose


INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(value: Any) -> Any:
    """What `docker compose config` does to ${VAR:-default} with an empty environment."""
    if isinstance(value, str):
        return INTERPOLATION.sub(lambda m: m.group(2) or "", value)
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    return value


def compose() -> dict[str, Any]:
    doc = interpolate(yaml.safe_load(COMPOSE.read_text()))
    # Compose merges `<<: *anchor` itself; YAML already did. Numbers stay strings here, as
    # the spec allows for interpolated fields.
    return doc


def test_compose_file_is_valid_against_the_compose_specification() -> None:
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads((vendor / "compose-spec.json").read_text())
    doc = compose()
    doc["services"]["worker"]["deploy"]["replicas"] = int(
        doc["services"]["worker"]["deploy"]["replicas"]
    )
    jsonschema.validators.validator_for(schema)(schema).validate(doc)


def _stop_grace_s(service: dict[str, Any]) -> int:
    value = service["stop_grace_period"]
    assert value.endswith("s")
    return int(value[:-1])


def _settings(service: dict[str, Any]) -> Settings:
    env = service.get("environment", {})
    return Settings(**{k.removeprefix("SANDBOX_").lower(): v for k, v in env.items()
                       if k.startswith("SANDBOX_")})  # fmt: skip


def test_compose_services_are_confined_like_the_cluster_ones() -> None:
    services = compose()["services"]
    for name, svc in services.items():
        assert "privileged" not in svc, name
        assert svc.get("network_mode") != "host", name
    for name in ("api", "worker", "redis"):
        svc = services[name]
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in svc["security_opt"], name
    assert "cap_add" not in services["api"]
    assert set(services["worker"]["cap_add"]) <= WORKER_CAPABILITIES
    assert services["worker"]["user"] == "0:0"
    assert {v["target"] for v in services["worker"]["volumes"]} == {"/tmp"}
    worker = _settings(services["worker"])
    assert worker.graceful_shutdown_s >= worker.max_timeout_s
    assert _stop_grace_s(services["worker"]) >= worker.graceful_shutdown_s + WORKER_DRAIN_MARGIN_S
    api = _settings(services["api"])
    assert _stop_grace_s(services["api"]) >= api.graceful_shutdown_s + DELIVERY_GRACE_S
    assert int(services["worker"]["deploy"]["replicas"]) >= 1


def test_prometheus_scrapes_every_role_where_it_listens() -> None:
    services = compose()["services"]
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = {
        (sd["names"][0], sd["port"])
        for job in config["scrape_configs"]
        for sd in job["dns_sd_configs"]
    }
    api_port = int(services["api"]["environment"]["SANDBOX_PORT"])
    worker_env = services["worker"]["environment"]
    worker_port = int(worker_env.get("SANDBOX_WORKER_METRICS_PORT", WORKER_METRICS_PORT))
    assert targets == {("api", api_port), ("worker", worker_port)}
    assert all(job["metrics_path"] == "/metrics" for job in config["scrape_configs"])
    mounted = services["prometheus"]["volumes"][0].split(":")[0]
    assert (DEPLOY / mounted).resolve() == (DEPLOY / "prometheus.yml").resolve()


# ---------------------------------------------------------------- commands, everywhere


def command_lines() -> Iterator[tuple[str, list[str]]]:
    """Every `sandbox-service` command line the deployment runs, with where it is."""
    runtime = final_stage(instructions(DOCKERFILE.read_text()))
    yield "Dockerfile CMD", next(exec_form(a) for w, a in runtime if w == "CMD")
    for name, svc in yaml.safe_load(COMPOSE.read_text())["services"].items():
        if "command" in svc and name not in ("redis", "prometheus"):
            yield f"compose {name}", [str(interpolate(a)) for a in svc["command"]]
    if kustomize_command() is not None:
        for overlay in OVERLAYS:
            docs = render(f"overlays/{overlay}")
            for deployment in ("sandbox-api", "sandbox-worker"):
                yield f"{overlay} {deployment}", container(docs, deployment)["args"]


COMMAND_LINES = list(command_lines())


@pytest.mark.parametrize(("where", "argv"), COMMAND_LINES, ids=[w for w, _ in COMMAND_LINES])
def test_command_lines_parse_with_the_cli(where: str, argv: list[str]) -> None:
    assert argv[0] in ROLES, where
    if argv[0] not in cli.COMMANDS:
        pytest.skip(f"`{argv[0]}` is not a command of this CLI yet (Redis scale-out not merged)")
    args = cli.parser().parse_args(argv)
    cli.settings_from(args)


def test_sandbox_variables_are_settings() -> None:
    names = set()
    for svc in yaml.safe_load(COMPOSE.read_text())["services"].values():
        names |= {k for k in svc.get("environment", {}) if k.startswith("SANDBOX_")}
    if kustomize_command() is not None:
        for overlay in OVERLAYS:
            docs = render(f"overlays/{overlay}")
            for deployment in ("sandbox-api", "sandbox-worker"):
                names |= {e["name"] for e in container(docs, deployment)["env"]
                          if e["name"].startswith("SANDBOX_")}  # fmt: skip
    fields = {n.removeprefix("SANDBOX_").lower() for n in names}
    assert fields - REDIS_SETTINGS <= set(Settings.model_fields), fields - set(
        Settings.model_fields
    )


def test_redis_settings_have_landed() -> None:
    missing = REDIS_SETTINGS - set(Settings.model_fields)
    if missing:
        pytest.skip(f"settings {sorted(missing)} arrive with the Redis scale-out")


# ---------------------------------------------------------------- health check


def _load_healthcheck() -> Any:
    return load_script("healthcheck.py")


class _Readyz(http.server.BaseHTTPRequestHandler):
    """A node that is alive; ready unless its class says otherwise."""

    ready = True

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self.send_response(200)
        elif self.path == "/readyz":
            self.send_response(200 if self.ready else 503)
        else:
            self.send_response(404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class _Unready(_Readyz):
    ready = False


def _serve(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def ready_port() -> Iterator[int]:
    yield from _serve(_Readyz)


@pytest.fixture
def unready_port() -> Iterator[int]:
    yield from _serve(_Unready)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_healthcheck_finds_the_port_that_answers(
    ready_port: int, unready_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    health = _load_healthcheck()
    assert health.ports({}) == [8000, 9100]
    monkeypatch.setenv("SANDBOX_PORT", str(_closed_port()))
    monkeypatch.setenv("SANDBOX_WORKER_METRICS_PORT", str(ready_port))
    assert health.main() == 0  # a worker: only the metrics port answers
    monkeypatch.setenv("SANDBOX_PORT", str(ready_port))
    monkeypatch.setenv("SANDBOX_WORKER_METRICS_PORT", str(_closed_port()))
    assert health.main() == 0  # an API node
    monkeypatch.setenv("SANDBOX_PORT", str(_closed_port()))
    monkeypatch.setenv("SANDBOX_WORKER_METRICS_PORT", str(_closed_port()))
    assert health.main() == 1


def test_a_node_that_is_alive_but_cannot_execute_is_unhealthy(
    unready_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/healthz answers 200 but /readyz 503 (no slot passed its canary): not healthy."""
    health = _load_healthcheck()
    monkeypatch.setenv("SANDBOX_PORT", str(unready_port))
    monkeypatch.setenv("SANDBOX_WORKER_METRICS_PORT", str(_closed_port()))
    assert health.main() == 1
    assert health.main(["/healthz"]) == 0  # the liveness probe's question: alive, it is
