"""The condition ScalingMetricsUnavailable and its Events, from a ScaledObject and an HPA as KEDA v2.21 and
the HPA controller write them (docs/autoscaling.md#when-the-metrics-vanish).

KEDA's status as it is during a Prometheus outage: `status.health` keyed by the HPA's metric name, each
`{numberOfFailures, status}` (pkg/fallback/fallback.go IncrementFailure), the condition Fallback True once a
trigger failed more than failureThreshold times (fallbackExceededThreshold), and no time on any condition
(apis/keda/v1alpha1/condition_types.go: type, status, reason, message)."""

from __future__ import annotations

from typing import Any

import pytest
from fakekube import StatusWrites, owner_object

from pagoda.operator.api import InferenceServiceStatus
from pagoda.operator.api.status import METRICS_UNAVAILABLE
from pagoda.operator.reconcile import core, state
from pagoda.operator.resources import DEFAULT_RUNTIME_IMAGE
from pagoda.operator.resources.scaledobject import FALLBACK_FAILURES
from pagoda.operator.status.report import Observed, compute_status
from pagoda.operator.status.scalingmetrics import (
    ADAPTER_REASON,
    FALLBACK_REASON,
    READ_REASON,
    failing_triggers,
    metrics_condition,
    metrics_event,
)
from pagoda.operator.status.sizing import keda_fallback
from pagoda.operator.status.times import parse_time
from tests.unit.test_reconcile_scaling import hpa
from tests.unit.test_status_contract import URL, deployment

Obj = dict[str, Any]
PROMETHEUS = "http://prometheus.observability.svc:9090"
NOW, LATER, MUCH_LATER = "2026-12-05T10:00:00Z", "2026-12-05T10:05:00Z", "2026-12-05T10:30:00Z"
SPEC: Obj = {
    "model": {"uri": "hf://org/m"},
    "runtime": {"image": DEFAULT_RUNTIME_IMAGE},
    "resources": {"gpu": {"count": 1}},
    "autoscaling": {"minReplicas": 0, "maxReplicas": 4},
}


def scaled_object(health: Obj | None = None, fallback: str = "False") -> Obj:
    """The ScaledObject the operator writes (in-flight, kv-cache-usage) with the status KEDA patches."""
    status: Obj = {
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "ScaledObjectReady"},
            {"type": "Active", "status": "True", "reason": "ScalerActive"},
            {
                "type": "Fallback",
                "status": fallback,
                "reason": "FallbackExists" if fallback == "True" else "",
            },
        ]
    }
    if health is not None:
        status["health"] = health
    return {
        "spec": {
            "pollingInterval": 30,
            "fallback": {
                "failureThreshold": FALLBACK_FAILURES,
                "replicas": 1,
                "behavior": "currentReplicasIfHigher",
            },
            "triggers": [
                {"type": "prometheus", "name": "in-flight", "metadata": {"serverAddress": PROMETHEUS}},
                {"type": "prometheus", "name": "kv-cache-usage", "metadata": {"serverAddress": PROMETHEUS}},
            ],
        },
        "status": status,
    }


def failing(failures: int) -> Obj:
    return {"numberOfFailures": failures, "status": "Failing"}


HAPPY = {"numberOfFailures": 0, "status": "Happy"}


