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


# Kinds that live outside any namespace.
CLUSTER_SCOPED = {"Namespace", "RuntimeClass"}


@needs_kustomize
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_lands_in_the_workers_namespace(overlay: str) -> None:
    """A component does not inherit the base's `namespace:`; the overlay must set it, or the
    autoscaler, the ServiceMonitor, the policies and the dashboard land wherever kubectl
    points, away from the workers."""
    docs = render(f"overlays/{overlay}")
    namespace = named(docs, "Deployment", "sandbox-worker")["metadata"]["namespace"]
    assert [d["metadata"]["name"] for d in of_kind(docs, "Namespace")] == [namespace]
    for doc in docs:
        where = doc["metadata"].get("namespace")
        expected = None if doc["kind"] in CLUSTER_SCOPED else namespace
        assert where == expected, (doc["kind"], doc["metadata"]["name"], where)


@needs_kustomize
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_cross_namespace_references_name_the_workers_namespace(overlay: str) -> None:
    """What kustomize cannot rewrite: the ServiceMonitor's namespaceSelector, the Redis
    address every client and KEDA resolve, the env KEDA's trigger reads from its target."""
    docs = render(f"overlays/{overlay}")
    namespace = named(docs, "Deployment", "sandbox-worker")["metadata"]["namespace"]
    for monitor in of_kind(docs, "ServiceMonitor"):
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [namespace]}
    [redis_config] = [c for c in of_kind(docs, "ConfigMap")
                      if c["metadata"]["name"].startswith("sandbox-redis")]  # fmt: skip
    redis_port = named(docs, "Service", "redis")["spec"]["ports"][0]["port"]
    host = f"redis.{namespace}.svc.cluster.local:{redis_port}"
    assert redis_config["data"]["address"] == host
    assert redis_config["data"]["url"].startswith(f"redis://{host}/")
    for scaled in of_kind(docs, "ScaledObject"):
        target = named(docs, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
        env = {e["name"] for c in target["spec"]["template"]["spec"]["containers"]
               for e in c["env"]}  # fmt: skip
        for trigger in scaled["spec"]["triggers"]:
            for key, value in trigger["metadata"].items():
                if key.endswith("FromEnv"):
                    assert value in env, (key, value)


@needs_kustomize
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_select_the_pods_they_open(overlay: str) -> None:
    """Each policy selects pods of its namespace, and the monitoring and KEDA policies open
    the ports those pods listen on to the namespaces Prometheus and KEDA run in."""
    docs = render(f"overlays/{overlay}")
    pods = [t["metadata"]["labels"] for _, t in pod_templates(docs)]
    listening = {
        cp["containerPort"]
        for _, t in pod_templates(docs)
        for c in t["spec"]["containers"]
        for cp in c.get("ports", [])
    }
    for policy in of_kind(docs, "NetworkPolicy"):
        selected = [p for p in pods if selects(policy["spec"]["podSelector"], p)]
        assert selected, policy["metadata"]["name"]
        for rule in policy["spec"].get("ingress", []):
            for port in rule.get("ports", []):
                assert port["port"] in listening, (policy["metadata"]["name"], port)
    names = {p["metadata"]["name"] for p in of_kind(docs, "NetworkPolicy")}
    assert "metrics-from-monitoring" in names
    if of_kind(docs, "ScaledObject"):
        assert "redis-from-keda" in names
