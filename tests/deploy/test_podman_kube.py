"""k8s/base run by a real engine: rendered by ``kubectl kustomize``, played by ``podman kube
play`` (Debian 12's podman 4.3), the image built by ``make image``.

Redis, API and worker pods come up from the rendered Deployments; the test checks readiness
(the readinessProbe's request, sent to each pod), liveness (``podman healthcheck run``: the
livenessProbe as podman itself runs it), an execution through the API pod, and a worker
killed with SIGKILL mid-batch and restarted by the engine with every job of the batch
answered. ``make test-image`` runs it (and installs podman there); elsewhere it runs where
podman, kubectl and the images are present, and is skipped saying which is missing.

What the test changes, and why (nothing else differs from ``kubectl kustomize k8s/base``):

1. The Secret ``sandbox-redis-auth`` is created from a Secret manifest by ``podman kube play``
   (as ``kubectl apply`` would), and its key is also written into the volume podman makes for
   it: podman 4.3 creates a Secret's volume (named after the Secret, one for every pod) but
   leaves it empty. The file is 0444 there, since that one volume serves Redis (uid 999), the
   API (uid 10001) and the workers (root); Kubernetes gives each pod its own copy and mode.
2. Images: ``redis:7.4.2-alpine`` comes from a registry, which this machine does not reach;
   Debian's Redis 7.0 (``sandbox-redis:dev``, made by ``make image``) is tagged with that name
   in podman's store. The service image is tagged with the name and tag kustomize gives it.
3. The Redis address in the ConfigMap names the Redis pod's IP: podman has no cluster DNS
   (``redis.sandbox.svc.cluster.local``) and no Services.
4. No ``ports``: podman publishes every containerPort on the host (Kubernetes publishes
   none), which would take host ports 6379, 8000 and 9100 and put both worker replicas on
   9100. The test reaches each pod at its own IP, as a Service would.
5. podman's default rlimits (RLIMIT_NPROC above what its conmon holds) cannot be set by runc
   without CAP_SYS_RESOURCE: a containers.conf of the test's sets nofile and nproc within the
   current hard limits. Where even that fails, the test says podman's own words.

Everything runs in a network namespace of the test's own (``ip netns``), so the pods' bridge
and firewall rules never touch the host's. podman runs no readiness or startup probes and,
without systemd, no periodic liveness checks; its ``emptyDir`` volumes are named volumes
shared by the replicas; it ignores Services, the HPA, the PDB and NetworkPolicies.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.manifests import Doc, kustomize_command, named, render

# Pods start (each worker warms 4 zygotes on what may be two busy cores) and a batch waits out
# a killed worker's visibility timeout: minutes, not the suite's default limit.
pytestmark = pytest.mark.timeout(900)

IMAGE = os.environ.get("SANDBOX_TEST_IMAGE", "sandbox-service:dev")
REDIS_IMAGE = os.environ.get("SANDBOX_TEST_REDIS_IMAGE", "sandbox-redis:dev")
REQUIRED = os.environ.get("SANDBOX_TEST_IMAGE_REQUIRED") == "1"
NAME = f"sandbox-kube-{os.getpid()}"  # the network namespace and the podman network
PASSWORD = "podman-kube-test-pw"
SECRET = "sandbox-redis-auth"
# The pods' (and the test's) patience: each worker imports numpy and sympy into 4 slots.
READY_S = 240
# podman names a Deployment's pods <name>-pod-<i>, their containers <pod>-<container>.
CONTAINERS = ("redis-pod-0-redis", "sandbox-api-pod-0-api", "sandbox-worker-pod-0-worker",
              "sandbox-worker-pod-1-worker")  # fmt: skip


def _missing() -> str | None:
    for tool in ("podman", "docker", "ip", "nsenter"):
        if shutil.which(tool) is None and not os.access(f"/usr/bin/{tool}", os.X_OK):
            return f"no {tool} on PATH (`make test-image` installs podman)"
    if kustomize_command() is None:
        return "no kubectl or kustomize on PATH"
    if os.geteuid() != 0:
        return "podman kube play of these pods (a root worker, ip netns) needs root"
    return None


def _docker() -> str:
    return shutil.which("docker") or "/usr/bin/docker"


def _run(argv: list[str], timeout_s: float = 120, env: dict[str, str] | None = None,
         stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:  # fmt: skip
    return subprocess.run(argv, capture_output=True, timeout=timeout_s, input=stdin,
                          env={**os.environ, **(env or {})})  # fmt: skip


@dataclass
class Podman:
    """podman, run in the test's network namespace with the test's containers.conf."""

    conf: Path

    def __call__(self, *args: str, timeout_s: float = 120, check: bool = True,
                 stdin: bytes | None = None) -> str:  # fmt: skip
        argv = ["nsenter", f"--net=/run/netns/{NAME}", "podman", *args]
        done = _run(argv, timeout_s, {"CONTAINERS_CONF": str(self.conf)}, stdin)
        if check and done.returncode != 0:
            said = [ln for ln in done.stderr.decode().splitlines() if "systemd" not in ln]
            raise AssertionError(f"podman {' '.join(args[:3])}: {' / '.join(said[-5:])}")
        return done.stdout.decode().strip()

    def succeeds(self, *args: str) -> bool:
        argv = ["nsenter", f"--net=/run/netns/{NAME}", "podman", *args]
        return _run(argv, env={"CONTAINERS_CONF": str(self.conf)}).returncode == 0

    def play(self, docs: list[Doc]) -> None:
        self("kube", "play", "--network", NAME, "-", stdin=yaml.safe_dump_all(docs).encode(),
             timeout_s=300)  # fmt: skip

    def pod_ip(self, pod: str) -> str:
        infra = self("pod", "inspect", pod, "--format", "{{.InfraContainerID}}")
        networks = json.loads(self("inspect", infra, "--format",
                                   "{{json .NetworkSettings.Networks}}"))  # fmt: skip
        return str(networks[NAME]["IPAddress"])


def in_pods_network(url: str, body: Any = None, timeout_s: float = 30) -> tuple[int, str]:
    """An HTTP request from inside the pods' network namespace: (status, body)."""
    script = (
        "import sys, urllib.request, urllib.error\n"
        "data = sys.argv[2].encode() if sys.argv[2] else None\n"
        "req = urllib.request.Request(sys.argv[1], data=data,"
        " headers={'content-type': 'application/json'})\n"
        "try:\n"
        "    r = urllib.request.urlopen(req, timeout=float(sys.argv[3]))\n"
        "    print(r.status); sys.stdout.write(r.read().decode())\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code); sys.stdout.write(e.read().decode())\n"
    )
    argv = ["nsenter", f"--net=/run/netns/{NAME}", sys.executable, "-c", script, url,
            "" if body is None else json.dumps(body), str(timeout_s)]  # fmt: skip
    done = _run(argv, timeout_s + 30)
    if done.returncode != 0:
        return 0, done.stderr.decode()[-500:]
    status, _, text = done.stdout.decode().partition("\n")
    return int(status), text


