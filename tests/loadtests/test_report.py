"""Report maths: nearest-rank percentiles, per-second throughput, ratios and target verdicts."""

from __future__ import annotations

import pytest

from loadtests.report import (
    comparison,
    distribution_ms,
    per_second,
    percentile,
    ratios,
    targets,
)


def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.50) == 50
    assert percentile(values, 0.90) == 90
    assert percentile(values, 0.99) == 99
    assert percentile(values, 1.0) == 100
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([], 0.5) is None
    # Always an observed value, never an interpolation: 10 values, p99 is the largest.
    assert percentile([float(v) for v in range(10)], 0.99) == 9.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0


def test_distribution_in_milliseconds() -> None:
    d = distribution_ms([0.003, 0.001, 0.002, 0.010])
    assert d == {"p50": 2.0, "p90": 10.0, "p99": 10.0, "max": 10.0, "mean": 4.0}
    assert distribution_ms([])["p99"] is None


def test_per_second_counts_each_whole_second() -> None:
    assert per_second([0.1, 0.9, 1.0, 3.5]) == [2, 1, 0, 1]
    assert per_second([]) == []


def test_smoothing_for_long_throughput_series() -> None:
    from loadtests.plots import smooth

    x, y = smooth([1, 3, 5, 7, 9], 2)
    assert x.tolist() == [1.0, 3.0] and y.tolist() == [2.0, 6.0]
    x, y = smooth([4, 5], 1)
    assert x.tolist() == [0, 1] and y.tolist() == [4.0, 5.0]


def test_ratios_are_better_above_one() -> None:
    a = {"exec_per_s": 300.0, "latency_ms": {"p50": 5.0, "p90": 8.0, "p99": 10.0}}
    b = {"exec_per_s": 10.0, "latency_ms": {"p50": 50.0, "p90": 80.0, "p99": None}}
    assert ratios(a, b) == {
        "exec_per_s": 30.0,
        "latency_p50": 10.0,
        "latency_p90": 10.0,
        "latency_p99": None,
    }


def test_latencies_are_compared_only_between_like_runs() -> None:
    plan = {"count": 100, "concurrency": 10, "batch": 1}
    a = {"label": "service", "workload": "trivial", "plan": plan, "exec_per_s": 300.0,
         "latency_ms": {"p50": 5.0, "p90": 8.0, "p99": 10.0}}  # fmt: skip
    b = {
        **a,
        "label": "naive",
        "exec_per_s": 30.0,
        "latency_ms": {"p50": 50.0, "p90": 80.0, "p99": 100.0},
    }
    assert "10.00× the exec/s; latency p50 10.00× and p99 10.00× lower" in comparison(a, b)
    fewer = {**b, "plan": {**plan, "count": 10}}
    assert "latencies not compared" in comparison(a, fewer)


def _fig(**over: object) -> dict:
    fig = {
        "workload": "trivial",
        "max_in_flight": 50_000,
        "lost": 0,
        "wrong": 0,
        "plan": {"in_flight": 50_000},
        "latency_ms": {"p99": 900.0},
        "server": {"depth_max": 50_000, "api_rss_mb": {"max": 700.0}},
    }
    fig.update(over)
    return fig


@pytest.mark.parametrize(
    ("fig", "name", "verdict"),
    [
        (_fig(), "50k in flight, 0 lost, 0 wrong", "met"),
        (_fig(lost=1), "50k in flight, 0 lost, 0 wrong", "MISSED"),
        (
            _fig(max_in_flight=49_999),
            "50k in flight, 0 lost, 0 wrong",
            "not measured by this run",
        ),
        (_fig(), "API memory < 1 GiB at 50k deep", "met"),
        (
            _fig(server={"depth_max": 49_000, "api_rss_mb": {"max": 1500.0}}),
            "API memory < 1 GiB at 50k deep",
            "MISSED",
        ),
        (
            _fig(max_in_flight=64, latency_ms={"p99": 12.0}),
            "p99 trivial < 20 ms at <= 100 in flight",
            "met",
        ),
        (
            _fig(max_in_flight=64, latency_ms={"p99": 25.0}),
            "p99 trivial < 20 ms at <= 100 in flight",
            "MISSED",
        ),
        (
            _fig(workload="mixed", max_in_flight=64),
            "p99 trivial < 20 ms at <= 100 in flight",
            "not measured by this run",
        ),
    ],
)
def test_targets_are_judged_only_where_measured(fig: dict, name: str, verdict: str) -> None:
    assert targets(fig)[name]["verdict"] == verdict
