"""Pure functions: the condition ScalingMetricsUnavailable, whether the autoscaler still reads this service's
load, and the Events of its flips (docs/autoscaling.md#when-the-metrics-vanish).

KEDA counts each failed read of a trigger (its scale loop's polls and the HPA's reads through its adapter)
in the ScaledObject's `status.health`, keyed by the HPA's metric name (`s<i>-<scaler>`, i the trigger's
index): `{numberOfFailures, status: Happy | Failing}`. A load trigger's query that answers nothing counts as
a failure like a refused connection (`ignoreNullValues: "false"`), so a Prometheus that is down or too slow,
one that cannot scrape the pods (an enforcing network plugin and a NetworkPolicy that does not admit its
namespace) and series gone stale all look the same here. Past `spec.fallback.failureThreshold` failures in
a row (more than, as KEDA's fallbackExceededThreshold counts), KEDA's fallback serves the HPA a stand-in
that holds the replicas and sets the ScaledObject's condition Fallback: the service then scales neither up
under load nor down, and nothing else in its status says so. KEDA's conditions carry no time: "since when"
is this condition's own lastTransitionTime, the pass that first saw the fallback (KEDA patches
status.health at every failed read, and that event queues a pass).

The HPA can also go blind on its own: its ScalingActive condition False (FailedGetExternalMetric) while
KEDA's polls succeed means KEDA's metrics adapter (or its APIService) does not answer; no fallback applies
there and the HPA keeps the replicas it has. That is reported once it has lasted longer than the polls KEDA
fails before its fallback (a short failure during a Prometheus blip is the fallback's business).

No I/O.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pagoda.operator.api.status import METRICS_UNAVAILABLE
from pagoda.operator.resources.scaledobject import FALLBACK_FAILURES
from pagoda.operator.status.scaling import _trigger_name, trigger_values
from pagoda.operator.status.slo import status_condition
from pagoda.operator.status.times import parse_time

Obj = dict[str, Any]
FALLBACK_REASON = "KedaFallback"
ADAPTER_REASON = "ExternalMetricsUnavailable"
READ_REASON = "MetricsRead"
KEDA_POLLING_INTERVAL = 30  # seconds, KEDA's default pollingInterval


def failing_triggers(scaled_object: Obj) -> list[str]:
    """The triggers KEDA's fallback stands in for: failing more than spec.fallback.failureThreshold reads in
    a row (status.health), by name, in the ScaledObject's order."""
    threshold = failure_threshold(scaled_object)
    triggers = (scaled_object.get("spec") or {}).get("triggers") or []
    health = (scaled_object.get("status") or {}).get("health") or {}
    failing = [
        metric
        for metric, entry in sorted(health.items(), key=lambda item: _index(item[0]))
        if isinstance(entry, dict)
        and entry.get("status") == "Failing"
        and int(entry.get("numberOfFailures") or 0) > threshold
    ]
    return [_trigger_name(metric, triggers) for metric in failing]


def failure_threshold(scaled_object: Obj) -> int:
    """spec.fallback.failureThreshold of the ScaledObject (the operator writes FALLBACK_FAILURES)."""
    fallback = (scaled_object.get("spec") or {}).get("fallback") or {}
    return int(fallback.get("failureThreshold", FALLBACK_FAILURES))


def _index(metric: str) -> tuple[int, str]:
    """`s2-prometheus` -> (2, ...): KEDA's metric names sort by their trigger's index."""
    head = metric.split("-", 1)[0]
    return (int(head[1:]) if head[:1] == "s" and head[1:].isdigit() else 1 << 16, metric)


def fallback_active(scaled_object: Obj | None) -> bool:
    """KEDA's fallback holds the replicas: its condition Fallback is True, or a trigger is past the
    threshold (the health KEDA patches in the same write)."""
    if scaled_object is None:
        return False
    return (status_condition((scaled_object or {}).get("status") or {}, "Fallback") or {}).get(
        "status"
    ) == "True" or bool(failing_triggers(scaled_object))


def _addresses(scaled_object: Obj, names: list[str]) -> str:
    """The Prometheus servers the named triggers query, e.g. "Prometheus at http://prom:9090"."""
    servers = sorted(
        {
            str((t.get("metadata") or {}).get("serverAddress"))
            for t in (scaled_object.get("spec") or {}).get("triggers") or []
            if t.get("type") == "prometheus" and t.get("name") in names
        }
    )
    return f"Prometheus at {', '.join(servers)}" if servers else "its metrics source"