def wait_until(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _image_into_podman(podman: Podman, image: str, name: str) -> None:
    """The image `make image` built with Docker, moved into podman's store as `name` (again
    whenever Docker's differs from podman's copy: same config digest, same id)."""
    docker_id = _run([_docker(), "image", "inspect", "--format", "{{.Id}}", image]).stdout
    podman_id = _run(["podman", "image", "inspect", "--format", "{{.Id}}", image]).stdout
    if not podman_id.strip() or docker_id.decode().strip().removeprefix("sha256:") != (
        podman_id.decode().strip()
    ):
        saved = _run([_docker(), "save", image], timeout_s=600)
        assert saved.returncode == 0, f"docker save {image}: {saved.stderr.decode()[-300:]}"
        podman("load", stdin=saved.stdout, timeout_s=600)
    podman("tag", image, name)


def _strip_ports(rendered: Doc) -> Doc:
    doc = copy.deepcopy(rendered)  # render() is cached: leave its documents as they are
    for c in doc["spec"]["template"]["spec"]["containers"]:
        c.pop("ports", None)
    return doc


@dataclass
class Cluster:
    podman: Podman
    docs: tuple[Doc, ...]
    ips: dict[str, str]  # pod name -> IP

    def port(self, deployment: str, name: str) -> int:
        """A named port's number, from the manifest (the test strips `ports` before play)."""
        [c] = named(self.docs, "Deployment", deployment)["spec"]["template"]["spec"]["containers"]
        return int(next(p["containerPort"] for p in c["ports"] if p["name"] == name))

    def probe_url(self, pod: str, deployment: str, kind: str) -> str:
        [c] = named(self.docs, "Deployment", deployment)["spec"]["template"]["spec"]["containers"]
        get = c[kind]["httpGet"]
        return f"http://{self.ips[pod]}:{self.port(deployment, get['port'])}{get['path']}"

    def api(self, path: str) -> str:
        return f"http://{self.ips['sandbox-api-pod-0']}:{self.port('sandbox-api', 'http')}{path}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    missing = _missing()
    if missing:
        if REQUIRED:
            pytest.fail(f"the podman run cannot run: {missing}")
        pytest.skip(f"the podman run needs podman, kubectl and root: {missing}")
    for image in (IMAGE, REDIS_IMAGE):
        if _run([_docker(), "image", "inspect", image], 30).returncode != 0:
            if REQUIRED:
                pytest.fail(f"image {image} is not built (`make image`)")
            pytest.skip(f"image {image} is not built (`make image`)")
    tmp = tmp_path_factory.mktemp("podman")
    conf = tmp / "containers.conf"
    hard = {"nofile": "-Hn", "nproc": "-Hu"}
    limits = {k: _run(["sh", "-c", f"ulimit {flag}"]).stdout.decode().strip()
              for k, flag in hard.items()}  # fmt: skip
    # conmon holds RLIMIT_NPROC 32768 where podman runs without systemd.
    nproc = min(int(limits["nproc"]), 32768) if limits["nproc"].isdigit() else 32768
    nofile = limits["nofile"] if limits["nofile"].isdigit() else "1048576"
    conf.write_text(f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", '
                    f'"nproc={nproc}:{nproc}"]\n')  # fmt: skip
    podman = Podman(conf)
    assert _run(["ip", "netns", "add", NAME]).returncode == 0
    docs = render("base")
    try:
        podman("network", "create", NAME)
        worker = named(docs, "Deployment", "sandbox-worker")["spec"]["template"]["spec"]
        redis = named(docs, "Deployment", "redis")["spec"]["template"]["spec"]
        _image_into_podman(podman, IMAGE, worker["containers"][0]["image"])
        _image_into_podman(podman, REDIS_IMAGE, redis["containers"][0]["image"])
        # 1. the Secret, and the file podman 4.3 leaves out of its volume
        podman("kube", "play", "-", stdin=yaml.safe_dump({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET},
            "stringData": {"password": PASSWORD}}).encode())  # fmt: skip
        podman("volume", "create", SECRET)
        volume = Path(podman("volume", "inspect", SECRET, "--format", "{{.Mountpoint}}"))
        (volume / "password").write_text(PASSWORD)
        (volume / "password").chmod(0o444)
        # Redis first: the others need its address (3, 4).
        podman.play([_strip_ports(named(docs, "Deployment", "redis"))])
        ips = {"redis-pod-0": podman.pod_ip("redis-pod-0")}
        [config] = [d for d in docs if d["kind"] == "ConfigMap"]
        cluster_host = config["data"]["address"]
        config = json.loads(json.dumps(config).replace(cluster_host, f"{ips['redis-pod-0']}:6379"))
        podman.play([config] + [_strip_ports(named(docs, "Deployment", d))
                                for d in ("sandbox-api", "sandbox-worker")])  # fmt: skip
        replicas = named(docs, "Deployment", "sandbox-worker")["spec"]["replicas"]
        pods = ["sandbox-api-pod-0", *(f"sandbox-worker-pod-{i}" for i in range(replicas))]
        ips.update({pod: podman.pod_ip(pod) for pod in pods})
        yield Cluster(podman, docs, ips)
    finally:
        for container in CONTAINERS:
            print(f"== {container}\n" + podman("logs", "--tail", "15", container, check=False))
        podman("pod", "rm", "-f", "-t", "0", "-a", check=False, timeout_s=300)
        for volume_name in (SECRET, "tmp", "work", "data"):
            podman("volume", "rm", "-f", volume_name, check=False)
        podman("secret", "rm", SECRET, check=False)
        podman("network", "rm", "-f", NAME, check=False)
        _run(["ip", "netns", "delete", NAME])


