"""Rendering, validating and reading the deployment files, for the deploy tests.

Rendering uses ``kubectl kustomize`` (or a standalone ``kustomize``) when one is on PATH; the
plain resource files are validated either way. Validation is offline: Kubernetes kinds against
the schemas that ``kubernetes-validate`` ships, in strict mode; the two CRDs the manifests
use (KEDA ScaledObject and TriggerAuthentication, Prometheus Operator ServiceMonitor) against the subset schemas in
``schemas/``, which refer to the same Kubernetes definitions.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate.utils import all_versions
from referencing import Registry, Resource

from sandbox_service.metrics import Metrics
from sandbox_service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
DEPLOY = ROOT / "deploy"
SCHEMAS = Path(__file__).parent / "schemas"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if p.is_dir())

# The oldest Kubernetes the manifests target (the preStop `sleep` action is on by default from
# 1.30) and the newest whose schemas kubernetes-validate ships.
K8S_VERSIONS = ("1.30.0", all_versions()[-1])

CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject-keda.sh-v1alpha1.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "triggerauthentication-keda.sh-v1alpha1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring.coreos.com-v1.json",
}

Doc = dict[str, Any]

# What the isolation layers of a worker use (deploy/README.md explains each).
WORKER_CAPABILITIES = {"SETUID", "SETGID", "KILL", "CHOWN", "DAC_OVERRIDE", "FOWNER", "SYS_ADMIN"}
# A stopping worker lets running jobs finish (graceful_shutdown_s; a run may take max_timeout_s),
# then waits out its last fetch and settles what it holds (10 s at most), then stops its slots.
WORKER_DRAIN_MARGIN_S = 25
WORKER_METRICS_PORT = 9100  # the default of the worker's metrics port
# Settings that arrive with the Redis scale-out (API and worker nodes); until that lands in
# sandbox_service/settings.py the deployment may already name them.
REDIS_SETTINGS = {"redis_url", "worker_metrics_port"}


# ---------------------------------------------------------------- rendering


def kustomize_command() -> list[str] | None:
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    return None


@functools.cache
def render(path: str) -> tuple[Doc, ...]:
    """The documents ``kustomize build`` makes of a kustomization directory."""
    cmd = kustomize_command()
    assert cmd is not None, "no kustomize on PATH"
    out = subprocess.run(
        [*cmd, str(K8S / path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, f"kustomize failed for {path}:\n{out.stderr}"
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def load_yaml(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def resource_files() -> Iterator[Path]:
    """Every file a kustomization or component lists under ``resources`` (not patches)."""
    for kfile in sorted(K8S.rglob("kustomization.yaml")):
        for entry in yaml.safe_load(kfile.read_text()).get("resources", []):
            target = (kfile.parent / entry).resolve()
            if target.is_file():
                yield target


# ---------------------------------------------------------------- validation


def _package_schemas(version: str) -> Path:
    package = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    return package / f"v{version}-local-strict"


@functools.cache
def _registry(version: str) -> Registry:
    """The Kubernetes definitions every schema refers to, as kubernetes-validate loads them."""
    definitions = json.loads((_package_schemas(version) / "_definitions.json").read_text())
    return Resource.from_contents(definitions) @ Registry()


def _schema_file(api_version: str, kind: str, version: str) -> Path:
    """Where a kind's schema is: the package's own files for Kubernetes kinds (named as
    kubernetes-validate names them: ``rbac.authorization.k8s.io/v1`` -> ``rbac-v1``), ours
    for the CRDs."""
    crd = CRD_SCHEMAS.get((api_version, kind))
    if crd is not None:
        return SCHEMAS / crd
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    return _package_schemas(version) / f"{kind.lower()}-{group_version}.json"


@functools.cache
def _validator(api_version: str, kind: str, version: str) -> jsonschema.Draft202012Validator:
    path = _schema_file(api_version, kind, version)
    if not path.is_file():
        raise LookupError(f"no schema for {kind} {api_version} in Kubernetes {version}")
    schema = json.loads(path.read_text())
    return jsonschema.Draft202012Validator(schema, registry=_registry(version))


def validate(doc: Doc, version: str) -> None:
    """Raise if ``doc`` does not validate strictly against Kubernetes ``version``; a kind
    without a schema is an error too (LookupError), never a silent pass."""
    _validator(doc["apiVersion"], doc["kind"], version).validate(doc)


# ---------------------------------------------------------------- reading


def of_kind(docs: tuple[Doc, ...], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: tuple[Doc, ...], kind: str, name: str) -> Doc:
    [doc] = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return doc


def pod_templates(docs: tuple[Doc, ...]) -> list[tuple[str, Doc]]:
    """(workload name, pod template) of every workload."""
    kinds = ("Deployment", "StatefulSet", "DaemonSet", "Job")
    return [(d["metadata"]["name"], d["spec"]["template"]) for d in docs if d["kind"] in kinds]


def container(docs: tuple[Doc, ...], deployment: str) -> Doc:
    [c] = named(docs, "Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    return c


def env_of(c: Doc) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in c.get("env", [])}


def settings_of(c: Doc) -> Settings:
    """The settings object the container's SANDBOX_* variables make (defaults elsewhere)."""
    env = env_of(c)
    fields: dict[str, Any] = {k.removeprefix("SANDBOX_").lower(): v for k, v in env.items()
                              if k.startswith("SANDBOX_")}  # fmt: skip
    return Settings(**fields)


def setting(c: Doc, name: str) -> Any:
    return getattr(settings_of(c), name)


def selects(selector: Doc, labels: dict[str, str]) -> bool:
    """Does a LabelSelector (matchLabels and matchExpressions) select these labels?"""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        value, op = labels.get(expr["key"]), expr["operator"]
        if op == "In" and value not in expr["values"]:
            return False
        if op == "NotIn" and value in expr["values"]:
            return False
        if op == "Exists" and value is None:
            return False
        if op == "DoesNotExist" and value is not None:
            return False
    return True


# ---------------------------------------------------------------- what the service exports


@functools.cache
def exported_series() -> frozenset[str]:
    """Every series name the service's metrics registry can expose, read from the code."""
    names = set()
    for family in Metrics().registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{s}" for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    return frozenset(names)


SERIES = re.compile(r"\bsandbox_[a-z0-9_]+")


def series_in(text: str) -> set[str]:
    return set(SERIES.findall(text))


def load_script(name: str) -> Any:
    """A standalone script of deploy/ (the health check, the build's pip config), as a module."""
    spec = importlib.util.spec_from_file_location(Path(name).stem, DEPLOY / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
