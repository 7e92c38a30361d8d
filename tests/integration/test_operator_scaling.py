"""Autoscaling on/off (ScaledObject and who owns the Deployment's replicas), `kubectl scale`, and KEDA's
fallback reported as the condition ScalingMetricsUnavailable."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

from harness import OperatorProcess, wait_until
from isvc import create, create_ready, get, managed_fields_of, patch, ready_and_current, wait_ready
from kubernetes import client
from test_operator_routing import ROUTING, condition, install_crd

from e2e.lab.cluster import Cluster
from pagoda.operator.api.status import METRICS_UNAVAILABLE
from pagoda.operator.kube.client import Kube
from pagoda.operator.resources.scaledobject import FALLBACK_FAILURES


def owns_replicas(deployment: dict[str, Any]) -> bool:
    return "f:replicas" in managed_fields_of(deployment, "pagoda-operator").get("f:spec", {})


def test_autoscaling_on_and_off(
    operator: OperatorProcess, kube: client.CustomObjectsApi, cluster_api: Any, raw: Kube, namespace: str
) -> None:
    autoscaling = {"minReplicas": 1, "maxReplicas": 4, "targetQueueDepth": 5}
    monitoring = {"serviceMonitor": {"enabled": True}}  # autoscaling needs a metrics source
    create(kube, "auto", namespace, replicas=None, autoscaling=autoscaling, monitoring=monitoring)
    scaled = wait_until(
        lambda: raw.get("keda.sh/v1alpha1", "scaledobjects", namespace, "auto"), "a ScaledObject"
    )
    assert scaled["spec"]["scaleTargetRef"]["name"] == "auto"
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (1, 4)
    (trigger,) = [t for t in scaled["spec"]["triggers"] if "pagoda_queue_depth" in t["metadata"]["query"]]
    assert f'namespace="{namespace}"' in trigger["metadata"]["query"]
    assert 'service="auto"' in trigger["metadata"]["query"]
    # Created at minReplicas (reconcile/desired.py start_at_min_replicas), then the field goes to the HPA.
    deployment = wait_until(
        lambda: (d := raw.get("apps/v1", "deployments", namespace, "auto")) and not owns_replicas(d) and d,
        "the Deployment, its replicas released to KEDA/HPA",
    )
    assert deployment["spec"]["replicas"] == 1

    # The HPA (here: someone else) sets replicas; the operator must not fight it.
    wait_ready(kube, "auto", namespace, "Ready with 1 replica")
    writes = operator.total("pagoda_operator_api_writes_total", kind="Deployment")
    apps = client.AppsV1Api(cluster_api)
    apps.patch_namespaced_deployment_scale("auto", namespace, {"spec": {"replicas": 3}})
    wait_until(
        lambda: (get(kube, "auto", namespace) or {}).get("status", {}).get("readyReplicas") == 3,
        "3 ready replicas reported",
        90,
    )
    dep = raw.get("apps/v1", "deployments", namespace, "auto")
    assert dep is not None and dep["spec"]["replicas"] == 3
    assert operator.total("pagoda_operator_api_writes_total", kind="Deployment") == writes

    # Autoscaling off: the ScaledObject goes, the operator owns replicas again.
    patch(kube, "auto", namespace, {"autoscaling": None, "replicas": 2})
    wait_until(
        lambda: raw.get("keda.sh/v1alpha1", "scaledobjects", namespace, "auto") is None,
        "the ScaledObject deleted",
    )
    dep = wait_until(
        lambda: (
            (d := raw.get("apps/v1", "deployments", namespace, "auto")) and d["spec"]["replicas"] == 2 and d
        ),
        "replicas 2",
    )
    assert owns_replicas(dep)
    wait_ready(kube, "auto", namespace, "Ready with 2 replicas")

    # And on again.
    patch(kube, "auto", namespace, {"autoscaling": autoscaling, "replicas": None})
    wait_until(
        lambda: raw.get("keda.sh/v1alpha1", "scaledobjects", namespace, "auto"), "the ScaledObject again"
    )
    wait_until(
        lambda: (d := raw.get("apps/v1", "deployments", namespace, "auto")) and not owns_replicas(d),
        "replicas released to the autoscaler",
    )


def test_kubectl_scale_uses_the_scale_subresource(
    operator: OperatorProcess,
    cluster: Cluster,
    kube: client.CustomObjectsApi,
    raw: Kube,
    namespace: str,
) -> None:
    create_ready(kube, "scaled", namespace, replicas=1)
    cluster.kubectl("scale", "-n", namespace, "inferenceservice/scaled", "--replicas=3")
    assert (get(kube, "scaled", namespace) or {})["spec"]["replicas"] == 3
    wait_until(
        lambda: (d := raw.get("apps/v1", "deployments", namespace, "scaled")) and d["spec"]["replicas"] == 3,
        "the Deployment scaled to 3",
    )
    obj = wait_until(
        lambda: (
            (o := get(kube, "scaled", namespace))
            and ready_and_current(o)
            and o["status"]["replicas"] == 3
            and o
        ),
        "status.replicas 3 and Ready",
        90,
    )
    assert obj["status"]["readyReplicas"] == 3
    scale = cluster.kubectl(
        "get",
        "-n",
        namespace,
        "inferenceservice/scaled",
        "--subresource=scale",
        "-o",
        "jsonpath={.status.replicas}",
    )
    assert scale.stdout.strip() == "3"


def test_turning_autoscaling_on_keeps_the_replicas_it_has(
    operator: OperatorProcess, kube: client.CustomObjectsApi, raw: Kube, namespace: str
) -> None:
    """An apply that leaves out spec.replicas would reset it to 1 (the operator's release of the field):
    the operator hands the count over first (reconcile/apply.py hand_over_replicas). Sampled every 100 ms."""
    create_ready(kube, "handover", namespace, replicas=3)
    seen: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            deployment = raw.get("apps/v1", "deployments", namespace, "handover") or {}
            seen.append(int((deployment.get("spec") or {}).get("replicas") or 0))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        autoscaling = {"minReplicas": 3, "maxReplicas": 5, "targetQueueDepth": 5}
        monitoring = {"serviceMonitor": {"enabled": True}}  # autoscaling needs a metrics source
        patch(
            kube,
            "handover",
            namespace,
            {"replicas": None, "autoscaling": autoscaling, "monitoring": monitoring},
        )
        released = wait_until(
            lambda: (
                (d := raw.get("apps/v1", "deployments", namespace, "handover")) and not owns_replicas(d) and d
            ),
            "replicas released to the autoscaler",
        )
        time.sleep(2)  # a few samples after the release
    finally:
        stop.set()
        sampler.join(timeout=10)
    assert len(seen) > 10 and min(seen) == 3, seen
    assert released["spec"]["replicas"] == 3


def test_a_new_autoscaled_service_starts_at_its_minimum(
    operator: OperatorProcess, kube: client.CustomObjectsApi, raw: Kube, namespace: str
) -> None:
    """Created at autoscaling.minReplicas, not at the API server's default of 1 (reconcile/desired.py
    start_at_min_replicas), then handed to the autoscaler. No KEDA runs in this tier: nothing else sets it."""
    autoscaling = {"minReplicas": 2, "maxReplicas": 4, "targetQueueDepth": 5}
    monitoring = {"serviceMonitor": {"enabled": True}}
    create(kube, "at-min", namespace, replicas=None, autoscaling=autoscaling, monitoring=monitoring)
    released = wait_until(
        lambda: (d := raw.get("apps/v1", "deployments", namespace, "at-min")) and not owns_replicas(d) and d,
        "the Deployment, its replicas released to the autoscaler",
    )
    assert released["spec"]["replicas"] == 2
    wait_ready(kube, "at-min", namespace, "Ready with 2 replicas")


def test_kedas_fallback_is_a_condition_naming_the_trigger_and_since_when(
    operator: OperatorProcess,
    cluster: Cluster,
    cluster_api: Any,
    kube: client.CustomObjectsApi,
    raw: Kube,
    namespace: str,
) -> None:
    """A minReplicas-0 service whose Prometheus is gone (docs/autoscaling.md#when-the-metrics-vanish). No KEDA
    runs in this tier: the test writes the ScaledObject's status as KEDA v2.21 does at each failed read
    (pkg/fallback/fallback.go: status.health keyed by the HPA's metric name, the condition Fallback once a
    trigger failed more than failureThreshold times; no time on it). The operator's watch sees the write: the
    condition ScalingMetricsUnavailable turns True naming the trigger and the Prometheus it queries, stamped
    with the pass that saw it, with one Warning Event; the trigger read again ends it with a Normal one."""
    install_crd(cluster)  # minReplicas 0 needs spec.routing (the picker's queue wakes the service)
    autoscaling = {"minReplicas": 0, "maxReplicas": 3, "targetInFlight": 4}
    monitoring = {"serviceMonitor": {"enabled": True}}
    create(
        kube,
        "blind",
        namespace,
        replicas=None,
        autoscaling=autoscaling,
        monitoring=monitoring,
        routing=ROUTING,
    )
    scaled = wait_until(
        lambda: raw.get("keda.sh/v1alpha1", "scaledobjects", namespace, "blind"), "a ScaledObject"
    )
    assert scaled["spec"]["fallback"]["replicas"] == 1  # never 0: docs/autoscaling.md says why
    read = wait_until(
        lambda: (
            (c := condition(get(kube, "blind", namespace), METRICS_UNAVAILABLE)).get("status") == "False"
            and c
        ),
        "ScalingMetricsUnavailable False before any failure",
    )
    assert read["reason"] == "MetricsRead"

    before = datetime.now(UTC).replace(microsecond=0)
    failing = {"numberOfFailures": FALLBACK_FAILURES + 1, "status": "Failing"}
    keda_status(raw, namespace, "blind", {"s0-prometheus": failing}, fallback=True)
    held = wait_until(
        lambda: (
            (c := condition(get(kube, "blind", namespace), METRICS_UNAVAILABLE)).get("status") == "True" and c
        ),
        "ScalingMetricsUnavailable True",
    )
    assert held["reason"] == "KedaFallback", held
    address = scaled["spec"]["triggers"][0]["metadata"]["serverAddress"]
    assert f"trigger in-flight to Prometheus at {address}" in held["message"], held["message"]
    since = datetime.fromisoformat(held["lastTransitionTime"].replace("Z", "+00:00"))
    assert before <= since <= datetime.now(UTC), (before, since)
    # More failures (KEDA counts on at each read): no new transition, no new Event.
    keda_status(
        raw, namespace, "blind", {"s0-prometheus": {**failing, "numberOfFailures": 40}}, fallback=True
    )
    time.sleep(2)
    assert condition(get(kube, "blind", namespace), METRICS_UNAVAILABLE) == held

    keda_status(raw, namespace, "blind", {"s0-prometheus": {"numberOfFailures": 0, "status": "Happy"}})
    wait_until(
        lambda: condition(get(kube, "blind", namespace), METRICS_UNAVAILABLE).get("status") == "False",
        "ScalingMetricsUnavailable False once KEDA reads again",
    )
    events = sorted(
        (e.reason, e.type, e.message)
        for e in client.CoreV1Api(cluster_api).list_namespaced_event(namespace).items
        if e.involved_object.name == "blind" and e.reason in (METRICS_UNAVAILABLE, "MetricsRead")
    )
    # One each (the list is not in time order; the flips above were): a Warning naming the trigger, and the
    # Normal one naming since when it held.
    assert [(reason, type_) for reason, type_, _ in events] == [
        ("MetricsRead", "Normal"),
        (METRICS_UNAVAILABLE, "Warning"),
    ], events
    assert held["lastTransitionTime"] in events[0][2] and "trigger in-flight" in events[1][2], events


def keda_status(raw: Kube, namespace: str, name: str, health: dict[str, Any], fallback: bool = False) -> None:
    """The ScaledObject's status as KEDA patches it (its Fallback condition has no lastTransitionTime)."""
    reason = "FallbackExists" if fallback else "NoFallbackFound"
    conditions = [
        {"type": "Ready", "status": "True", "reason": "ScaledObjectReady"},
        {"type": "Fallback", "status": "True" if fallback else "False", "reason": reason},
    ]
    raw.patch_status(
        "keda.sh/v1alpha1",
        "ScaledObject",
        "scaledobjects",
        namespace,
        name,
        {"health": health, "conditions": conditions},
    )
