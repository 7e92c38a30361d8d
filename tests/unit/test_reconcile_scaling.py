"""The autoscaler's view in the status and Events, from a KEDA-made HPA as the API server returns it."""

from __future__ import annotations

from typing import Any

from pagoda.operator.status.scaling import autoscaling_status, scale_event, trigger_values

SCALED_OBJECT = {
    "spec": {
        "triggers": [
            {"type": "prometheus", "name": "in-flight", "metricType": "AverageValue"},
            {"type": "prometheus", "name": "kv-cache-usage", "metricType": "Value"},
        ]
    }
}


def hpa(
    current: int, desired: int, in_flight: str | None, kv: str | None, last: str | None
) -> dict[str, Any]:
    """An HPA as KEDA writes it (metric names s<i>-prometheus) with the status the HPA controller sets."""
    current_metrics = []
    if in_flight is not None:
        current_metrics.append(
            {
                "type": "External",
                "external": {
                    "metric": {"name": "s0-prometheus", "selector": {"matchLabels": {"x": "y"}}},
                    "current": {"averageValue": in_flight},
                },
            }
        )
    if kv is not None:
        current_metrics.append(
            {"type": "External", "external": {"metric": {"name": "s1-prometheus"}, "current": {"value": kv}}}
        )
    status: dict[str, Any] = {
        "currentReplicas": current,
        "desiredReplicas": desired,
        "currentMetrics": current_metrics,
    }
    if last:
        status["lastScaleTime"] = last
    return {
        "metadata": {"name": "keda-hpa-chat"},
        "spec": {
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {"name": "s0-prometheus"},
                        "target": {"type": "AverageValue", "averageValue": "5"},
                    },
                },
                {
                    "type": "External",
                    "external": {
                        "metric": {"name": "s1-prometheus"},
                        "target": {"type": "Value", "value": "800m"},
                    },
                },
            ]
        },
        "status": status,
    }


def test_trigger_values_are_named_after_the_scaledobject_triggers() -> None:
    values = trigger_values(hpa(1, 3, "14", "350m", None), SCALED_OBJECT)
    assert [v.describe() for v in values] == [
        "in-flight 14 per replica over target 5",
        "kv-cache-usage 0.35 under target 0.8",
    ]


def test_an_unknown_metric_index_keeps_keda_name_and_missing_values_say_unknown() -> None:
    values = trigger_values(hpa(1, 1, None, None, None), {"spec": {"triggers": []}})
    assert [v.describe() for v in values] == [
        "s0-prometheus unknown per replica, target 5",
        "s1-prometheus unknown, target 0.8",
    ]


def test_status_reports_replicas_triggers_and_the_scale_up_with_its_cause() -> None:
    before = autoscaling_status(hpa(1, 1, "0", "0", None), SCALED_OBJECT, None)
    assert before == {
        "currentReplicas": 1,
        "desiredReplicas": 1,
        "triggers": [
            {"name": "in-flight", "value": "0", "target": "5", "perReplica": True},
            {"name": "kv-cache-usage", "value": "0", "target": "0.8", "perReplica": False},
        ],
    }
    after = autoscaling_status(hpa(1, 3, "14500m", "350m", "2026-12-01T10:00:00Z"), SCALED_OBJECT, before)
    assert after["lastScale"] == {
        "time": "2026-12-01T10:00:00Z",
        "from": 1,
        "to": 3,
        "direction": "Up",
        "message": "1 -> 3: in-flight 14.5 per replica over target 5",
    }
    assert scale_event(before, after) == "1 -> 3: in-flight 14.5 per replica over target 5"
    # The next pass sees the same scale: no second Event, the record is kept as it was.
    later = autoscaling_status(hpa(3, 3, "4", "300m", "2026-12-01T10:00:00Z"), SCALED_OBJECT, after)
    assert later["lastScale"] == after["lastScale"]
    assert scale_event(after, later) is None


def test_a_scale_down_lists_every_trigger_under_its_target() -> None:
    before = {"desiredReplicas": 3, "lastScale": {"time": "2026-12-01T10:00:00Z"}}
    after = autoscaling_status(hpa(3, 1, "0", "0", "2026-12-01T10:05:00Z"), SCALED_OBJECT, before)
    assert after["lastScale"]["direction"] == "Down"
    assert scale_event(before, after) == (
        "3 -> 1: in-flight 0 per replica under target 5, kv-cache-usage 0 under target 0.8"
    )


def test_without_a_previous_record_the_scale_starts_from_the_hpa_current_replicas() -> None:
    status = autoscaling_status(hpa(2, 3, "9", None, "2026-12-01T10:00:00Z"), SCALED_OBJECT, None)
    assert status["lastScale"]["from"] == 2
    assert status["lastScale"]["message"] == "2 -> 3: in-flight 9 per replica over target 5"
    assert "value" not in status["triggers"][1]
