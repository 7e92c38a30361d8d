"""The KEDA ScaledObject: scale the Deployment on this service's in-flight requests or queue depth (and
KV-cache usage).

When the metrics vanish (Prometheus down, or the pods' scrape failing, so that a query answers nothing)
the service keeps its replicas: the replicas' own triggers count an empty answer as a failure
(`ignoreNullValues: "false"`; KEDA's default reads it as 0, and scales to the minimum under full load), and
after FALLBACK_FAILURES failed polls in a row KEDA's fallback holds the current replica count (at least the
minimum) until the queries answer again. A service with no pod at all (at zero, routed) has no series
either, and that is no load, not an outage: the replicas' queries answer 0 while Prometheus has no scrape
target of the service (`_zero_without_targets`); otherwise KEDA's fallback would start a replica of an idle
service at zero about once a minute.

Pre-warming (spec.autoscaling.schedule): each daily window becomes a KEDA cron trigger that asks for the
window's minReplicas from `warm-up` minutes before it opens until it closes; the HPA takes the largest of
the triggers, so the load can still scale above the floor. The warm-up is the service's own typical cold
start (status.startup), unless the spec sets one.
"""

from __future__ import annotations

import math
from typing import Any

from pagoda.contract import KV_CACHE_USAGE_METRIC, QUEUE_DEPTH_METRIC, RUNNING_REQUESTS_METRIC
from pagoda.operator.api import AutoscalingSpec, WarmWindow
from pagoda.operator.api.scaling import DEFAULT_WARM_UP_SECONDS, IN_FLIGHT_METRICS, WEEKDAYS

from .meta import metadata
from .routing import QUEUE_METRIC

# Failed polls of a trigger (one per pollingInterval) before KEDA falls back to holding the replicas: a
# scrape or two that misses is not an outage.
FALLBACK_FAILURES = 3
_DAY_MINUTES = 24 * 60


def warm_up_minutes(autoscaling: AutoscalingSpec, typical_start: float | None) -> int:
    """Whole minutes the window's replicas start early: spec.autoscaling.warmUpSeconds, else the measured
    typical cold start, else DEFAULT_WARM_UP_SECONDS; rounded up (cron has whole minutes)."""
    if autoscaling.warm_up_seconds is not None:
        return math.ceil(autoscaling.warm_up_seconds / 60)
    return math.ceil((typical_start or DEFAULT_WARM_UP_SECONDS) / 60)


def _cron(minute_of_day: int, days: list[int]) -> str:
    """`M H * * D,D`: at minute_of_day on days (0 = Monday, as WEEKDAYS), in cron's numbering (0 = Sunday)."""
    cron_days = sorted({(day + 1) % 7 for day in days})
    hour, minute = divmod(minute_of_day, 60)
    return f"{minute} {hour} * * {','.join(str(d) for d in cron_days)}"


def warm_trigger(index: int, window: WarmWindow, lead_minutes: int) -> dict[str, Any]:
    """KEDA's cron trigger for one window, opened `lead_minutes` early (the day before, when that crosses
    midnight); a window whose end is not after its start closes the next day."""
    start, end = window.start_minute, window.end_minute
    days = [WEEKDAYS.index(day) for day in window.days]
    shift, opens = divmod(start - lead_minutes, _DAY_MINUTES)  # shift: 0, or -1 for the day before
    closes_next_day = 1 if end <= start else 0
    return {
        "type": "cron",
        "name": f"warm-{index}",
        "metadata": {
            "timezone": window.time_zone,
            "start": _cron(opens, [(day + shift) % 7 for day in days]),
            "end": _cron(end, [(day + closes_next_day) % 7 for day in days]),
            "desiredReplicas": str(window.min_replicas),
        },
    }


def _series(metric: str, name: str, namespace: str) -> str:
    """The runtime's `metric` over this service's pods (the labels a ServiceMonitor's targets carry)."""
    return f'{metric}{{namespace="{namespace}",service="{name}"}}'


def _zero_without_targets(query: str, name: str, namespace: str) -> str:
    """`query`, or 0 while Prometheus has no scrape target of the service's pods (no `up` series with its
    labels: no pod runs, or none is discovered yet). A pod whose scrapes fail still has its target, `up` 0,
    so its missing series stay an empty answer: KEDA's failure, then its fallback."""
    return f"({query}) or on() (0 * absent({_series('up', name, namespace)}))"


def in_flight_query(name: str, namespace: str) -> str:
    """Requests running plus waiting, summed over the pods (0 without pods)."""
    running = _series(RUNNING_REQUESTS_METRIC, name, namespace)
    waiting = _series(QUEUE_DEPTH_METRIC, name, namespace)
    return _zero_without_targets(f"sum({running}) + sum({waiting})", name, namespace)


