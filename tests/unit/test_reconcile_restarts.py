"""Scheduled restarts: the schedule's arithmetic (interval, daily window, time zones, DST), the plan of one
pass read back from the live Deployment, the builders' annotations, and one pass of the reconciler."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta
from typing import Any

import pytest
from fakekube import deployment_of
from pydantic import ValidationError

from pagoda.operator.api import InferenceServiceSpec, RestartSchedule, error_messages
from pagoda.operator.api import rules as r
from pagoda.operator.api.restarts import parse_duration
from pagoda.operator.api.status import RestartStatus
from pagoda.operator.kube.cache import ObjectCache
from pagoda.operator.reconcile import core
from pagoda.operator.reconcile.restarts import (
    KUBECTL_RESTARTED_AT,
    POSTPONED_RETRY_S,
    announcement,
    in_window,
    next_restart,
    plan,
)
from pagoda.operator.resources import ChildInputs, RestartStamps, desired_children
from pagoda.operator.resources.meta import RESTART_SCHEDULE_SINCE_ANNOTATION, RESTARTED_AT_ANNOTATION
from pagoda.operator.status.times import rfc3339

Obj = dict[str, Any]
SPEC: Obj = {
    "model": {"uri": "hf://pagoda-test/tiny-llama"},
    "resources": {"gpu": {"count": 1}},
    "replicas": 2,
}


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def schedule(
    every: str, start: str | None = None, end: str | None = None, zone: str = "UTC"
) -> RestartSchedule:
    raw: Obj = {"every": every}
    if start is not None:
        raw["window"] = {"start": start, "end": end, "timeZone": zone}
    return RestartSchedule.model_validate(raw)


def schedule_of(restart_schedule: Obj | None) -> RestartSchedule | None:
    """spec.restartSchedule as the reconcile passes it to plan()."""
    return RestartSchedule.model_validate(restart_schedule) if restart_schedule else None


def owner(restart_schedule: Obj | None) -> Obj:
    spec = {**SPEC, "restartSchedule": restart_schedule} if restart_schedule else dict(SPEC)
    return {"metadata": {"name": "llm", "namespace": "ns", "uid": "u", "generation": 1}, "spec": spec}


def deployment(
    restarted_at: str | None = None,
    since: str | None = None,
    kubectl: str | None = None,
    ready: int = 2,
    updated: int = 2,
    replicas: int = 2,
) -> Obj:
    stamps = {RESTARTED_AT_ANNOTATION: restarted_at, KUBECTL_RESTARTED_AT: kubectl}
    meta: Obj = {"name": "llm", "generation": 4}
    if since:
        meta["annotations"] = {RESTART_SCHEDULE_SINCE_ANNOTATION: since}
    return {
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "template": {"metadata": {"annotations": {k: v for k, v in stamps.items() if v}}},
        },
        "status": {
            "observedGeneration": 4,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "availableReplicas": ready,
        },
    }


# --- the API -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"), [("12h", 43200), ("90m", 5400), ("1h30m", 5400), ("2m30s", 150)]
)
def test_durations_read_like_go(text: str, seconds: int) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"every": "30s"}, r.MSG_RESTART_EVERY),
        ({"every": "721h"}, r.MSG_RESTART_EVERY),
        ({"every": "1d"}, "spec.restartSchedule.every"),
        ({"every": ""}, "spec.restartSchedule.every"),
        ({"every": "1h", "window": {"start": "2:00", "end": "05:00"}}, "spec.restartSchedule.window.start"),
        ({"every": "1h", "window": {"start": "02:00", "end": "24:00"}}, "spec.restartSchedule.window.end"),
        ({"every": "1h", "window": {"start": "02:00", "end": "02:00"}}, r.MSG_RESTART_WINDOW),
        (
            {"every": "1h", "window": {"start": "02:00", "end": "05:00", "timeZone": "Mars/Olympus"}},
            "spec.restartSchedule.window.timeZone",
        ),
    ],
)
def test_an_invalid_schedule_names_its_field(raw: Obj, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        InferenceServiceSpec.model_validate({**SPEC, "restartSchedule": raw})
    assert any(message.startswith(field) for message in error_messages(caught.value)), caught.value


def test_the_cel_rules_reject_what_pydantic_rejects(cel_check: Any) -> None:
    def violations(raw: Obj) -> list[str]:
        obj = {"metadata": {"name": "llm"}, "spec": {**SPEC, "restartSchedule": raw}}
        found: list[str] = cel_check(obj)
        return found

    assert violations({"every": "59s"}) == [r.MSG_RESTART_EVERY]
    assert violations({"every": "720h1s"}) == [r.MSG_RESTART_EVERY]
    assert violations({"every": "1h", "window": {"start": "03:00", "end": "03:00"}}) == [r.MSG_RESTART_WINDOW]
    assert violations({"every": "not-a-duration"}) == []  # the pattern rejects it; the rule must not fail
    assert violations({"every": "1m", "window": {"start": "22:00", "end": "04:00"}}) == []
    assert violations({"every": "720h"}) == []


# --- the arithmetic ------------------------------------------------------------------------------------


def test_without_a_window_the_next_restart_is_one_interval_later() -> None:
    assert next_restart(schedule("12h"), at("2026-12-01T10:00:00Z"), at("2026-12-01T10:00:00Z")) == at(
        "2026-12-01T22:00:00Z"
    )


def test_a_restart_outside_the_window_waits_for_its_opening() -> None:
    nightly = schedule("12h", "02:00", "05:00")
    # 02:30 + 12h = 14:30, outside: the next opening is tomorrow 02:00.
    assert next_restart(nightly, at("2026-12-01T02:30:00Z"), at("2026-12-01T02:30:00Z")) == at(
        "2026-12-02T02:00:00Z"
    )
    # Inside the window it stays as it is.
    assert next_restart(
        schedule("1h", "02:00", "05:00"), at("2026-12-01T02:30:00Z"), at("2026-12-01T02:30:00Z")
    ) == at("2026-12-01T03:30:00Z")


def test_a_window_across_midnight() -> None:
    night = schedule("1h", "22:00", "04:00").window
    assert in_window(night, at("2026-12-01T23:30:00Z")) and in_window(night, at("2026-12-02T03:59:59Z"))
    assert not in_window(night, at("2026-12-02T04:00:00Z")) and not in_window(
        night, at("2026-12-01T21:59:00Z")
    )
    # 03:30 + 1h = 04:30: closed, so 22:00 the same day.
    assert next_restart(
        schedule("1h", "22:00", "04:00"), at("2026-12-02T03:30:00Z"), at("2026-12-02T03:30:00Z")
    ) == at("2026-12-02T22:00:00Z")


def test_a_window_in_a_time_zone_follows_its_daylight_saving_time() -> None:
    berlin = schedule("24h", "02:00", "05:00", "Europe/Berlin")
    # Winter (UTC+1): 02:00 in Berlin is 01:00 UTC; summer (UTC+2): 00:00 UTC.
    assert next_restart(berlin, at("2026-01-10T12:00:00Z"), at("2026-01-10T12:00:00Z")) == at(
        "2026-01-12T01:00:00Z"
    )
    assert next_restart(berlin, at("2026-07-10T12:00:00Z"), at("2026-07-10T12:00:00Z")) == at(
        "2026-07-12T00:00:00Z"
    )


def test_an_interval_is_absolute_time_across_a_dst_change() -> None:
    # New York springs forward on 2026-03-08 at 02:00: 12h after 20:00 EST is 09:00 EDT, 12 real hours.
    anchor = at("2026-03-08T01:00:00Z")  # 20:00 EST on 03-07
    assert next_restart(schedule("12h"), anchor, anchor) == anchor + timedelta(hours=12)


def test_a_window_opening_in_the_skipped_hour_opens_when_the_clock_resumes() -> None:
    # On 2026-03-08 New York has no 02:00-03:00: the 02:00 opening is 03:00 EDT (07:00 UTC), still in it.
    ny = schedule("1h", "02:00", "05:00", "America/New_York")
    assert next_restart(ny, at("2026-03-08T05:00:00Z"), at("2026-03-08T05:00:00Z")) == at(
        "2026-03-08T07:00:00Z"
    )
    assert in_window(ny.window, at("2026-03-08T07:00:00Z"))


def test_a_window_that_does_not_exist_that_day_is_skipped() -> None:
    # 02:00-02:30 does not exist in New York on 2026-03-08: at its would-be opening the next is the 9th.
    short = schedule("1h", "02:00", "02:30", "America/New_York")
    opening = at("2026-03-08T07:00:00Z")
    assert next_restart(short, opening - timedelta(hours=1), opening) == at("2026-03-09T06:00:00Z")


def test_a_window_in_the_repeated_hour_opens_at_its_first_occurrence() -> None:
    # New York falls back on 2026-11-01: 01:00-02:00 happens twice; the window opens at the first (EDT).
    ny = schedule("1h", "01:00", "01:30", "America/New_York")
    assert next_restart(ny, at("2026-11-01T03:00:00Z"), at("2026-11-01T03:00:00Z")) == at(
        "2026-11-01T05:00:00Z"
    )


def test_a_missed_window_moves_to_the_next_opening() -> None:
    nightly = schedule("12h", "02:00", "05:00")
    # Due at 02:00, but the pass runs at 06:00 (the service was busy until then): tomorrow 02:00.
    assert next_restart(nightly, at("2026-11-30T14:00:00Z"), at("2026-12-01T06:00:00Z")) == at(
        "2026-12-02T02:00:00Z"
    )
    # Still in the window: due now.
    assert next_restart(nightly, at("2026-11-30T14:00:00Z"), at("2026-12-01T04:00:00Z")) == at(
        "2026-12-01T02:00:00Z"
    )


# --- one pass's plan -----------------------------------------------------------------------------------

NOW = "2026-12-01T12:00:00Z"


def test_without_a_schedule_the_last_restart_stays_on_the_template() -> None:
    restart = plan(schedule_of(None), deployment(restarted_at="2026-11-30T00:00:00Z"), NOW)
    assert (restart.restarted_at, restart.since, restart.status(), restart.requeue_after()) == (
        "2026-11-30T00:00:00Z",
        None,
        None,
        None,
    )
    assert plan(schedule_of(None), None, NOW).restarted_at is None


def test_the_first_restart_is_one_interval_after_the_schedule_was_first_seen() -> None:
    # Creation: no Deployment yet.
    first = plan(schedule_of({"every": "12h"}), None, NOW)
    assert (first.since, first.restart, first.status()) == (NOW, False, {"next": "2026-12-02T00:00:00Z"})
    assert first.requeue_after() == 12 * 3600 + 1
    # Added to a service last restarted long ago: not at once, one interval from now.
    added = plan(schedule_of({"every": "12h"}), deployment(restarted_at="2026-11-01T00:00:00Z"), NOW)
    assert (added.since, added.restart) == (NOW, False)
    assert added.status() == {"last": "2026-11-01T00:00:00Z", "next": "2026-12-02T00:00:00Z"}


def test_a_due_restart_stamps_the_template_with_now() -> None:
    live = deployment(restarted_at="2026-12-01T00:00:00Z", since="2026-11-30T00:00:00Z")
    restart = plan(schedule_of({"every": "12h"}), live, NOW)
    assert (restart.restart, restart.restarted_at, restart.since) == (True, NOW, "2026-11-30T00:00:00Z")
    assert restart.status() == {"last": NOW, "next": "2026-12-02T00:00:00Z"}
    # One second earlier it was not due yet.
    assert not plan(schedule_of({"every": "12h"}), live, "2026-12-01T11:59:59Z").restart


def test_a_kubectl_rollout_restart_counts_as_the_last_restart() -> None:
    live = deployment(
        restarted_at="2026-12-01T00:00:00Z", since="2026-11-30T00:00:00Z", kubectl="2026-12-01T11:00:00+01:00"
    )
    restart = plan(schedule_of({"every": "12h"}), live, NOW)
    assert not restart.restart
    assert restart.status() == {"last": "2026-12-01T10:00:00Z", "next": "2026-12-01T22:00:00Z"}


@pytest.mark.parametrize(
    ("live", "why"),
    [
        (deployment(updated=1), "Postponed: a rollout is in progress"),
        (deployment(ready=1), "Postponed: a rollout is in progress"),
        (deployment(replicas=0, ready=0, updated=0), "Postponed: the Deployment is scaled to 0 replicas"),
    ],
)
def test_a_due_restart_waits_for_a_settled_service(live: Obj, why: str) -> None:
    live["metadata"]["annotations"] = {RESTART_SCHEDULE_SINCE_ANNOTATION: "2026-11-30T00:00:00Z"}
    restart = plan(schedule_of({"every": "12h"}), live, NOW)
    assert (restart.restart, restart.restarted_at) == (False, None)
    assert restart.status() == {"next": "2026-11-30T12:00:00Z", "message": why}
    assert restart.requeue_after() == POSTPONED_RETRY_S


def test_a_ready_count_below_the_desired_one_postpones() -> None:
    live = deployment(since="2026-11-30T00:00:00Z")
    live["status"]["readyReplicas"] = 1  # available but not ready (a failing readiness probe)
    assert plan(schedule_of({"every": "12h"}), live, NOW).message == "Postponed: 1/2 replicas are ready"


def test_the_status_fits_the_status_model() -> None:
    live = deployment(restarted_at="2026-12-01T00:00:00Z", since="2026-11-30T00:00:00Z", updated=1)
    status = plan(schedule_of({"every": "12h"}), live, NOW).status()
    assert status is not None
    assert RestartStatus.model_validate(status).model_dump(by_alias=True, exclude_none=True) == status


def test_the_event_is_told_only_when_the_applied_template_carries_the_new_value() -> None:
    live = deployment(since="2026-11-30T00:00:00Z")
    restart = plan(schedule_of({"every": "12h"}), live, NOW)
    assert announcement(restart, live) is None  # the apply failed: the live template is the old one
    applied = copy.deepcopy(live)
    applied["spec"]["template"]["metadata"]["annotations"][RESTARTED_AT_ANNOTATION] = NOW
    assert announcement(restart, applied) == (
        "Restarting every pod (spec.restartSchedule every 12h); next restart at 2026-12-02T00:00:00Z"
    )


# --- the builders --------------------------------------------------------------------------------------


def test_the_builders_carry_the_annotations_only_when_given() -> None:
    spec = InferenceServiceSpec.model_validate(SPEC)
    plain = deployment_of(desired_children("llm", "ns", spec))
    assert (
        "annotations" not in plain["metadata"] and "annotations" not in plain["spec"]["template"]["metadata"]
    )
    stamped = deployment_of(
        desired_children("llm", "ns", spec, ChildInputs(stamps=RestartStamps(NOW, "2026-11-30T00:00:00Z")))
    )
    assert stamped["spec"]["template"]["metadata"]["annotations"] == {RESTARTED_AT_ANNOTATION: NOW}
    assert stamped["metadata"]["annotations"] == {RESTART_SCHEDULE_SINCE_ANNOTATION: "2026-11-30T00:00:00Z"}
    # Only the annotation differs: the template is otherwise the same.
    del stamped["spec"]["template"]["metadata"]["annotations"], stamped["metadata"]["annotations"]
    assert stamped == plain


# --- one pass ------------------------------------------------------------------------------------------


class ApplyingKube:
    """Answers applies and status patches the way the API server does (the object back)."""

    def __init__(self) -> None:
        self.applied: list[Obj] = []
        self.events: list[Obj] = []

    def check_leader(self, what: str) -> None:
        """No leader election here: every pass and write may go (kube.py's fence)."""

    def apply(self, manifest: Obj, plural: str) -> Obj:
        self.applied.append(manifest)
        return copy.deepcopy(manifest)

    def create(self, manifest: Obj, plural: str) -> Obj:
        self.events.append(manifest)
        return manifest

    def patch_status(self, *args: Any) -> Obj:
        return {**OWNER, "status": args[-1]}

    def delete(self, *args: Any) -> None:
        raise AssertionError("nothing to delete")


OWNER = {**owner({"every": "12h"}), "apiVersion": "pagoda.dev/v1alpha1", "kind": "InferenceService"}


def test_a_pass_restarts_when_due_and_requeues_at_the_next_restart() -> None:
    cache = ObjectCache("InferenceService")
    cache.observe(OWNER)
    kube = ApplyingKube()
    first = core.reconcile(kube, "ns", "llm", now=lambda: NOW, cache=cache)  # type: ignore[arg-type]
    (created,) = [m for m in kube.applied if m["kind"] == "Deployment"]
    assert created["metadata"]["annotations"] == {RESTART_SCHEDULE_SINCE_ANNOTATION: NOW}
    assert "annotations" not in created["spec"]["template"]["metadata"]
    assert first.requeue_after == 12 * 3600 + 1
    # The Deployment settles; twelve hours later the pass restarts the pods.
    settled = {
        **created,
        "status": deployment()["status"],
        "metadata": {**created["metadata"], "generation": 4},
    }
    cache.observe({**settled, "metadata": {**settled["metadata"], "uid": "d", "resourceVersion": "5"}})
    kube.applied.clear()
    later = "2026-12-02T00:00:00Z"
    second = core.reconcile(kube, "ns", "llm", now=lambda: later, cache=cache)  # type: ignore[arg-type]
    (restarted,) = kube.applied
    assert restarted["spec"]["template"]["metadata"]["annotations"] == {RESTARTED_AT_ANNOTATION: later}
    assert second.requeue_after == 12 * 3600 + 1
    assert [(e["reason"], e["type"]) for e in kube.events if e["reason"] == "ScheduledRestart"] == [
        ("ScheduledRestart", "Normal")
    ]
    status = cache.owner("ns", "llm")["status"]  # type: ignore[index]
    assert status["restarts"] == {"last": later, "next": rfc3339(at(later) + timedelta(hours=12))}
