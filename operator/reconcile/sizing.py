"""Pure function: `status.sizing`, capacity planning at spec.slo (docs/capacity.md).

From what one replica serves within the SLO (status.profile: its concurrency and output tokens per second),
the requests in flight as the autoscaler last read them (status.autoscaling's in-flight trigger, a value per
replica: KEDA's AverageValue) and spec.cost, it gives what `kubectl get` shows beside the dashboard's
capacity row: the load as a percent of what the Ready replicas serve within the SLO, the replicas that load
needs, and what 1M generated tokens cost at the measured operating point. The dashboard computes the same
from Prometheus; this is the autoscaler's reading, refreshed at each HPA sync (15 s by default), so it adds
no call and no status write of its own.

It reads the spec as stored (camelCase), like the conditions. No I/O.
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from typing import Any

from pagoda.operator.resources.scaledobject import IN_FLIGHT_TRIGGER

Obj = dict[str, Any]


def sizing_status(spec: Obj, profile: Obj | None, autoscaling: Obj | None, ready_replicas: int) -> Obj | None:
    """status.sizing for a service with spec.slo whose profile measured something; None otherwise. Each field
    is there only when what it is computed from is known (api/status.py SizingStatus)."""
    if not spec.get("slo") or not profile:
        return None
    out: Obj = {}
    in_flight = in_flight_total(autoscaling)
    if in_flight is not None:
        out["inFlight"] = float(round(in_flight, 2))
    concurrency = profile.get("concurrency")
    if isinstance(concurrency, int) and concurrency > 0:
        out["capacity"] = concurrency * ready_replicas
        if in_flight is not None:
            out["replicasNeeded"] = math.ceil(in_flight / concurrency)
            if ready_replicas > 0:
                out["loadPercent"] = round(100 * in_flight / (concurrency * ready_replicas))
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
