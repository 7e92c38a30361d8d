"""Tier 1: pre-warming (spec.autoscaling.schedule): each daily window a KEDA cron trigger that opens the
service's warm-up early, checked minute by minute over a week against KEDA's rule (a cron trigger is active
while its next end comes before its next start), and the spec's checks."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from pagoda.operator.api import AutoscalingSpec, InferenceServiceSpec, WarmWindow
from pagoda.operator.api.scaling import WEEKDAYS
from pagoda.operator.resources import ChildInputs, desired_children
from pagoda.operator.resources.scaledobject import warm_trigger, warm_up_minutes

WEEK = datetime(2026, 12, 7)  # a Monday
BASE = {"model": {"uri": "hf://org/m"}, "resources": {"gpu": {"count": 1}}}


def next_fire(cron: str, after: datetime) -> datetime:
    """The first minute after `after` at which `M H * * D,D` fires (cron's days: 0 = Sunday)."""
    minute, hour, _, _, days = cron.split()
    allowed = {int(d) for d in days.split(",")}
    base = after.replace(hour=int(hour), minute=int(minute), second=0, microsecond=0)
    for offset in range(8):
        at = base + timedelta(days=offset)
        if at > after and (at.weekday() + 1) % 7 in allowed:
            return at
    raise AssertionError(f"{cron} does not fire within a week")


def active(trigger: dict[str, Any], at: datetime) -> bool:
    """KEDA's cron scaler: active when, looking forward from `at`, the end fires before the start."""
    meta = trigger["metadata"]
    return next_fire(meta["end"], at) < next_fire(meta["start"], at)


def expected(window: WarmWindow, lead: int, at: datetime) -> bool:
    """Inside [start - lead, end) of a window opening on one of its days (end on the next day when it is
    not after the start)."""
    start_h, start_m = map(int, window.start.split(":"))
    end_h, end_m = map(int, window.end.split(":"))
    for back in (-1, 0, 1, 2):  # the window of the next day opens early, the day before's closes late
        day = (at - timedelta(days=back)).replace(hour=0, minute=0)
        if WEEKDAYS[day.weekday()] not in window.days:
            continue
        opens = day + timedelta(hours=start_h, minutes=start_m)
        closes = day + timedelta(hours=end_h, minutes=end_m)
        if closes <= opens:
            closes += timedelta(days=1)
        if opens - timedelta(minutes=lead) <= at < closes:
            return True
    return False


WINDOWS = [
    ({"start": "09:00", "end": "17:00", "days": ["Mon", "Tue", "Wed", "Thu", "Fri"]}, 2),
    ({"start": "00:01", "end": "01:00", "days": ["Mon"]}, 5),  # opens the day before (Sunday)
    ({"start": "22:00", "end": "02:00", "days": ["Sun"]}, 3),  # closes the next day (Monday)
    ({"start": "12:30", "end": "12:31"}, 1),  # every day, one minute
]


@pytest.mark.parametrize(("fields", "lead"), WINDOWS, ids=[w["start"] for w, _ in WINDOWS])
def test_the_cron_trigger_is_active_exactly_in_the_window_and_its_warm_up(
    fields: dict[str, Any], lead: int
) -> None:
    window = WarmWindow.model_validate({**fields, "minReplicas": 2, "timeZone": "Europe/Berlin"})
    trigger = warm_trigger(0, window, lead)
    assert trigger["type"] == "cron" and trigger["name"] == "warm-0"
    assert trigger["metadata"]["timezone"] == "Europe/Berlin"
    assert trigger["metadata"]["desiredReplicas"] == "2"
    # Every minute of a week.
    minutes = set(range(0, 7 * 24 * 60))
    wrong = [
        WEEK + timedelta(minutes=minute)
        for minute in sorted(minutes)
        if active(trigger, WEEK + timedelta(minutes=minute))
        != expected(window, lead, WEEK + timedelta(minutes=minute))
    ]
    assert not wrong, (trigger["metadata"], wrong[:5])


def test_the_crons_as_a_person_reads_them() -> None:
    weekdays = WarmWindow.model_validate(
        {"start": "09:00", "end": "17:00", "days": ["Mon", "Tue", "Wed", "Thu", "Fri"], "minReplicas": 3}
    )
    meta = warm_trigger(1, weekdays, 2)["metadata"]
    assert (meta["start"], meta["end"], meta["timezone"]) == (
        "58 8 * * 1,2,3,4,5",
        "0 17 * * 1,2,3,4,5",
        "UTC",
    )
    monday = WarmWindow.model_validate({"start": "00:01", "end": "01:00", "days": ["Mon"], "minReplicas": 1})
    meta = warm_trigger(0, monday, 5)["metadata"]
    assert (meta["start"], meta["end"]) == ("56 23 * * 0", "0 1 * * 1")  # Sunday 23:56, Monday 01:00


def test_the_warm_up_is_the_spec_s_else_the_measured_cold_start_else_five_minutes() -> None:
    spec = AutoscalingSpec.model_validate({"maxReplicas": 2})
    assert warm_up_minutes(spec, None) == 5
    assert warm_up_minutes(spec, 62.0) == 2  # rounded up to whole minutes
    set_ = AutoscalingSpec.model_validate({"maxReplicas": 2, "warmUpSeconds": 0})
    assert warm_up_minutes(set_, 62.0) == 0


def test_the_scaled_object_carries_a_trigger_per_window_after_the_load_triggers() -> None:
    spec = InferenceServiceSpec.model_validate(
        {
            **BASE,
            "autoscaling": {
                "maxReplicas": 4,
                "metricsSource": "External",
                "schedule": [
                    {"start": "09:00", "end": "17:00", "minReplicas": 2},
                    {"start": "20:00", "end": "21:00", "minReplicas": 4, "days": ["Sat"]},
                ],
            },
        }
    )
    by_kind = {c["kind"]: c for c in desired_children("m", "ns", spec, ChildInputs(typical_start=100.0))}
    triggers = by_kind["ScaledObject"]["spec"]["triggers"]
    assert [t["name"] for t in triggers] == ["in-flight", "warm-0", "warm-1"]
    assert triggers[1]["metadata"]["start"] == "58 8 * * 0,1,2,3,4,5,6"  # 100 s measured: 2 minutes early
    assert triggers[2]["metadata"]["start"] == "58 19 * * 6"
    no_schedule = InferenceServiceSpec.model_validate(
        {**BASE, "autoscaling": {"maxReplicas": 4, "metricsSource": "External"}}
    )
    by_kind = {
        c["kind"]: c for c in desired_children("m", "ns", no_schedule, ChildInputs(typical_start=100.0))
    }
    assert [t["type"] for t in by_kind["ScaledObject"]["spec"]["triggers"]] == ["prometheus"]


@pytest.mark.parametrize(
    ("window", "message"),
    [
        ({"start": "09:00", "end": "09:00", "minReplicas": 1}, "start and end must differ"),
        ({"start": "09:00", "end": "10:00", "minReplicas": 5}, "minReplicas must be at most"),
        ({"start": "09:00", "end": "10:00", "minReplicas": 1, "days": ["Mon", "Mon"]}, "must not repeat"),
        ({"start": "09:00", "end": "10:00", "minReplicas": 1, "days": ["Monday"]}, "Mon"),
        ({"start": "09:00", "end": "10:00", "minReplicas": 1, "timeZone": "Mars/Base"}, "Mars/Base"),
        ({"start": "9:00", "end": "10:00", "minReplicas": 1}, "start"),
        ({"start": "09:00", "end": "10:00", "minReplicas": 0}, "minReplicas"),
    ],
)
def test_a_bad_window_is_refused_naming_the_field(window: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message) as caught:
        AutoscalingSpec.model_validate({"maxReplicas": 4, "schedule": [window]})
    assert "schedule" in str(caught.value)
