"""Pure functions: the autoscaler's view, in the InferenceService's status and Events.

KEDA turns the ScaledObject into a HorizontalPodAutoscaler named `keda-hpa-<name>` and copies the
ScaledObject's labels onto it, so the operator's label-filtered watch sees it like a pod: at no read cost.
KEDA names the HPA's external metrics `s<i>-<scaler>`, `i` being the index of the trigger in the
ScaledObject; the trigger's own `name` (in-flight, queue-depth, kv-cache-usage) is what people read.

`autoscaling_status` gives `status.autoscaling`: current and desired replicas, each trigger's value against
its target, and the last scale (when, from, to, why). `scale_event` says whether this pass sees a scale the
previous status did not record, as the Event message "1 -> 3: in-flight 14 per replica over target 5".
No I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

Obj = dict[str, Any]
HPA_KIND = ("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers")
_KEDA_METRIC = re.compile(r"^s(\d+)-")


def hpa_name(name: str) -> str:
    """The HPA KEDA makes for the ScaledObject of InferenceService `name`."""
    return f"keda-hpa-{name}"


@dataclass(frozen=True)
class TriggerValue:
    name: str
    current: Decimal | None
    target: Decimal
    per_replica: bool  # AverageValue: KEDA divides the query's total by the replica count

    def describe(self) -> str:
        """ "in-flight 14 per replica over target 5"."""
        per = " per replica" if self.per_replica else ""
        if self.current is None:
            return f"{self.name} unknown{per}, target {number(self.target)}"
        side = "over" if self.current > self.target else "under" if self.current < self.target else "at"
        return f"{self.name} {number(self.current)}{per} {side} target {number(self.target)}"

    def ratio(self) -> Decimal:
        if self.current is None or self.target <= 0:
            return Decimal(0)
        return self.current / self.target


def number(value: Decimal) -> str:
    """At most two decimals, no trailing zeros: 14, 0.5, 2.33."""
    text = f"{value.quantize(Decimal('0.01')):f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _quantity(text: Any) -> Decimal | None:
    if text is None:
        return None
    try:
        parsed: Decimal = parse_quantity(text)  # type: ignore[no-untyped-call]
    except ValueError:
        return None
    return parsed


def trigger_values(hpa: Obj, scaled_object: Obj | None) -> list[TriggerValue]:
    """Each external metric of the HPA with its target and current value, named after its trigger."""
    triggers = ((scaled_object or {}).get("spec") or {}).get("triggers") or []
    current: dict[str, Obj] = {}
    for item in (hpa.get("status") or {}).get("currentMetrics") or []:
        external = item.get("external") or {}
        metric = (external.get("metric") or {}).get("name")
        if metric:
            current[str(metric)] = external.get("current") or {}
    values = []
    for item in (hpa.get("spec") or {}).get("metrics") or []:
        external = item.get("external") or {}
        metric = str((external.get("metric") or {}).get("name") or "")
        target = external.get("target") or {}
        per_replica = target.get("type") == "AverageValue"
        key = "averageValue" if per_replica else "value"
        target_value = _quantity(target.get(key))
        if not metric or target_value is None:
            continue
        values.append(
            TriggerValue(
                name=_trigger_name(metric, triggers),
                current=_quantity(current.get(metric, {}).get(key)),
                target=target_value,
                per_replica=per_replica,
            )
        )
    return values


def _trigger_name(metric: str, triggers: list[Obj]) -> str:
    match = _KEDA_METRIC.match(metric)
    if match and int(match.group(1)) < len(triggers):
        name = triggers[int(match.group(1))].get("name")
        if name:
            return str(name)
    return metric


def autoscaling_status(hpa: Obj, scaled_object: Obj | None, previous: Obj | None) -> Obj:
    """`status.autoscaling` from the HPA; `previous` is the status.autoscaling written before (it keeps
    the last scale when the HPA has not scaled since)."""
    st = hpa.get("status") or {}
    values = trigger_values(hpa, scaled_object)
    out: Obj = {
        "currentReplicas": int(st.get("currentReplicas") or 0),
        "desiredReplicas": int(st.get("desiredReplicas") or 0),
        "triggers": [
            {
                "name": v.name,
                **({"value": number(v.current)} if v.current is not None else {}),
                "target": number(v.target),
                "perReplica": v.per_replica,
            }
            for v in values
        ],
    }
    last_time = st.get("lastScaleTime")
    kept = (previous or {}).get("lastScale")
    if last_time and kept and kept.get("time") == last_time:
        out["lastScale"] = kept
    elif last_time:
        before = (previous or {}).get("desiredReplicas")
        from_ = int(before) if before is not None else out["currentReplicas"]
        to = out["desiredReplicas"]
        out["lastScale"] = {
            "time": last_time,
            "from": from_,
            "to": to,
            "direction": "Up" if to > from_ else "Down" if to < from_ else "None",
            "message": scale_message(from_, to, values),
        }
    return out


def scale_message(from_: int, to: int, values: list[TriggerValue]) -> str:
    """ "1 -> 3: in-flight 14 per replica over target 5": on a scale up, the trigger furthest over its
    target; on a scale down, every trigger (all are under)."""
    if not values:
        return f"{from_} -> {to}"
    if to > from_:
        return f"{from_} -> {to}: {max(values, key=lambda v: v.ratio()).describe()}"
    return f"{from_} -> {to}: " + ", ".join(v.describe() for v in values)


def scale_event(previous: Obj | None, current: Obj | None) -> str | None:
    """The message of a scale this pass sees for the first time (a new lastScale), or None."""
    new = (current or {}).get("lastScale")
    if not new or new.get("from") == new.get("to"):
        return None
    old = (previous or {}).get("lastScale") or {}
    if old.get("time") == new.get("time"):
        return None
    return str(new["message"])
