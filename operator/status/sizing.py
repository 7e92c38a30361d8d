"""Pure function: `status.sizing`, capacity planning at spec.slo (docs/capacity.md).

From what one replica serves within the SLO (status.profile: its concurrency and output tokens per second),
the requests in flight as the autoscaler last read them (status.autoscaling's in-flight trigger, a value per
replica: KEDA's AverageValue) and spec.cost, it gives what `kubectl get` shows beside the dashboard's
capacity row: the load as a percent of what the Ready replicas serve within the SLO, the replicas that load
needs at the per-replica target metric SLO's HPA holds (slo.py target_at_slo: one function for both), and
what 1M generated tokens cost at the measured operating point. The dashboard computes the same from
Prometheus; this is the autoscaler's reading, refreshed at each HPA sync (15 s by default), so it adds no
call and no status write of its own.

While KEDA's fallback holds the replicas (the ScaledObject's condition Fallback: its metrics queries fail;
the condition ScalingMetricsUnavailable names the triggers), the HPA reads KEDA's stand-in value (the target
times the replicas held), not the load: the load figures are left out and `message` says why.

It reads the spec as stored (camelCase), like the conditions. No I/O.
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from typing import Any

from pagoda.operator.resources.scaledobject import IN_FLIGHT_TRIGGER
from pagoda.operator.status.profile import measured_concurrency
from pagoda.operator.status.scalingmetrics import fallback_active
from pagoda.operator.status.slo import target_at_slo

Obj = dict[str, Any]


def sizing_status(
    spec: Obj,
    profile: Obj | None,
    autoscaling: Obj | None,
    ready_replicas: int,
    scaled_object: Obj | None = None,
) -> Obj | None:
    """status.sizing for a service with spec.slo whose profile measured something; None otherwise. Each field
    is there only when what it is computed from is known (api/status.py SizingStatus). `scaled_object`: the
    live ScaledObject, whose Fallback condition makes the autoscaler's reading no load."""
    if not spec.get("slo") or not profile:
        return None
    out: Obj = {}
    in_flight = in_flight_total(autoscaling)
    fallback = keda_fallback(scaled_object)
    if in_flight is not None and fallback is not None:
        out["message"], in_flight = fallback, None
    if in_flight is not None:
        out["inFlight"] = float(round(in_flight, 2))
    concurrency = measured_concurrency(profile)
    if concurrency is not None:
        out["capacity"] = concurrency * ready_replicas
        if in_flight is not None and ready_replicas > 0:
            out["loadPercent"] = round(100 * in_flight / (concurrency * ready_replicas))
    target = target_at_slo(spec, profile)
    if target is not None:
        out["targetPerReplica"] = target
        if in_flight is not None:
            out["replicasNeeded"] = math.ceil(in_flight / target)
    cost = cost_per_million_tokens(spec, profile.get("outputTokensPerSecond"))
    if cost is not None:
        out["costPerMillionTokens"] = cost
        out["currency"] = str((spec.get("cost") or {}).get("currency") or "USD")
    return out or None


def in_flight_total(autoscaling: Obj | None) -> Decimal | None:
    """Requests in flight over all replicas from the in-flight trigger of status.autoscaling: its value per
    replica times the replicas the HPA counted (0 replicas: 0 in flight, as KEDA reads no pod); None without
    that trigger or its value."""
    for trigger in (autoscaling or {}).get("triggers") or []:
        if trigger.get("name") != IN_FLIGHT_TRIGGER or trigger.get("value") is None:
            continue
        try:
            value = Decimal(str(trigger["value"]))
        except InvalidOperation:
            return None
        if trigger.get("perReplica"):
            value *= int((autoscaling or {}).get("currentReplicas") or 0)
        return max(value, Decimal(0))
    return None


def keda_fallback(scaled_object: Obj | None) -> str | None:
    """Why the autoscaler's reading is no load while KEDA's fallback holds the replicas (its condition
    Fallback, or a trigger past the threshold: scalingmetrics.py); None otherwise. KEDA's conditions carry no
    time: since when is the condition ScalingMetricsUnavailable's lastTransitionTime."""
    if not fallback_active(scaled_object):
        return None
    return (
        "No load figures: KEDA's fallback holds the replicas (its metrics queries fail: the condition "
        "ScalingMetricsUnavailable names the triggers), and the autoscaler's in-flight reading is KEDA's "
        "stand-in, not load"
    )


def cost_per_million_tokens(spec: Obj, tokens_per_second: Any) -> float | None:
    """spec.cost.gpuHourPrice x resources.gpu.count per 1M tokens generated at `tokens_per_second` (the
    dashboard's "Cost per 1M tokens at the SLO"), to 4 decimals; None without a price or a throughput."""
    price = (spec.get("cost") or {}).get("gpuHourPrice")
    gpus = ((spec.get("resources") or {}).get("gpu") or {}).get("count")
    hourly, count, tokens = (_positive(n) for n in (price, gpus, tokens_per_second))
    if hourly is None or count is None or tokens is None:
        return None
    return round(hourly * count / 3600 * 1e6 / tokens, 4)


def _positive(value: Any) -> float | None:
    """`value` when it is a number above 0 as JSON stores it (not a bool, not a string); None otherwise."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None
