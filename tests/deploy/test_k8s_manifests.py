"""Every Kubernetes manifest renders and validates offline, strictly, and hangs together."""

from __future__ import annotations

import copy

import jsonschema
import kubernetes_validate
import pytest

from tests.deploy.manifests import (
    K8S_VERSIONS,
    OVERLAYS,
    Doc,
    container,
    kustomize_command,
    load_yaml,
    named,
    of_kind,
    pod_templates,
    render,
    resource_files,
    selects,
    validate,
)

needs_kustomize = pytest.mark.skipif(
    kustomize_command() is None, reason="no kubectl or kustomize on PATH: cannot render overlays"
)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_plain_resource_files_validate(version: str) -> None:
    """Validated even where kustomize is missing: every file listed under `resources`."""
    files = list(resource_files())
    assert len(files) >= 8
    for path in files:
        for doc in load_yaml(path):
            validate(doc, version)


@needs_kustomize
@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_overlay_renders_and_validates(overlay: str, version: str) -> None:
    docs = render(f"overlays/{overlay}")
    for doc in docs:
        validate(doc, version)
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "Deployment", "Service", "HorizontalPodAutoscaler"} <= kinds
    assert {"PodDisruptionBudget", "NetworkPolicy", "ConfigMap"} <= kinds


def test_validation_is_strict() -> None:
    """The checks above would catch a misspelt field, in core kinds and in the CRDs alike."""
    deployment = load_yaml(next(p for p in resource_files() if p.name == "worker.yaml"))[0]
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(jsonschema.ValidationError):
        validate(bad, K8S_VERSIONS[0])
    scaled = load_yaml(next(p for p in resource_files() if p.name == "scaledobject.yaml"))[0]
    bad = copy.deepcopy(scaled)
    bad["spec"]["triggers"][0]["metadata"]["lagCount"] = 8  # the CRD wants strings
    with pytest.raises(jsonschema.ValidationError):
        validate(bad, K8S_VERSIONS[0])
    bad = copy.deepcopy(scaled)
    bad["spec"]["pollingIntervall"] = 5
    with pytest.raises(jsonschema.ValidationError):
        validate(bad, K8S_VERSIONS[0])
    with pytest.raises(LookupError):
        validate({**scaled, "apiVersion": "keda.sh/v2"}, K8S_VERSIONS[0])


def test_our_schema_lookup_matches_kubernetes_validate() -> None:
    """The cached validators read the very files kubernetes-validate itself reads."""
    deployment = load_yaml(next(p for p in resource_files() if p.name == "worker.yaml"))[0]
    assert kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)
    validate(deployment, K8S_VERSIONS[0])


@needs_kustomize
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_references_resolve(overlay: str) -> None:
    """Selectors select, named ports exist, autoscalers and budgets point at real workloads."""
    docs = render(f"overlays/{overlay}")
    pods = [(name, t["metadata"]["labels"], t["spec"]) for name, t in pod_templates(docs)]
    for svc in of_kind(docs, "Service"):
        backing = [p for p in pods if selects({"matchLabels": svc["spec"]["selector"]}, p[1])]
        assert backing, f"Service {svc['metadata']['name']} selects no pod"
        for port in svc["spec"]["ports"]:
            names = {cp.get("name") for _, _, spec in backing for c in spec["containers"]
                     for cp in c.get("ports", [])}  # fmt: skip
            assert port["targetPort"] in names, (svc["metadata"]["name"], port)
    for pdb in of_kind(docs, "PodDisruptionBudget"):
        assert [p for p in pods if selects(pdb["spec"]["selector"], p[1])], pdb["metadata"]
    deployments = {d["metadata"]["name"] for d in of_kind(docs, "Deployment")}
    for hpa in of_kind(docs, "HorizontalPodAutoscaler") + of_kind(docs, "ScaledObject"):
        assert hpa["spec"]["scaleTargetRef"]["name"] in deployments
    config_maps = {c["metadata"]["name"] for c in of_kind(docs, "ConfigMap")}
    for _, _, spec in pods:
        for c in spec["containers"]:
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("configMapKeyRef")
                assert ref is None or ref["name"] in config_maps, ref


@needs_kustomize
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_autoscaler_per_workload_and_it_owns_the_replica_count(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    targets = [
        h["spec"]["scaleTargetRef"]["name"]
        for h in of_kind(docs, "HorizontalPodAutoscaler") + of_kind(docs, "ScaledObject")
    ]
    assert sorted(targets) == ["sandbox-api", "sandbox-worker"]
    for name in targets:
        assert "replicas" not in named(docs, "Deployment", name)["spec"]


@needs_kustomize
def test_monitoring_scrapes_both_roles_on_their_metrics_ports() -> None:
    docs = render("overlays/production")
    [monitor] = of_kind(docs, "ServiceMonitor")
    ports = {e["port"] for e in monitor["spec"]["endpoints"]}
    assert {e["path"] for e in monitor["spec"]["endpoints"]} == {"/metrics"}
    for svc in of_kind(docs, "Service"):
        if selects(monitor["spec"]["selector"], svc["metadata"].get("labels", {})):
            component = svc["metadata"]["labels"]["app.kubernetes.io/component"]
            names = {p["name"] for p in svc["spec"]["ports"]}
            assert component == "redis" or names & ports, svc["metadata"]["name"]
    assert {p["name"] for p in container(docs, "sandbox-api")["ports"]} & ports
    assert {p["name"] for p in container(docs, "sandbox-worker")["ports"]} & ports


def _env_names(doc: Doc) -> set[str]:
    return {e["name"] for c in doc["spec"]["template"]["spec"]["containers"] for e in c["env"]}


@needs_kustomize
def test_overlays_differ_only_where_they_say() -> None:
    prod, gvisor = render("overlays/production"), render("overlays/gvisor")
    restricted = render("overlays/restricted")
    worker = named(gvisor, "Deployment", "sandbox-worker")["spec"]["template"]["spec"]
    assert worker["runtimeClassName"] == "gvisor"
    for docs in (prod, restricted):
        spec = named(docs, "Deployment", "sandbox-worker")["spec"]["template"]["spec"]
        assert "runtimeClassName" not in spec
    for docs in (prod, gvisor, restricted):
        api = named(docs, "Deployment", "sandbox-api")["spec"]["template"]["spec"]
        assert "runtimeClassName" not in api
    assert "SANDBOX_DISABLE_ISOLATION" in _env_names(named(restricted, "Deployment",
                                                           "sandbox-worker"))  # fmt: skip
