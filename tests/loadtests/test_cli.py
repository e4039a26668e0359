"""``python -m loadtests`` end to end: a small run with a baseline, and the report it writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sandbox_service.service_process import ServiceProcess

PNG = b"\x89PNG\r\n\x1a\n"


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadtests", *args], capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def test_small_run_with_naive_baseline_writes_the_report(
    own_service: ServiceProcess, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    done = cli("--url", own_service.url, "--workload", "mixed", "--count", "300",
               "--concurrency", "64", "--batch", "16", "--warmup", "10", "--quiet",
               "--sample-interval", "0.2", "--baseline", "naive", "--baseline-count", "12",
               "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "targets (printed, not asserted)" in done.stdout
    for name in ("latency.png", "throughput.png", "server.png"):
        assert (out / name).read_bytes()[:8] == PNG, name
    data = json.loads((out / "report.json").read_text())
    service, naive = data["runs"]
    assert (service["answered"], service["lost"], service["wrong"]) == (300, 0, 0)
    assert sum(service["statuses"].values()) == 300
    assert sum(service["throughput_per_s"]) == sum(service["executions_finished_per_s"]) == 300
    assert service["server"]["pids"] == [own_service.process.pid]  # found from the port
    assert service["server_samples"] and service["server_cpu_s"] > 0
    assert (
        service["latency_ms"]["p50"] <= service["latency_ms"]["p99"] <= service["latency_ms"]["max"]
    )
    assert (naive["answered"], naive["lost"], naive["wrong"]) == (12, 0, 0)
    assert naive["server_cpu_s"] > 0  # the interpreters it spawned
    assert data["ratios"]["exec_per_s"] > 0
    assert set(data["targets"]) == {
        "50k in flight, 0 lost, 0 wrong",
        "API memory < 1 GiB at 50k deep",
        "p99 trivial < 20 ms at <= 100 in flight",
    }
    summary = (out / "summary.md").read_text()
    assert "| exec/s |" in summary and "**service / naive**" in summary
    assert "- zygotes RSS MiB: start" in summary and "idle before 5, idle after 5" in summary


def test_code_judge_api_beside_the_native_one(own_service: ServiceProcess, tmp_path: Path) -> None:
    # Our code-judge front stands in for code-judge: one client, payload and batch for both.
    done = cli("--url", own_service.url, "--api", "codejudge", "--baseline", own_service.url,
               "--baseline-api", "native", "--workload", "trivial:3,sympy:1", "--count", "60",
               "--concurrency", "32", "--batch", "16", "--warmup", "0", "--quiet",
               "--no-plots", "--out", str(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    codejudge, native = json.loads((tmp_path / "report.json").read_text())["runs"]
    for run in (codejudge, native):
        assert (run["answered"], run["lost"], run["wrong"]) == (60, 0, 0)
    assert codejudge["label"] == "service via /run/long-batch" and native["label"] == "baseline"
    assert codejudge["queue_wait_ms"]["max"] == 0  # code-judge's answers carry no queue wait


def test_wrong_answers_fail_the_run(own_service: ServiceProcess, tmp_path: Path) -> None:
    calls = tmp_path / "calls.jsonl"
    calls.write_text('{"code": "print(1)", "expected_stdout": "2\\n"}\n')
    done = cli("--url", own_service.url, "--workload", f"file:{calls}", "--count", "5",
               "--warmup", "0", "--quiet", "--no-plots", "--out", str(tmp_path / "r"))  # fmt: skip
    assert done.returncode == 1
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    assert data["runs"][0]["wrong"] == 5
    assert data["runs"][0]["wrong_examples"][0]["stdout"] == "1\n"


def test_naive_baseline_refuses_the_adversarial_workload(tmp_path: Path) -> None:
    done = cli("--url", "http://127.0.0.1:9", "--workload", "adversarial", "--count", "1",
               "--duration", "0.1", "--drain", "0.1", "--warmup", "0", "--quiet",
               "--baseline", "naive", "--out", str(tmp_path))  # fmt: skip
    assert done.returncode != 0 and "not safe to run unconfined" in done.stderr


def test_launch_starts_and_stops_its_own_service(tmp_path: Path) -> None:
    done = cli("--launch", "--slots", "1", "--set", "preload=math", "--set", "warmup=",
               "--count", "20", "--warmup", "0", "--quiet",
               "--no-plots", "--out", str(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    run = json.loads((tmp_path / "report.json").read_text())["runs"][0]
    assert run["answered"] == 20 and run["server"]["idle_processes"] == {"start": 2, "end": 2}
    entries = run["server"]["scratch_entries"]
    assert entries["start"] is not None and entries["end"] == entries["start"]
    assert (tmp_path / "service.log").exists()


def test_redis_mode_spreads_load_over_api_nodes_and_workers(tmp_path: Path) -> None:
    out = tmp_path / "redis"
    done = cli("--launch", "--redis-workers", "2", "--api-nodes", "2", "--slots", "1",
               "--set", "preload=math", "--set", "warmup=", "--workload", "trivial",
               "--count", "200", "--concurrency", "40", "--batch", "10", "--warmup", "0",
               "--quiet", "--no-plots", "--sample-interval", "0.2", "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((out / "report.json").read_text())
    [run] = data["runs"]
    assert (run["answered"], run["lost"], run["wrong"]) == (200, 0, 0)
    assert len(run["server"]["pids"]) == 4  # two API nodes, two worker nodes, all sampled
    assert run["target"].count(",") == 1
    logs = {p.name for p in out.glob("*.log")}
    assert {"api-0.log", "api-1.log", "worker-0.log", "worker-1.log", "redis.log"} <= logs


def test_redis_mode_flags_are_checked_before_anything_starts() -> None:
    for args, why in [
        (("--url", "http://127.0.0.1:9", "--redis-workers", "2"), "they need --launch"),
        (("--launch", "--api-nodes", "2"), "--api-nodes needs --redis-workers"),
        (("--launch", "--redis-workers", "-1"), "--redis-workers must be >= 0"),
    ]:
        done = cli(*args, timeout=30)
        assert done.returncode == 2 and why in done.stderr, (args, done.stderr)
