"""Security and operating properties of the rendered manifests, overlay by overlay.

No privileged pod; seccomp RuntimeDefault, read-only root, no privilege escalation and every
capability dropped except the worker's short list; worker pods reach Redis and DNS only;
API pods take traffic from the trainer namespace; probes on /readyz and /healthz at the ports
the service listens on; autoscalers read metrics the service really exports; grace periods
cover the drain the service performs on SIGTERM.
"""

from __future__ import annotations

import json

import pytest
import yaml

from sandbox_service.http_server import DELIVERY_GRACE_S
from sandbox_service.queue.redis.keys import GROUP, Keys
from sandbox_service.settings import Settings
from tests.deploy.manifests import (
    DEPLOY,
    K8S,
    OVERLAYS,
    WORKER_CAPABILITIES,
    WORKER_DRAIN_MARGIN_S,
    WORKER_METRICS_PORT,
    Doc,
    container,
    env_of,
    exported_series,
    kustomize_command,
    load_script,
    named,
    of_kind,
    pod_templates,
    render,
    selects,
    series_in,
    setting,
)

pytestmark = pytest.mark.skipif(
    kustomize_command() is None, reason="no kubectl or kustomize on PATH: cannot render overlays"
)

# Capabilities the `baseline` Pod Security level lets a container add.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
WORKER = {"app.kubernetes.io/name": "sandbox-service", "app.kubernetes.io/component": "worker"}
API = {"app.kubernetes.io/name": "sandbox-service", "app.kubernetes.io/component": "api"}
REDIS = {"app.kubernetes.io/name": "sandbox-service", "app.kubernetes.io/component": "redis"}
KUBE_DNS = {"k8s-app": "kube-dns"}


def overlays() -> pytest.MarkDecorator:
    return pytest.mark.parametrize("overlay", OVERLAYS)


def _containers(template: Doc) -> list[Doc]:
    spec = template["spec"]
    return spec["containers"] + spec.get("initContainers", [])