def fallback_message(scaled_object: Obj, hpa: Obj | None) -> str:
    names = failing_triggers(scaled_object)
    threshold = failure_threshold(scaled_object)
    replicas = ((hpa or {}).get("status") or {}).get("currentReplicas")
    held = f" at {int(replicas)}" if replicas is not None else ""
    which = f"trigger{'s' if len(names) > 1 else ''} {', '.join(names)}" if names else "its triggers"
    return (
        f"KEDA's fallback holds the replicas{held}: its queries for {which} to "
        f"{_addresses(scaled_object, names)} failed more than {threshold} reads in a row (the ScaledObject's "
        "status.health). Prometheus is down or answers slower than KEDA waits (3 s), or it has no series of "
        "the pods: it cannot scrape them (with an enforcing network plugin its namespace must be in the "
        "chart's networkPolicy.allowFromNamespaces) or their series went stale. Until a query answers, load "
        "adds no replica and removes none"
    )


def adapter_blind(hpa: Obj | None, scaled_object: Obj, now: datetime | None) -> str | None:
    """The message when the HPA has read no value from KEDA's metrics adapter for longer than KEDA's fallback
    would take to start (FALLBACK_FAILURES + 2 polls), while KEDA's own polls succeed; None otherwise."""
    found = [
        c
        for c in ((hpa or {}).get("status") or {}).get("conditions") or []
        if c.get("type") == "ScalingActive" and c.get("status") == "False"
    ]
    if not found or found[0].get("reason") != "FailedGetExternalMetric" or hpa is None or now is None:
        return None
    health = ((scaled_object.get("status") or {}).get("health") or {}).values()
    if any(isinstance(h, dict) and h.get("status") == "Failing" for h in health):
        return None  # KEDA's own queries fail: its fallback is on its way
    since = parse_time(found[0].get("lastTransitionTime"))
    polling = int((scaled_object.get("spec") or {}).get("pollingInterval") or KEDA_POLLING_INTERVAL)
    if since is None or (now - since).total_seconds() < (FALLBACK_FAILURES + 2) * polling:
        return None
    missing = [v.name for v in trigger_values(hpa, scaled_object) if v.current is None]
    which = f"trigger{'s' if len(missing) > 1 else ''} {', '.join(missing)}" if missing else "its triggers"
    return (
        f"The HPA has read no value of {which} since {found[0].get('lastTransitionTime')}: KEDA's metrics "
        f"adapter does not answer it ({str(found[0].get('message') or '')[:300]}). KEDA's own queries "
        "succeed, so its fallback does not apply: the replicas stay as they are until the adapter answers "
        "(its pods, and `kubectl get apiservice v1beta1.external.metrics.k8s.io`)"
    )


def metrics_condition(
    scaled_object: Obj | None, hpa: Obj | None, now: datetime | None
) -> tuple[bool, str, str] | None:
    """ScalingMetricsUnavailable as (status, reason, message); None without a ScaledObject (no
    spec.autoscaling, or before it is created)."""
    if scaled_object is None:
        return None
    if fallback_active(scaled_object):
        return True, FALLBACK_REASON, fallback_message(scaled_object, hpa)
    blind = adapter_blind(hpa, scaled_object, now)
    if blind is not None:
        return True, ADAPTER_REASON, blind
    return (
        False,
        READ_REASON,
        "KEDA's fallback is off (no trigger failed more than its threshold) and the HPA reads its metrics",
    )


def metrics_event(previous: Obj, status: Obj) -> tuple[str, str, str] | None:
    """(type, reason, message) of the Event for a flip of ScalingMetricsUnavailable between the status
    written before and the new one: Warning when it becomes True (also when it first appears so), Normal
    MetricsRead when a True one becomes False (naming since when it held); None otherwise."""
    was, now = status_condition(previous, METRICS_UNAVAILABLE), status_condition(status, METRICS_UNAVAILABLE)
    if now is None or (was or {}).get("status") == now.get("status"):
        return None
    if now.get("status") == "True":
        return "Warning", METRICS_UNAVAILABLE, f"{now.get('reason')}: {now.get('message')}"
    if (was or {}).get("status") == "True":
        return (
            "Normal",
            READ_REASON,
            f"The autoscaler reads the load again (its metrics were unavailable since "
            f"{was.get('lastTransitionTime') if was else '?'}, {(was or {}).get('reason')})",
        )
    return None
