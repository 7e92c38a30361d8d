"""The capacity profile on the real node (spec.slo, docs/capacity.md): the operator's profile Job starts one
replica's runtime from the CPU runtime image, `pagoda-runtime profile` loads it with GuideLLM at rising
concurrency, and status.profile (and kubectl's At-SLO column) reports the curve and the highest concurrency
within the SLO; with autoscaling.metric SLO, KEDA's HPA then holds the service at the measured point, and a
load above it scales the service out with no failed request, while the dashboard's capacity row and
status.sizing (kubectl get's Load%, and -o wide's Needed and Cost/1M) report the same load, replicas needed
and cost.

The SLO is loose (the tiny model on two shared cores answers in tens of milliseconds), so every step meets it
and the measured concurrency is the top step's: what is asserted does not depend on the machine's speed.
For the same reason the engine tuning (spec.slo.tuneEngine, on by default) runs no candidate: it is reported
with the one server measured (tier 3 runs a candidate, tests/runtime/test_rt_profile.py).
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import yaml

from e2e.lab import realnode
from e2e.lab.autoscaling import autoscaled_sample
from e2e.lab.chartenv import ChartOperator
from e2e.lab.observability import Load, PrometheusAt, dashboard, panel_queries
from e2e.lab.processes import wait_until
from e2e.lab.realpods import finished_profile, get_json, hpa_target, ready_pods, service_url, wait_condition
from e2e.lab.stack import Stack
from pagoda.operator.reconcile.profile import JOB_NAME_LABEL

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
NAME = "tiny"
STREAMS = [1, 2, 4]
RATIO = 0.5  # the target: half the measured 4, so that a load of 6 clients asks for the second replica
SLO = {
    "ttftMs": 20000,
    "interTokenMs": 5000,
    "request": {"promptTokens": 32, "outputTokens": 16},
    "profile": {"streams": STREAMS, "stepSeconds": 8},
}


GPU_HOUR_PRICE = 2.5
CAPACITY_PANELS = (
    "Capacity at the SLO",
    "Load vs capacity at the SLO",
    "Replicas needed at the SLO",
    "Cost per 1M tokens at the SLO",
)


def profiled_sample(namespace: str) -> dict[str, Any]:
    sample = autoscaled_sample(namespace)
    sample["spec"]["slo"] = SLO
    sample["spec"]["cost"] = {"gpuHourPrice": GPU_HOUR_PRICE}
    sample["spec"]["autoscaling"].update(
        {"metric": "SLO", "sloTargetRatio": RATIO, "targetInFlight": 8, "maxReplicas": 2}
    )
    return sample


def test_profile_job_measures_a_replica_and_metric_slo_scales_at_that_point(
    stack: Stack, operator: ChartOperator, namespace: str
) -> None:
    cluster = stack.cluster
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(profiled_sample(namespace)))
    wait_condition(cluster, namespace, NAME, "Ready", timeout=600)
    # Before a profile: targetInFlight, as KEDA's HPA holds it.
    wait_until(lambda: hpa_target(cluster, namespace, NAME) == "8", "the HPA at targetInFlight", 120)

    started = time.monotonic()
    done = finished_profile(cluster, namespace, NAME, timeout=900)
    print(f"\nThe profile ran {time.monotonic() - started:.0f} s after the service was Ready: {done}")
    assert done["state"] == "Succeeded", done
    steps = done["steps"]
    assert [s["concurrency"] for s in steps] == STREAMS
    for step in steps:
        assert step["requests"] > 0 and step["errors"] == 0 and step["meetsSlo"], step
        assert 0 < step["ttftP95Ms"] < SLO["ttftMs"] and 0 < step["interTokenP95Ms"] < SLO["interTokenMs"]
        assert step["outputTokensPerSecond"] > 0
    assert done["concurrency"] == STREAMS[-1] and done["measuredBy"] == done["job"]
    assert done["requestsPerSecond"] == steps[-1]["requestsPerSecond"]
    # spec.slo.tuneEngine (the default) ran with the profile: with every step within the SLO no objective
    # binds, so no candidate was worth a server, and the replicas keep the spec's settings.
    engine = done["engine"]
    assert engine["candidates"] == [
        {"concurrency": STREAMS[-1], "requestsPerSecond": done["requestsPerSecond"]}
    ]
    assert engine["goodput"] == engine["baselineGoodput"] == done["requestsPerSecond"]
    assert "maxNumBatchedTokens" not in engine and "maxNumSeqs" not in engine
    # It ran on the real node, from the runtime image, and exited 0.
    (pod,) = get_json(cluster, "pods", "-n", namespace, "-l", f"{JOB_NAME_LABEL}={done['job']}")["items"]
    assert pod["spec"]["nodeName"] == realnode.NODE_NAME and pod["status"]["phase"] == "Succeeded"
    # kubectl get shows it.
    header, row = cluster.kubectl("get", "inferenceservice", NAME, "-n", namespace).stdout.splitlines()[:2]
    column = header.index(" AT-SLO ") + 1  # columns are left-aligned: the value starts where its name does
    assert row[column:].split()[0] == str(STREAMS[-1]), (header, row)

    # metric SLO: the HPA now holds half the measured 4 per replica; 6 clients ask for 2 replicas.
    target = str(max(1, int(STREAMS[-1] * RATIO)))
    wait_until(lambda: hpa_target(cluster, namespace, NAME) == target, f"the HPA at {target}", 120)
    load = Load(service_url(cluster, namespace, NAME), NAME, clients=6, max_tokens=32, max_seconds=600)
    load.start()
    try:
        wait_until(lambda: len(ready_pods(cluster, namespace, NAME)) == 2, "a second Ready replica", 600, 2)
        panels = capacity_panels(stack, namespace)
        sizing = sizing_under_load(stack, namespace)
    finally:
        load.stop()
    print(f"Scaled out at the measured point: completed={load.completed} failed={len(load.failures)}")
    assert load.failures == [], load.failures[:10]
    assert load.completed > 0
    # The dashboard's capacity row, on the same data: kube-state-metrics exports status.profile.
    print("Capacity panels under load:", {key: round(value, 3) for key, value in panels.items()})
    per_replica, in_flight = (
        panels[("Capacity at the SLO", "per replica")],
        panels[("Capacity at the SLO", "in flight")],
    )
    ready = panels[("Replicas needed at the SLO", "ready")]
    assert per_replica == STREAMS[-1] and in_flight > 0 and ready >= 1
    assert panels[("Capacity at the SLO", "all ready replicas")] == per_replica * ready
    # Needed at the HPA's own per-replica target (sloTargetRatio x the measured concurrency), not at 100%.
    assert panels[("Replicas needed at the SLO", "needed")] == math.ceil(in_flight / int(target))
    assert panels[("Load vs capacity at the SLO", "load / capacity")] == pytest.approx(
        in_flight / (per_replica * ready)
    )
    expected_cost = GPU_HOUR_PRICE / 3600 * 1e6 / done["outputTokensPerSecond"]
    assert panels[("Cost per 1M tokens at the SLO", "at the SLO (USD)")] == pytest.approx(
        expected_cost, rel=0.01
    )
    # status.sizing, the same figures from the autoscaler's reading, in one status (one pass wrote it all).
    print("status.sizing under load:", {k: v for k, v in sizing.items() if k != "status"})
    status = sizing["status"]
    in_flight, ready = sizing["inFlight"], status["readyReplicas"]
    assert ready >= 1 and in_flight > 0, status
    (reading,) = [t for t in status["autoscaling"]["triggers"] if t["name"] == "in-flight"]
    assert in_flight == pytest.approx(float(reading["value"]) * status["autoscaling"]["currentReplicas"])
    assert sizing["capacity"] == per_replica * ready
    assert sizing["loadPercent"] == round(100 * in_flight / (per_replica * ready))
    assert sizing["targetPerReplica"] == int(target)
    assert sizing["replicasNeeded"] == math.ceil(in_flight / int(target))
    assert sizing["costPerMillionTokens"] == pytest.approx(expected_cost, rel=1e-3)
    assert sizing["currency"] == "USD"
    # kubectl get shows the load (and -o wide the replicas needed and the cost) as status.sizing has them.
    assert sizing["columns"] == {
        "LOAD%": str(sizing["loadPercent"]),
        "NEEDED": str(sizing["replicasNeeded"]),
        "COST/1M": pytest.approx(sizing["costPerMillionTokens"]),
    }


def sizing_under_load(stack: Stack, namespace: str) -> dict[str, Any]:
    """status.sizing once the autoscaler has read requests in flight, with the whole status it came in
    (`status`) and the sizing columns of `kubectl get -o wide` read right after it, unchanged in between
    (`columns`: LOAD%, NEEDED and COST/1M, the cost as a float)."""
    cluster = stack.cluster

    def read() -> dict[str, Any] | None:
        status = get_json(cluster, "inferenceservice", NAME, "-n", namespace).get("status") or {}
        sizing = status.get("sizing") or {}
        if not sizing.get("inFlight") or "loadPercent" not in sizing:
            return None
        header, row = cluster.kubectl(
            "get", "inferenceservice", NAME, "-n", namespace, "-o", "wide"
        ).stdout.splitlines()[:2]
        columns: dict[str, Any] = {}
        for name in ("LOAD%", "NEEDED", "COST/1M"):
            start = header.index(f" {name} ") + 1  # left-aligned: the value starts where its name does
            columns[name] = row[start:].split()[0]
        columns["COST/1M"] = float(columns["COST/1M"])
        again = get_json(cluster, "inferenceservice", NAME, "-n", namespace)["status"].get("sizing")
        return {**sizing, "status": status, "columns": columns} if again == sizing else None

    found: dict[str, Any] = wait_until(read, "status.sizing with requests in flight", 120, 2)
    return found


def capacity_panels(stack: Stack, namespace: str) -> dict[tuple[str, str], float]:
    """Each query of the capacity row, all evaluated at one instant at which every one has data
    (kube-state-metrics and the runtime's series scraped) and requests were in flight: (panel, legend) -> its
    value. (A gauge sampled between two requests of every client would read 0 in flight.)"""
    prometheus = PrometheusAt(stack.prometheus_url)
    queries = [
        (title, legend, expr)
        for title, legend, expr in panel_queries(
            dashboard("inferenceservice"), {"namespace": namespace, "service": NAME}
        )
        if title in CAPACITY_PANELS
    ]
    assert {title for title, _, _ in queries} == set(CAPACITY_PANELS)

    def values() -> dict[tuple[str, str], float] | None:
        found, at = {}, time.time() - 1
        for title, legend, expr in queries:
            result = prometheus.query(expr, at=at)
            if not result:
                return None
            found[(title, legend.replace("{{currency}}", result[0]["metric"].get("currency", "")))] = float(
                result[0]["value"][1]
            )
        return found

    def under_load() -> dict[tuple[str, str], float] | None:
        found = values()
        return found if found and found[("Capacity at the SLO", "in flight")] > 0 else None

    answered: dict[tuple[str, str], float] = wait_until(under_load, "every capacity panel under load", 120, 2)
    return answered