@overlays()
def test_no_pod_is_privileged_or_shares_the_host(overlay: str) -> None:
    for name, template in pod_templates(render(f"overlays/{overlay}")):
        spec = template["spec"]
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(key), (name, key)
        assert not [v for v in spec.get("volumes", []) if "hostPath" in v], name
        assert spec.get("automountServiceAccountToken") is False, name
        for c in _containers(template):
            sc = c.get("securityContext", {})
            assert sc.get("privileged") is False, (name, c["name"])
            assert sc.get("allowPrivilegeEscalation") is False, (name, c["name"])
            assert sc.get("readOnlyRootFilesystem") is True, (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            assert sc.get("procMount", "Default") == "Default", (name, c["name"])


@overlays()
def test_seccomp_runtime_default_everywhere(overlay: str) -> None:
    for name, template in pod_templates(render(f"overlays/{overlay}")):
        pod = template["spec"].get("securityContext", {}).get("seccompProfile")
        for c in _containers(template):
            profile = c.get("securityContext", {}).get("seccompProfile", pod)
            assert profile == {"type": "RuntimeDefault"}, (name, c["name"])


@overlays()
def test_only_workers_add_capabilities_and_only_what_isolation_needs(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    for name, template in pod_templates(docs):
        for c in _containers(template):
            added = set(c["securityContext"]["capabilities"].get("add", []))
            if name == "sandbox-worker":
                assert added <= WORKER_CAPABILITIES, added - WORKER_CAPABILITIES
                assert {"SETUID", "SETGID"} <= added  # per-slot uids are not optional
            else:
                assert not added, (name, added)
            assert not any(cap.startswith("CAP_") for cap in added), "spell SYS_ADMIN, not CAP_"


@overlays()
def test_only_workers_run_as_root_and_the_namespace_admits_them(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    beyond_baseline = False
    for name, template in pod_templates(docs):
        pod_sc = template["spec"].get("securityContext", {})
        if name != "sandbox-worker":
            assert pod_sc.get("runAsNonRoot") is True, name
            assert pod_sc.get("runAsUser", 0) != 0, name
        for c in _containers(template):
            added = set(c["securityContext"]["capabilities"].get("add", []))
            beyond_baseline |= not added <= BASELINE_CAPABILITIES
    [namespace] = of_kind(docs, "Namespace")
    enforce = namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
    assert enforce == ("privileged" if beyond_baseline else "baseline")


def test_restricted_overlay_fits_baseline_and_requires_what_is_left() -> None:
    docs = render("overlays/restricted")
    worker = container(docs, "sandbox-worker")
    assert "SYS_ADMIN" not in worker["securityContext"]["capabilities"]["add"]
    assert set(setting(worker, "require_isolation")) == {"uid", "seccomp", "rlimits"}
    assert set(setting(worker, "disable_isolation")) == {"net", "mount"}


@overlays()
def test_writable_places_are_emptydirs(overlay: str) -> None:
    """With a read-only root, each container writes only to its own emptyDir volumes (a
    Secret is mounted read-only)."""
    for name, template in pod_templates(render(f"overlays/{overlay}")):
        volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
        for c in _containers(template):
            for mount in c.get("volumeMounts", []):
                volume = volumes[mount["name"]]
                if "secret" in volume and mount.get("readOnly"):
                    continue
                assert "emptyDir" in volume and volume["emptyDir"].get("sizeLimit"), (name, mount)
        if name.startswith("sandbox-"):
            mounts = {m["mountPath"] for m in template["spec"]["containers"][0]["volumeMounts"]}
            assert "/tmp" in mounts, name


@overlays()
def test_every_container_has_requests_and_limits(overlay: str) -> None:
    for name, template in pod_templates(render(f"overlays/{overlay}")):
        for c in _containers(template):
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][kind]), (name, c["name"], kind)


@overlays()
@pytest.mark.parametrize(("deployment", "port_setting"), [
    ("sandbox-api", "port"), ("sandbox-worker", "worker_metrics_port"),
])  # fmt: skip
def test_probes_on_readyz_and_healthz_at_the_port_the_service_listens_on(
    overlay: str, deployment: str, port_setting: str
) -> None:
    c = container(render(f"overlays/{overlay}"), deployment)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    # worker_metrics_port lands with the Redis scale-out; until then, its default.
    listens = setting(c, port_setting) if port_setting in Settings.model_fields else (
        int(env_of(c).get("SANDBOX_WORKER_METRICS_PORT", WORKER_METRICS_PORT)))  # fmt: skip
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "startupProbe"):
        assert ports[c[probe]["httpGet"]["port"]] == listens, probe
    # Liveness: the image's own check, which finds the port from the same environment.
    python, script, path = c["livenessProbe"]["exec"]["command"]
    assert (python, path) == ("python3", "/healthz")
    assert f"deploy/healthcheck.py {script}" in (DEPLOY / "Dockerfile").read_text()
    assert listens in load_script("healthcheck.py").ports(env_of(c))


def _policies_for(docs: tuple[Doc, ...], labels: dict[str, str], kind: str) -> list[Doc]:
    return [
        p for p in of_kind(docs, "NetworkPolicy")
        if selects(p["spec"]["podSelector"], labels) and kind in p["spec"]["policyTypes"]
    ]  # fmt: skip


def _peer_is(peer: Doc, pod_labels: dict[str, str], namespace: str | None) -> bool:
    """Does a NetworkPolicy peer name exactly these pods (in ``namespace``, or our own)?"""
    if "ipBlock" in peer or not selects(peer.get("podSelector", {}), pod_labels):
        return False
    if not peer.get("podSelector", {}).get("matchLabels"):
        return False  # an empty pod selector would mean every pod
    ns = peer.get("namespaceSelector")
    if namespace is None:
        return ns is None
    return ns == {"matchLabels": {"kubernetes.io/metadata.name": namespace}}


@overlays()
def test_everything_is_denied_unless_allowed(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    deny = named(docs, "NetworkPolicy", "default-deny")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}