def blind_hpa(since: str) -> Obj:
    """An HPA that read nothing from KEDA's adapter since `since` (the HPA controller's own condition)."""
    out = hpa(2, 2, None, None, None)
    out["status"]["conditions"] = [
        {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale"},
        {
            "type": "ScalingActive",
            "status": "False",
            "reason": "FailedGetExternalMetric",
            "message": "the HPA was unable to compute the replica count: unable to get external metric "
            "ns/s0-prometheus: the server is currently unable to handle the request",
            "lastTransitionTime": since,
        },
    ]
    return out


def test_a_trigger_past_the_threshold_is_keda_fallback_naming_it_and_where_it_queries() -> None:
    """KEDA falls back at failureThreshold + 1 failures in a row (more than, not as many as)."""
    at_threshold = scaled_object({"s0-prometheus": failing(FALLBACK_FAILURES), "s1-prometheus": HAPPY})
    assert failing_triggers(at_threshold) == []
    assert metrics_condition(at_threshold, hpa(3, 3, None, "350m", None), parse_time(NOW)) == (
        False,
        READ_REASON,
        "KEDA's fallback is off (no trigger failed more than its threshold) and the HPA reads its metrics",
    )
    past = scaled_object({"s0-prometheus": failing(FALLBACK_FAILURES + 1), "s1-prometheus": HAPPY}, "True")
    assert failing_triggers(past) == ["in-flight"]
    condition = metrics_condition(past, hpa(3, 3, "5", "350m", None), parse_time(NOW))
    assert condition is not None
    status, reason, message = condition
    assert (status, reason) == (True, FALLBACK_REASON)
    assert "holds the replicas at 3" in message
    assert f"trigger in-flight to Prometheus at {PROMETHEUS}" in message
    assert f"more than {FALLBACK_FAILURES} reads in a row" in message
    assert "networkPolicy.allowFromNamespaces" in message  # the cause the issue met: scrapes refused


def test_every_failing_trigger_is_named_in_the_scaledobjects_order() -> None:
    both = scaled_object({"s1-prometheus": failing(9), "s0-prometheus": failing(4)}, "True")
    assert failing_triggers(both) == ["in-flight", "kv-cache-usage"]
    condition = metrics_condition(both, None, parse_time(NOW))
    assert condition is not None and "triggers in-flight, kv-cache-usage to" in condition[2]
    assert "holds the replicas:" in condition[2]  # no HPA seen (a service KEDA keeps at zero): no count


def test_keda_condition_alone_is_enough_and_a_service_without_a_scaledobject_has_no_condition() -> None:
    condition = metrics_condition(scaled_object(None, "True"), None, parse_time(NOW))
    assert condition is not None and condition[:2] == (True, FALLBACK_REASON)
    assert "its triggers" in condition[2]
    assert metrics_condition(None, None, parse_time(NOW)) is None


def test_an_hpa_blind_to_kedas_adapter_is_reported_after_the_fallbacks_own_delay() -> None:
    """KEDA's polls succeed (no fallback can apply) but the HPA reads nothing: KEDA's adapter is down. Not
    at once: while KEDA's own queries fail, or for the (threshold + 2) polls KEDA takes to fall back."""
    healthy = scaled_object({"s0-prometheus": HAPPY, "s1-prometheus": HAPPY})
    assert metrics_condition(healthy, blind_hpa(NOW), parse_time(LATER)) is not None  # 300 s > 5 x 30 s
    assert not held(healthy, blind_hpa("2026-12-05T10:03:00Z"), LATER)  # 120 s: KEDA may still fall back
    keda_failing = scaled_object({"s0-prometheus": failing(2), "s1-prometheus": HAPPY})
    assert not held(keda_failing, blind_hpa(NOW), MUCH_LATER)  # KEDA's own queries fail: its fallback comes
    condition = metrics_condition(healthy, blind_hpa(NOW), parse_time(LATER))
    assert condition is not None
    status, reason, message = condition
    assert (status, reason) == (True, ADAPTER_REASON)
    assert message.startswith(f"The HPA has read no value of triggers in-flight, kv-cache-usage since {NOW}")
    assert "unable to get external metric" in message
    at_zero = blind_hpa(NOW)
    at_zero["status"]["conditions"][1].update(reason="ScalingDisabled", message="scaling is disabled")
    assert not held(healthy, at_zero, LATER)  # the HPA is off at zero replicas: no failure


def held(scaled: Obj, hpa_: Obj | None, now: str) -> bool:
    condition = metrics_condition(scaled, hpa_, parse_time(now))
    assert condition is not None
    return condition[0]


def status_of(scaled: Obj | None, previous: Obj | None = None, now: str = NOW) -> Obj:
    owner = {**owner_object(SPEC), "status": previous or {}}
    observed = Observed(deployment(3, 3, 3), url=URL, hpa=hpa(3, 3, "5", None, None), scaled_object=scaled)
    return compute_status(owner, observed, selector="a=b", now=now)


def unavailable(status: Obj) -> Obj | None:
    return next((c for c in status["conditions"] if c["type"] == METRICS_UNAVAILABLE), None)


def test_the_condition_is_in_the_status_model_and_says_since_when() -> None:
    """KEDA's conditions have no time: the condition's lastTransitionTime is the pass that first saw the
    fallback, and stays while it holds."""
    read = status_of(scaled_object({"s0-prometheus": HAPPY}))
    InferenceServiceStatus.model_validate(read)
    assert (unavailable(read) or {}).get("status") == "False"
    held = scaled_object({"s0-prometheus": failing(4)}, "True")
    first = status_of(held, read, LATER)
    InferenceServiceStatus.model_validate(first)
    condition = unavailable(first)
    assert condition is not None
    assert (condition["status"], condition["reason"], condition["lastTransitionTime"]) == (
        "True",
        FALLBACK_REASON,
        LATER,
    )
    still = scaled_object({"s0-prometheus": failing(40)}, "True")
    assert unavailable(status_of(still, first, MUCH_LATER)) == condition  # no write while it holds
    assert unavailable(status_of(None)) is None  # no autoscaling: no condition
    # status.sizing's message points at it (KEDA's own condition has no time to say since when)
    message = keda_fallback(held)
    assert message is not None and METRICS_UNAVAILABLE in message


def test_one_event_per_flip() -> None:
    read = status_of(scaled_object({"s0-prometheus": HAPPY}))
    held = status_of(scaled_object({"s0-prometheus": failing(4)}, "True"), read, LATER)
    again = status_of(scaled_object({"s0-prometheus": HAPPY}), held, MUCH_LATER)
    assert metrics_event(read, read) is None
    assert metrics_event({}, read) is None  # it appears False: nothing to say
    warning = metrics_event(read, held)
    assert warning is not None and warning[:2] == ("Warning", METRICS_UNAVAILABLE)
    assert warning[2].startswith(f"{FALLBACK_REASON}: KEDA's fallback holds the replicas at 3")
    assert metrics_event(held, held) is None
    assert metrics_event(held, again) == (
        "Normal",
        READ_REASON,
        f"The autoscaler reads the load again (its metrics were unavailable since {LATER}, KedaFallback)",
    )


@pytest.mark.parametrize("first", [True, False], ids=["appears-true", "flips-true"])
def test_write_status_records_the_warning_event(first: bool) -> None:
    kube = StatusWrites(SPEC)
    read = status_of(scaled_object({"s0-prometheus": HAPPY}))
    held = status_of(scaled_object({"s0-prometheus": failing(4)}, "True"), read, LATER)
    previous = {**read, "conditions": read["conditions"][:4]} if first else read
    owner = {**owner_object(SPEC), "status": previous}
    p = state.Pass(kube, None, owner, "ns", "llm", lambda: LATER, {}, [], [])  # type: ignore[arg-type]
    core.write_status(p, held)
    assert [(e["type"], e["reason"]) for e in kube.events] == [("Warning", METRICS_UNAVAILABLE)]
    assert "in-flight" in kube.events[0]["message"]
