"""Autoscaling end to end on real components: the runtime pods' in-flight requests rise under load,
Prometheus has them (found through the operator's ServiceMonitor), KEDA's adapter serves them through the
API server, the HPA that KEDA manages asks for more replicas, new pods start real runtimes and become
Ready, the load spreads over them; after the load, replicas return to the minimum after the cooldown and the
removed pods drain: no request fails over the whole run. The scenario is e2e/autoscaling.py."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from e2e.autoscaling import MAX_REPLICAS, MIN_REPLICAS, TARGET_IN_FLIGHT, run_scenario
from e2e.observability import KUBE_STATE_METRICS, PrometheusAt, dashboard, panel_queries
from e2e.processes import OperatorProcess
from e2e.stack import Stack

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(1200)  # three real runtimes start one after another on two cores
def test_keda_scales_real_pods_on_in_flight_requests_and_back(
    stack: Stack, operator: OperatorProcess, namespace: str
) -> None:
    began = time.time()
    timeline, load = run_scenario(stack.cluster, namespace, stack.prometheus_url)

    assert load.failures == [], load.failures[:10]
    assert load.completed > 50
    during = [s for s in timeline.samples if timeline.marks["load_start"] < s.t < timeline.marks["load_end"]]
    # The signal went through every stage: Prometheus, KEDA's external metric, the HPA.
    assert max(s.signal or 0 for s in during) > TARGET_IN_FLIGHT
    assert max(s.external or 0 for s in during) > TARGET_IN_FLIGHT
    assert max(s.desired or 0 for s in during) == MAX_REPLICAS
    assert max(s.ready for s in during) == MAX_REPLICAS
    # The load spread over every replica it had (each pod IP served requests).
    served = Counter(r["endpoint"] for r in timeline.requests)
    assert len(served) >= MAX_REPLICAS, served
    last = timeline.samples[-1]
    assert (last.desired, last.ready) == (MIN_REPLICAS, MIN_REPLICAS)
    assert timeline.marks["second_ready"] < timeline.marks["max_ready"] < timeline.marks["load_end"]

    # The dashboard's kube-state-metrics panels show the run: desired and ready replicas went 1 -> 3 -> 1,
    # and "Scaling events" saw the desired count change.
    prometheus = PrometheusAt(stack.prometheus_url)
    panels = {
        (title, legend): expr
        for title, legend, expr in panel_queries(
            dashboard("inferenceservice"), {"namespace": namespace, "service": "tiny"}
        )
        if any(metric in expr for metric in KUBE_STATE_METRICS)
    }
    assert len(panels) == 3, panels

    def series(key: tuple[str, str]) -> list[float]:
        [result] = prometheus.query_range(panels[key], began, time.time(), step="1s")
        return [float(v) for _, v in result["values"]]

    desired = series(("Replicas: desired vs ready", "desired"))
    ready = series(("Replicas: desired vs ready", "ready (Deployment)"))
    assert (min(desired), max(desired), desired[-1]) == (MIN_REPLICAS, MAX_REPLICAS, MIN_REPLICAS)
    assert (max(ready), ready[-1]) == (MAX_REPLICAS, MIN_REPLICAS)
    assert max(series(("Scaling events", "desired replicas changed"))) >= 1
