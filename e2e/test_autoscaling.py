"""Autoscaling end to end on real components: the runtime pods' in-flight requests rise under load,
Prometheus has them (found through the operator's ServiceMonitor), KEDA's adapter serves them through the
API server, the HPA that KEDA manages asks for more replicas, new pods start real runtimes and become
Ready, the load (through the Service's ClusterIP, from keep-alive clients that never retry) spreads over
them; at the peak Prometheus hangs (SIGSTOP): KEDA falls back and holds the replicas instead of acting on
metrics it cannot read; once Prometheus answers again and the load ends, replicas return to the minimum after
the cooldown and the removed pods drain: no request fails over the whole run. Then a one-minute pre-warm
window (spec.autoscaling.schedule, a KEDA cron trigger) starts a replica before it opens and releases it
after. The scenario is e2e/lab/autoscaling.py."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from e2e.lab.autoscaling import (
    MAX_REPLICAS,
    MIN_REPLICAS,
    NAME,
    TARGET_IN_FLIGHT,
    Sampler,
    frozen,
    run_prewarm,
    run_scenario,
    scaled_object_condition,
)
from e2e.lab.chartenv import ChartOperator
from e2e.lab.observability import KUBE_STATE_METRICS, PrometheusAt, dashboard, panel_queries
from e2e.lab.processes import WaitTimeout, wait_until
from e2e.lab.prometheus_operator import DEFAULT_PROMETHEUS
from e2e.lab.realpods import condition, get_json, isvc
from e2e.lab.stack import Stack

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(1500)  # three real runtimes start one after another on two cores; a pre-warm window
def test_keda_scales_real_pods_on_in_flight_requests_and_back(
    stack: Stack, operator: ChartOperator, namespace: str
) -> None:
    began = time.time()
    outage = PrometheusOutage(stack)
    timeline, load = run_scenario(stack.cluster, namespace, stack.prometheus_url, at_peak=outage)

    assert load.failures == [], load.failures[:10]
    # Prometheus hung under the peak load: KEDA fell back, and no replica was removed until it answered.
    assert outage.fallback_after is not None and outage.fallback_after < 90, outage.fallback_after
    assert outage.replicas and min(outage.replicas) == MAX_REPLICAS, outage.replicas
    # Once Prometheus answered (and the peak ended) KEDA read its metrics again: the fallback ended, and the
    # replicas went back to the minimum (checked below; the fallback would hold them at 3).
    scaled = get_json(stack.cluster, "scaledobject", NAME, "-n", namespace)
    assert condition(scaled, "Fallback").get("status") == "False", scaled["status"]
    # The InferenceService said so while it held: the condition ScalingMetricsUnavailable named the trigger
    # (since when: its lastTransitionTime), and it ended with the fallback.
    assert outage.blind is not None and outage.blind["reason"] == "KedaFallback", outage.blind
    assert "trigger in-flight" in outage.blind["message"] and outage.blind["lastTransitionTime"], outage.blind
    wait_until(
        lambda: (
            condition(isvc(stack.cluster, namespace, NAME), "ScalingMetricsUnavailable").get("status")
            == "False"
        ),
        "the condition ScalingMetricsUnavailable False after the fallback",
        timeout=30,
    )
    recovered = (
        "after the peak" if outage.recovered_after is None else f"{outage.recovered_after:.0f} s after"
    )
    print(
        f"\nPrometheus hung {outage.seconds:.0f} s; KEDA fell back after {outage.fallback_after:.0f} s and "
        f"read its metrics again {recovered}"
    )
    print(f"Scale-out, Prometheus hang, scale-in: completed={load.completed} failed={len(load.failures)}")
    assert load.completed > 50
    # KEDA found Prometheus at the default address, a Service name, through the cluster DNS.
    trigger = get_json(stack.cluster, "scaledobject", NAME, "-n", namespace)["spec"]["triggers"][0]
    assert trigger["metadata"]["serverAddress"] == DEFAULT_PROMETHEUS.geturl()
    during = [s for s in timeline.samples if timeline.marks["load_start"] < s.t < timeline.marks["load_end"]]
    # The signal went through every stage: Prometheus, KEDA's external metric, the HPA.
    assert max(s.signal or 0 for s in during) > TARGET_IN_FLIGHT
    assert max(s.external or 0 for s in during) > TARGET_IN_FLIGHT
    assert max(s.desired or 0 for s in during) == MAX_REPLICAS
    assert max(s.ready for s in during) == MAX_REPLICAS
    # The load, sent through the ClusterIP, spread over every replica it had: each pod finished requests, as
    # vLLM counts them and Prometheus scraped them (the removed pods' series included).
    seconds = int(time.time() - began) + 60
    served_by = (
        f'sum by (pod) (max_over_time(vllm:request_success_total{{namespace="{namespace}"}}[{seconds}s]))'
    )
    served = {
        r["metric"]["pod"]: float(r["value"][1]) for r in PrometheusAt(stack.prometheus_url).query(served_by)
    }
    assert len([pod for pod, count in served.items() if count > 0]) >= MAX_REPLICAS, served
    last = timeline.samples[-1]
    assert (last.desired, last.ready) == (MIN_REPLICAS, MIN_REPLICAS)
    assert timeline.marks["second_ready"] < timeline.marks["max_ready"] < timeline.marks["load_end"]

    # The InferenceService says what the autoscaler did and why: status.autoscaling and a "Scaled" Event per
    # scale, e.g. "1 -> 3: in-flight 9.5 per replica over target 4".
    scaling = isvc(stack.cluster, namespace, NAME)["status"]["autoscaling"]
    assert (scaling["currentReplicas"], scaling["desiredReplicas"]) == (MIN_REPLICAS, MIN_REPLICAS), scaling
    assert [(t["name"], t["target"], t["perReplica"]) for t in scaling["triggers"]] == [
        ("in-flight", str(TARGET_IN_FLIGHT), True)
    ], scaling
    assert (scaling["lastScale"]["direction"], scaling["lastScale"]["to"]) == ("Down", MIN_REPLICAS), scaling
    events = get_json(
        stack.cluster,
        "-n",
        namespace,
        "events",
        "--field-selector",
        f"involvedObject.name={NAME},reason=Scaled",
    )["items"]
    scales = [re.fullmatch(r"(\d+) -> (\d+): (.*)", e["message"]) for e in events]
    assert scales and all(scales), [e["message"] for e in events]
    ups = [m for m in scales if m and int(m.group(2)) > int(m.group(1))]
    downs = [m for m in scales if m and int(m.group(2)) < int(m.group(1))]
    assert ups and max(int(m.group(2)) for m in ups) == MAX_REPLICAS, [e["message"] for e in events]
    assert all(
        re.fullmatch(rf"in-flight [\d.]+ per replica over target {TARGET_IN_FLIGHT}", m.group(3)) for m in ups
    )
    assert downs and min(int(m.group(2)) for m in downs) == MIN_REPLICAS, [e["message"] for e in events]
    assert all("under target" in m.group(3) for m in downs), [e["message"] for e in events]

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

    # Pre-warming: a one-minute schedule window for 2 replicas on the idle service (at 1). The warm replica
    # starts in the warm-up before the window (not before it), is Ready about when the window opens (the
    # warm-up is the cold start this machine measured, plus KEDA's and the HPA's lag: e2e/lab/autoscaling.py's
    # prewarm_warm_up), serves in it through the Service, and goes after it.
    warm = run_prewarm(stack.cluster, namespace)
    print(f"\nPre-warm: {warm}")
    [cron] = [t for t in warm.triggers if t["type"] == "cron"]
    assert (cron["name"], cron["metadata"]["desiredReplicas"]) == ("warm-0", "2"), cron
    assert warm.created is not None and warm.ready is not None
    # Created after the cron trigger opened (its second-resolution timestamp; KEDA polls every few seconds).
    assert warm.opens - warm.warm_up - 1 <= warm.created < warm.opens, warm
    assert warm.ready <= warm.opens + 20, warm
    assert (warm.ready_in_window, warm.served) == (2, 200), warm
    assert warm.released is not None and warm.released > warm.closes, warm


class PrometheusOutage:
    """Hangs Prometheus (and its ServiceMonitor sync) under the peak load until KEDA reports its fallback (and
    the InferenceService its condition ScalingMetricsUnavailable: `blind`) and for at least HOLD_SECONDS (as
    long as the scenario's peak lasts without it); samples the replicas (the HPA's current, the Deployment's
    ready) and that condition from the API server meanwhile. A fallback to a fixed count (KEDA's
    `static`) would drop them to it.

    After the hang the peak goes on for up to RECOVERY_SECONDS while the fallback may end (`recovered_after`);
    the test asserts that it has ended once the replicas are back at the minimum. Not under the peak: there
    three engines hold both cores, Prometheus catches up after its hang, and its answers can outlast KEDA's
    3 s HTTP timeout for minutes (a CI run saw the fallback go on for over 120 s of peak load, and a local
    one KEDA's queries time out then while ours, allowed 30 s, answered): the machine's overload, not
    KEDA's recovery. When the fallback outlasts RECOVERY_SECONDS, keda_state's report is printed."""

    HOLD_SECONDS = 20
    RECOVERY_SECONDS = 30

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.fallback_after: float | None = None  # seconds from the hang to KEDA's Fallback condition
        self.seconds = 0.0  # how long Prometheus hung
        self.recovered_after: float | None = None  # seconds from the resume to the fallback's end
        self.replicas: list[int] = []  # the lower of current and ready, every second of the hang
        self.blind: dict[str, Any] | None = None  # the service's ScalingMetricsUnavailable once it was True

    def sample(self, sampler: Sampler) -> None:
        hpa = sampler.get(
            f"/apis/autoscaling/v2/namespaces/{sampler.namespace}/horizontalpodautoscalers/keda-hpa-{NAME}"
        )
        deployment = sampler.get(f"/apis/apps/v1/namespaces/{sampler.namespace}/deployments/{NAME}") or {}
        current = int(((hpa or {}).get("status") or {}).get("currentReplicas") or 0)
        self.replicas.append(min(current, int((deployment.get("status") or {}).get("readyReplicas") or 0)))
        path = f"/apis/pagoda.dev/v1alpha1/namespaces/{sampler.namespace}/inferenceservices/{NAME}"
        service = sampler.get(path)
        found = condition(service or {}, "ScalingMetricsUnavailable")
        if self.blind is None and found.get("status") == "True":
            self.blind = found

    def __call__(self, sampler: Sampler) -> None:
        pid = self.stack.monitoring.pid()
        started = time.monotonic()
        with frozen(pid):
            while (
                time.monotonic() - started < self.HOLD_SECONDS
                or self.fallback_after is None
                or self.blind is None
            ):
                assert time.monotonic() - started < 120, f"No fallback in 120 s:\n{self.keda_state(sampler)}"
                self.sample(sampler)
                if self.fallback_after is None and scaled_object_condition(sampler, "Fallback") == "True":
                    self.fallback_after = time.monotonic() - started
                time.sleep(1)
            self.seconds = time.monotonic() - started
        resumed = time.monotonic()
        print(f"\nPrometheus resumed at {time.asctime(time.gmtime())} UTC")
        try:
            wait_until(
                lambda: scaled_object_condition(sampler, "Fallback") == "False",
                "KEDA's fallback to end at the peak",
                timeout=self.RECOVERY_SECONDS,
                interval=1,
            )
        except WaitTimeout:
            print(f"KEDA still in fallback after the resume:\n{self.keda_state(sampler)}")
        else:
            self.recovered_after = time.monotonic() - resumed

    def keda_state(self, sampler: Sampler) -> str:
        """What KEDA saw: the ScaledObject's health and conditions, the HPA's conditions, the trigger's query
        timed from here (to the Prometheus pod, where the headless Service's name leads KEDA) and through
        KEDA's adapter, and the operator's last errors."""
        path = f"/namespaces/{sampler.namespace}"
        obj = sampler.get(f"/apis/keda.sh/v1alpha1{path}/scaledobjects/{NAME}") or {}
        hpa = sampler.get(f"/apis/autoscaling/v2{path}/horizontalpodautoscalers/keda-hpa-{NAME}") or {}
        status = obj.get("status") or {}
        conditions = [
            (c.get("type"), c.get("status"), c.get("reason")) for c in status.get("conditions") or []
        ]
        hpa_conditions = [
            (c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
            for c in (hpa.get("status") or {}).get("conditions") or []
        ]
        query = sampler.trigger_query()
        errors = [
            line
            for line in self.stack.addons.keda.operator.log().splitlines()
            if "ERROR" in line or "allback" in line
        ]
        return "\n".join(
            [
                f"at {time.asctime(time.gmtime())} UTC",
                f"ScaledObject health: {status.get('health')}",
                f"ScaledObject conditions: {conditions}",
                f"HPA conditions: {hpa_conditions}",
                f"trigger query: {timed_query(sampler.prometheus_url, query)}",
                f"through KEDA's adapter: {sampler.external(hpa)}",
                "KEDA operator, last errors and fallback lines:",
                *errors[-25:],
            ]
        )


def timed_query(url: str, query: str) -> str:
    """`query`'s answer from the Prometheus at `url`, or its error, and how long it took: a diagnostic."""
    started = time.monotonic()
    try:
        answer: object = PrometheusAt(url).query(query)
    except Exception as exc:  # noqa: BLE001 - a diagnostic: the failure is what it reports
        answer = repr(exc)
    return f"{answer} in {time.monotonic() - started:.1f} s"