def _metrics(url: str) -> dict[str, float]:
    status, text = in_pods_network(url)
    if status != 200:
        return {}
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if not s.labels}  # fmt: skip


def test_pods_come_up_ready_and_run_executions(cluster: Cluster) -> None:
    podman = cluster.podman
    # Redis: its readinessProbe's command, run in its container.
    [redis_c] = named(cluster.docs, "Deployment", "redis")["spec"]["template"]["spec"]["containers"]
    ping = redis_c["readinessProbe"]["exec"]["command"]
    wait_until(lambda: podman("exec", "redis-pod-0-redis", *ping, check=False) == "PONG", 60,
               "Redis to answer its readiness probe")  # fmt: skip
    for pod, deployment in (("sandbox-worker-pod-0", "sandbox-worker"),
                            ("sandbox-worker-pod-1", "sandbox-worker"),
                            ("sandbox-api-pod-0", "sandbox-api")):  # fmt: skip
        url = cluster.probe_url(pod, deployment, "readinessProbe")
        wait_until(lambda url=url: in_pods_network(url)[0] == 200, READY_S, f"{pod} ready")
        # The livenessProbe as podman runs it (an exec of the image's health check).
        container = f"{pod}-{deployment.removeprefix('sandbox-')}"
        # One failure is not death (failureThreshold); on two busy cores a check can time out.
        wait_until(lambda c=container: podman.succeeds("healthcheck", "run", c), 60,
                   f"{container}'s liveness check to pass")  # fmt: skip
    status, text = in_pods_network(cluster.api("/v1/execute"), {"code": "print(6 * 7)"}, 60)
    assert status == 200 and json.loads(text)["stdout"] == "42\n", text
    status, text = in_pods_network(cluster.api("/v1/status"))
    assert len(json.loads(text)["workers"]) == 2, text