def queue_depth_query(name: str, namespace: str) -> str:
    """Requests waiting for a place in the batch, summed over the pods (0 without pods)."""
    return _zero_without_targets(f"sum({_series(QUEUE_DEPTH_METRIC, name, namespace)})", name, namespace)


def kv_cache_query(name: str, namespace: str) -> str:
    """The fullest pod's KV-cache usage (0 without pods)."""
    return _zero_without_targets(f"max({_series(KV_CACHE_USAGE_METRIC, name, namespace)})", name, namespace)


def picker_queue_query(name: str, namespace: str) -> str:
    """Requests the endpoint picker's flow control holds for this service's pool: exists while no replica
    runs, so it is what scales from zero."""
    return f'sum({QUEUE_METRIC}{{namespace="{namespace}",inference_pool="{name}"}})'


# The load trigger's name with metric InFlight or SLO: status.autoscaling and status.sizing read it.
IN_FLIGHT_TRIGGER = "in-flight"


def _load_trigger(name: str, namespace: str, autoscaling: AutoscalingSpec, target: int) -> dict[str, Any]:
    in_flight = autoscaling.scaling_metric in IN_FLIGHT_METRICS
    return {
        "type": "prometheus",
        "name": IN_FLIGHT_TRIGGER if in_flight else "queue-depth",
        # AverageValue: KEDA divides the total by the replica count: the threshold is per replica.
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": autoscaling.prometheus_address,
            "query": (in_flight_query if in_flight else queue_depth_query)(name, namespace),
            "threshold": str(target),
            "ignoreNullValues": "false",
        },
    }


def scaled_object(
    name: str,
    namespace: str,
    autoscaling: AutoscalingSpec,
    routed: bool = False,
    typical_start: float | None = None,
    slo_concurrency: int | None = None,
    budget_limit: int | None = None,
) -> dict[str, Any]:
    """With `routed` (spec.routing), a second trigger on the picker's queue: requests held there count
    toward the same per-replica target, and one held request starts the first replica (minReplicas 0).
    `typical_start`: the service's typical cold start in seconds (status.startup), the schedule's warm-up;
    `slo_concurrency`: the concurrency its capacity profile measured within spec.slo (status.profile;
    while the newest profile met it at no step, the last one measured, or 1: never targetInFlight's
    default once a profile has measured), metric SLO's base; `budget_limit`: the replicas its GPUBudget lets
    it hold now (reconcile/gpubudget.py), its maxReplicaCount when below maxReplicas."""
    target = autoscaling.target_per_replica(slo_concurrency)
    triggers: list[dict[str, Any]] = [_load_trigger(name, namespace, autoscaling, target)]
    if routed:
        triggers.append(
            {
                "type": "prometheus",
                "name": "picker-queue",
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": autoscaling.prometheus_address,
                    "query": picker_queue_query(name, namespace),
                    "threshold": str(target),
                    # Active (0 -> 1) as soon as one request waits; KEDA's default activation is "> 0".
                    "activationThreshold": "0",
                    # The picker exports its queue only while requests wait: no series is an empty queue,
                    # not a failure (as one, KEDA would never scale the service to zero).
                },
            }
        )
    if autoscaling.kv_cache_usage is not None:
        triggers.append(
            {
                "type": "prometheus",
                "name": "kv-cache-usage",
                "metricType": "Value",
                "metadata": {
                    "serverAddress": autoscaling.prometheus_address,
                    "query": kv_cache_query(name, namespace),
                    "threshold": repr(float(autoscaling.kv_cache_usage.target_ratio)),
                    "ignoreNullValues": "false",
                },
            }
        )
    lead = warm_up_minutes(autoscaling, typical_start)
    triggers += [warm_trigger(i, window, lead) for i, window in enumerate(autoscaling.schedule)]
    body = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
        "minReplicaCount": autoscaling.min_replicas,
        "maxReplicaCount": min(autoscaling.max_replicas, budget_limit or autoscaling.max_replicas),
        "pollingInterval": autoscaling.polling_interval,
        "cooldownPeriod": autoscaling.cooldown_period,
        # KEDA's cooldownPeriod only governs scaling to zero; replicas >= 1 are scaled down by the HPA,
        # so the same period becomes its scale-down stabilization window.
        "advanced": {
            "horizontalPodAutoscalerConfig": {
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": autoscaling.cooldown_period}}
            }
        },
        # Metrics gone: hold the current replicas (KEDA's currentReplicasIfHigher: the current count, or
        # the minimum if that is higher), never the scale-in an empty answer would cause. At least 1: with
        # fallback replicas 0 KEDA would scale a minReplicas-0 service to zero while its triggers fail.
        "fallback": {
            "failureThreshold": FALLBACK_FAILURES,
            "replicas": max(autoscaling.min_replicas, 1),
            "behavior": "currentReplicasIfHigher",
        },
        "triggers": triggers,
    }
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": metadata(name, namespace),
        "spec": body,
    }
