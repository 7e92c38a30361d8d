"""Scheduled restarts (spec.restartSchedule): whether this pass restarts the pods, and when the next is due.

Pure functions. Nothing is remembered between passes; every time is read back from the live Deployment:
- last: the newer of the pod template's annotations pagoda.dev/restartedAt (ours) and
  kubectl.kubernetes.io/restartedAt (a manual `kubectl rollout restart` counts as a restart);
- since: the Deployment's annotation pagoda.dev/restartScheduleSince, the time of the pass that first saw
  the schedule (the service's creation, or when the schedule was added), carried over from then on and
  dropped with the schedule;
- next: max(last, since) + every, in absolute time (12h is twelve hours, across a DST change too), moved
  to the window's next opening when it falls outside the window; a due restart that missed its window
  (the service was busy) waits for the next opening.

A restart is a new value of pagoda.dev/restartedAt on the pod template, as `kubectl rollout restart` writes
its own: the Deployment rolls under spec.rollout (surge first, nothing unavailable by default) and every
old pod drains (preStop, SIGTERM, the runtime's drain). A due restart waits while a rollout is in progress
or not every replica is ready. Without a schedule the last value stays on the template: dropping it would
roll the pods once more.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, time, timedelta
from typing import Any

from pagoda.operator.api import RestartSchedule, RestartWindow
from pagoda.operator.resources.meta import RESTART_SCHEDULE_SINCE_ANNOTATION, RESTARTED_AT_ANNOTATION
from pagoda.operator.status.report import desired_replicas, rollout_done
from pagoda.operator.status.times import parse_time, rfc3339

KUBECTL_RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
POSTPONED_RETRY_S = 60.0  # a postponed restart is looked at again this often (watch events come sooner)

Obj = dict[str, Any]


def in_window(window: RestartWindow | None, at: datetime) -> bool:
    """`at` falls in the daily window (start inclusive, end exclusive, in the window's time zone)."""
    if window is None:
        return True
    clock = at.astimezone(window.zone).strftime("%H:%M")
    if window.start < window.end:
        return window.start <= clock < window.end
    return clock >= window.start or clock < window.end  # across midnight


def window_opening(window: RestartWindow | None, at: datetime) -> datetime:
    """`at` when it is in the window, else the window's next opening (in UTC).

    A start that does not exist that day (the hour a DST change skips) reads as the same wall time before
    the change, i.e. an hour later; when that is past the window's end, `next_restart` skips the day.
    """
    if in_window(window, at):
        return at.astimezone(UTC)
    assert window is not None
    zone = window.zone
    hour, minute = divmod(window.start_minute, 60)
    day = at.astimezone(zone).date()
    for offset in range(3):
        opening = datetime.combine(day + timedelta(days=offset), time(hour, minute), tzinfo=zone)
        if opening.astimezone(UTC) > at.astimezone(UTC):
            return opening.astimezone(UTC)
    raise AssertionError("a daily window opens within two days")  # pragma: no cover


def next_restart(schedule: RestartSchedule, anchor: datetime, now: datetime) -> datetime:
    """One interval after `anchor`, in the window; when that is due but the window has closed since, the
    next opening."""
    due = window_opening(schedule.window, anchor + schedule.interval)
    if due <= now and not in_window(schedule.window, now):
        due = window_opening(schedule.window, now)
    return due


@dataclass(frozen=True)
class RestartPlan:
    """For one pass: the annotations the desired Deployment carries, and what status.restarts says."""

    now: datetime
    restarted_at: str | None = None  # the pod template's pagoda.dev/restartedAt; a new value restarts
    since: str | None = None  # the Deployment's pagoda.dev/restartScheduleSince (only with a schedule)
    last: datetime | None = None
    next: datetime | None = None  # None without a schedule
    restart: bool = False  # this pass restarts the pods
    message: str | None = None  # why a due restart waits
    every: str = ""

    def status(self) -> Obj | None:
        """status.restarts, or None without a schedule."""
        if self.next is None:
            return None
        out: Obj = {"next": rfc3339(self.next)}
        if self.last is not None:
            out["last"] = rfc3339(self.last)
        if self.message:
            out["message"] = self.message
        return out

    def requeue_after(self) -> float | None:
        """Seconds until the pass that should restart (just after `next`), or to look at a postponed one
        again; None without a schedule."""
        if self.next is None:
            return None
        if self.message:
            return POSTPONED_RETRY_S
        return max(1.0, (self.next - self.now).total_seconds() + 1.0)


def _template_annotations(deployment: Obj | None) -> Obj:
    template = ((deployment or {}).get("spec") or {}).get("template") or {}
    return dict((template.get("metadata") or {}).get("annotations") or {})


def plan(schedule: RestartSchedule | None, deployment: Obj | None, now: str) -> RestartPlan:
    """The restart plan for spec.restartSchedule (None: none) given the live Deployment (None before it
    exists) at `now` (RFC 3339)."""
    at = parse_time(now) or datetime.now(UTC)
    stamps = _template_annotations(deployment)
    ours = stamps.get(RESTARTED_AT_ANNOTATION)
    if schedule is None:
        return RestartPlan(at, restarted_at=ours)
    annotations = ((deployment or {}).get("metadata") or {}).get("annotations") or {}
    since = parse_time(annotations.get(RESTART_SCHEDULE_SINCE_ANNOTATION)) or at
    restarts = [t for t in (parse_time(ours), parse_time(stamps.get(KUBECTL_RESTARTED_AT))) if t is not None]
    last = max(restarts, default=None)
    anchor = max(last, since) if last is not None else since
    due = next_restart(schedule, anchor, at)
    kept = RestartPlan(at, ours, rfc3339(since), last, due, every=schedule.every)
    if due > at or deployment is None:
        return kept
    busy = busy_reason(deployment)
    if busy is not None:
        return replace(kept, message=f"Postponed: {busy}")
    return replace(kept, restarted_at=rfc3339(at), last=at, next=next_restart(schedule, at, at), restart=True)


def busy_reason(deployment: Obj) -> str | None:
    """Why the pods should not be restarted now; None when every replica is ready and up to date."""
    want = desired_replicas(deployment)
    if want == 0:
        return "the Deployment is scaled to 0 replicas"
    if not rollout_done(deployment):
        return "a rollout is in progress"
    ready = int((deployment.get("status") or {}).get("readyReplicas") or 0)
    if ready < want:
        return f"{ready}/{want} replicas are ready"
    return None


def announcement(restart: RestartPlan, deployment: Obj | None) -> str | None:
    """The Event message when this pass restarted the pods (the Deployment it applied carries the new
    value); None otherwise."""
    if not restart.restart or restart.next is None:
        return None
    if _template_annotations(deployment).get(RESTARTED_AT_ANNOTATION) != restart.restarted_at:
        return None  # the apply failed: nothing restarted
    return (
        f"Restarting every pod (spec.restartSchedule every {restart.every}); "
        f"next restart at {rfc3339(restart.next)}"
    )