def test_a_killed_worker_is_replaced_and_nothing_is_lost(cluster: Cluster) -> None:
    podman = cluster.podman
    jobs = [{"code": f"import time; time.sleep(2); print({i})", "timeout_s": 30}
            for i in range(16)]  # fmt: skip
    # The batch is sent from inside the pods' network, in the background.
    batch = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{NAME}", sys.executable, "-c",
         "import json, sys, urllib.request\n"
         "req = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(),"
         " headers={'content-type': 'application/json'})\n"
         "print(urllib.request.urlopen(req, timeout=300).read().decode())\n",
         cluster.api("/v1/execute/batch"), json.dumps({"requests": jobs})],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    # The batch is one chunk (chunk_size 16): one worker takes it, and that one is killed.
    port = cluster.port("sandbox-worker", "metrics")
    workers = [pod for pod in cluster.ips if pod.startswith("sandbox-worker-pod-")]
    busy: list[str] = []

    def one_is_busy() -> bool:
        busy[:] = [pod for pod in workers if _metrics(
            f"http://{cluster.ips[pod]}:{port}/metrics").get("sandbox_slots_busy", 0) > 0]  # fmt: skip
        return bool(busy)

    wait_until(one_is_busy, 120, "a worker to run jobs of the batch")
    victim_pod = busy[0]
    victim = f"{victim_pod}-worker"
    started = podman("inspect", victim, "--format", "{{.State.StartedAt}}")
    # SIGKILL to the worker's process from outside, as a crash or the OOM killer would:
    # `podman kill` counts as the user stopping it, and podman then restarts nothing.
    os.kill(int(podman("inspect", victim, "--format", "{{.State.Pid}}")), signal.SIGKILL)
    out, err = batch.communicate(timeout=400)
    assert batch.returncode == 0, err.decode()[-500:]
    results = json.loads(out)["results"]
    assert [(r["status"], r["stdout"]) for r in results] == [
        ("ok", f"{i}\n") for i in range(len(jobs))
    ], [r for r in results if r["status"] != "ok"]
    # The engine started the killed worker again (restartPolicy Always), and it is ready.
    wait_until(lambda: podman("inspect", victim, "--format", "{{.State.StartedAt}}",
                              check=False) != started, 60, "the killed worker to restart")  # fmt: skip
    url = cluster.probe_url(victim_pod, "sandbox-worker", "readinessProbe")
    wait_until(lambda: in_pods_network(url)[0] == 200, READY_S, "the restarted worker ready")