@overlays()
def test_worker_egress_is_redis_and_dns_only(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    policies = _policies_for(docs, WORKER, "Egress")
    assert policies
    rules = [rule for p in policies for rule in p["spec"].get("egress", [])]
    assert rules
    for rule in rules:
        assert rule.get("to"), "a rule without `to` allows every destination"
        ports = {(p["protocol"], p["port"]) for p in rule["ports"]}
        for peer in rule["to"]:
            if _peer_is(peer, REDIS, None):
                assert ports == {("TCP", 6379)}
            else:
                assert _peer_is(peer, KUBE_DNS, "kube-system"), peer
                assert ports == {("UDP", 53), ("TCP", 53)}
    redis_rules = [r for r in rules if any(_peer_is(p, REDIS, None) for p in r["to"])]
    assert redis_rules


@overlays()
def test_api_takes_traffic_from_the_trainer_namespace(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    service_port = container(docs, "sandbox-api")["ports"][0]["containerPort"]
    sources = [
        (peer, {p["port"] for p in rule["ports"]})
        for policy in _policies_for(docs, API, "Ingress")
        for rule in policy["spec"].get("ingress", [])
        for peer in rule["from"]
    ]
    trainer = {"matchLabels": {"kubernetes.io/metadata.name": "trainer"}}
    assert any(peer == {"namespaceSelector": trainer} and service_port in ports
               for peer, ports in sources)  # fmt: skip
    for peer, _ in sources:
        assert "ipBlock" not in peer and peer.get("namespaceSelector"), peer


@overlays()
def test_redis_takes_connections_from_the_service_only(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    for policy in _policies_for(docs, REDIS, "Ingress"):
        for rule in policy["spec"].get("ingress", []):
            assert rule.get("from")
            for peer in rule["from"]:
                keda = {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}
                assert (_peer_is(peer, API, None) or _peer_is(peer, WORKER, None)
                        or peer == {"namespaceSelector": keda}), peer  # fmt: skip
    assert not [
        r for p in _policies_for(docs, REDIS, "Egress") for r in p["spec"].get("egress", [])
    ]


# ---------------------------------------------------------------- autoscaling


def _hpa_metric_names(hpa: Doc) -> set[str]:
    names = set()
    for metric in hpa["spec"]["metrics"]:
        if metric["type"] in ("External", "Pods", "Object"):
            names.add(metric[metric["type"].lower()]["metric"]["name"])
    return names


@overlays()
def test_autoscalers_read_metrics_the_service_exports(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    for hpa in of_kind(docs, "HorizontalPodAutoscaler"):
        assert _hpa_metric_names(hpa) <= exported_series(), hpa["metadata"]["name"]
    worker_hpas = [h for h in of_kind(docs, "HorizontalPodAutoscaler")
                   if h["spec"]["scaleTargetRef"]["name"] == "sandbox-worker"]  # fmt: skip
    for hpa in worker_hpas:
        assert "sandbox_queue_depth" in _hpa_metric_names(hpa)


def test_prometheus_adapter_serves_what_the_hpa_asks_for() -> None:
    folder = K8S / "components" / "prometheus-hpa"
    values = yaml.safe_load((folder / "prometheus-adapter.values.yaml").read_text())
    served: dict[str, set[str]] = {"Pods": set(), "External": set()}
    for kind, rules in (
        ("Pods", values["rules"]["custom"]),
        ("External", values["rules"]["external"]),
    ):
        for rule in rules:
            assert series_in(rule["seriesQuery"]) <= exported_series()
            served[kind].add(rule["name"]["as"])
    [hpa] = [d for d in yaml.safe_load_all((folder / "hpa.yaml").read_text()) if d]
    for metric in hpa["spec"]["metrics"]:
        assert metric[metric["type"].lower()]["metric"]["name"] in served[metric["type"]]


# KEDA's redis-streams trigger parameters (keda.sh/docs/latest/scalers/redis-streams).
REDIS_STREAMS_PARAMETERS = {
    "address", "host", "port", "addressFromEnv", "hostFromEnv", "portFromEnv",
    "usernameFromEnv", "passwordFromEnv", "stream", "consumerGroup", "pendingEntriesCount",
    "streamLength", "lagCount", "activationLagCount", "enableTLS", "unsafeSsl", "databaseIndex",
}  # fmt: skip


def job_stream_and_group() -> tuple[str, str]:
    """The job stream and consumer group, from the Redis queue's key schema."""
    return Keys(Settings().redis_prefix).jobs, GROUP


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if o != "no-keda"])
def test_keda_reads_the_length_of_the_job_stream(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    [scaled] = of_kind(docs, "ScaledObject")
    worker = container(docs, scaled["spec"]["scaleTargetRef"]["name"])
    stream, group = job_stream_and_group()
    for trigger in scaled["spec"]["triggers"]:
        meta = trigger["metadata"]
        assert trigger["type"] == "redis-streams"
        assert set(meta) <= REDIS_STREAMS_PARAMETERS, set(meta) - REDIS_STREAMS_PARAMETERS
        assert meta["stream"] == stream and meta.get("consumerGroup", group) == group
        assert meta["addressFromEnv"] in {e["name"] for e in worker["env"]}
        # The queue deletes chunks no worker took; after that Redis reports the group's lag
        # as nil, so a lag trigger would go blind. The stream's length stays exact.
        assert "lagCount" not in meta
    [backlog] = scaled["spec"]["triggers"]
    assert "streamLength" in backlog["metadata"] and "consumerGroup" not in backlog["metadata"]
    # The password from the Secret Redis itself reads, through a TriggerAuthentication of the
    # same namespace: no container carries it in its environment for KEDA.
    auth = named(docs, "TriggerAuthentication", backlog["authenticationRef"]["name"])
    assert auth["metadata"]["namespace"] == scaled["metadata"]["namespace"]
    [ref] = auth["spec"]["secretTargetRef"]
    redis = named(docs, "Deployment", "redis")["spec"]["template"]["spec"]
    secrets = {v["secret"]["secretName"] for v in redis["volumes"] if "secret" in v}
    assert (ref["parameter"], ref["name"]) == ("password", *secrets)
    for _, template in pod_templates(docs):
        for c in template["spec"]["containers"]:
            assert not [e for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})]


def test_dashboard_plots_only_exported_series() -> None:
    path = K8S / "components" / "monitoring" / "dashboards" / "sandbox-service.json"
    dashboard = json.loads(path.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = set().union(*(series_in(e) for e in exprs))
    assert used <= exported_series(), used - exported_series()
    for name in ("sandbox_queue_depth", "sandbox_executions_total", "sandbox_slots_busy"):
        assert name in used
    assert any("sandbox_queue_wait_seconds_bucket" in e for e in exprs)
    assert any("sandbox_run_seconds_bucket" in e for e in exprs)


# ---------------------------------------------------------------- graceful shutdown


@overlays()
def test_worker_grace_period_covers_the_longest_run(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    spec = named(docs, "Deployment", "sandbox-worker")["spec"]["template"]["spec"]
    c = spec["containers"][0]
    # Running jobs get graceful_shutdown_s; one may need max_timeout_s: the first covers it.
    assert setting(c, "graceful_shutdown_s") >= setting(c, "max_timeout_s")
    drain = setting(c, "graceful_shutdown_s")
    assert spec["terminationGracePeriodSeconds"] >= drain + WORKER_DRAIN_MARGIN_S
    assert "lifecycle" not in spec["containers"][0], "a preStop delay would eat the drain time"


@overlays()
def test_api_grace_period_covers_prestop_drain_and_delivery(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    spec = named(docs, "Deployment", "sandbox-api")["spec"]["template"]["spec"]
    c = spec["containers"][0]
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    needed = pre_stop + setting(c, "graceful_shutdown_s") + DELIVERY_GRACE_S
    assert spec["terminationGracePeriodSeconds"] >= needed
    # A run already started may take max_timeout_s: the drain lets it finish.
    assert setting(c, "graceful_shutdown_s") >= setting(c, "max_timeout_s")
