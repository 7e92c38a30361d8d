"""Pure functions: what keeps an InferenceService's pods from running, for the Degraded condition.

The runtime writes `<Reason>: <message>` to its termination-message file when it cannot start
(runtime/serving/termination.py: ModelNotFound, ModelDoesNotFit, ...); the kubelet copies it into the pod's
`containerStatuses[].lastState.terminated.message`. A container that keeps failing becomes a `PodIssue`
with that reason, or `OOMKilled`, or `RuntimeCrashLoop` when the runtime said nothing; a container that
cannot be created (image, config) keeps the kubelet's waiting reason. A container that does not become ready
within its startupProbe's budget (initialDelaySeconds + failureThreshold x periodSeconds) is `StartupTimeout`:
still loading past it, or restarted by the kubelet at about that age (the runtime, stopped while loading,
exits 0 and writes no reason). No I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pagoda.operator.status.times import parse_time

Obj = dict[str, Any]


def pod_condition(pod: Obj, kind: str) -> bool:
    """Whether the pod's condition `kind` (Ready, PodScheduled, ...) is True."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


POD_KIND = ("v1", "Pod", "pods")  # (apiVersion, kind, plural): watched and cached beside the children
# `<Reason>: ` at the start of a termination message: a CamelCase word, as in a condition's reason.
_REASON = re.compile(r"^([A-Z][A-Za-z0-9]{1,62}): (.+)", re.DOTALL)
MAX_DETAIL_CHARS = 2000
# Waiting reasons of a container the kubelet cannot start, with what to change.
_WAITING_HINTS = {
    "ErrImagePull": "fix spec.runtime.image (or model.uri for oci://) or spec.runtime.imagePullSecrets",
    "ImagePullBackOff": "fix spec.runtime.image (or model.uri for oci://) or spec.runtime.imagePullSecrets",
    "InvalidImageName": "fix spec.runtime.image",
    "CreateContainerConfigError": "create the Secret or key it names, or fix the reference in the spec",
    "CreateContainerError": "see the pod's events",
}
STARTUP_FIELD = "spec.runtime.startupTimeoutSeconds"
# How a container stopped by the kubelet ends: the runtime's clean exit on SIGTERM, or SIGKILL/SIGTERM.
_STOPPED_EXIT_CODES = (0, 137, 143)
# The runtime's termination message when it was stopped before it was ready (runtime/serving/termination.py).
STOPPED_WHILE_LOADING = "StoppedWhileLoading"
_DEFAULT_GRACE_SECONDS = 30


@dataclass(frozen=True)
class PodIssue:
    reason: str
    message: str


@dataclass(frozen=True)
class Startup:
    """A container's startupProbe budget (seconds) and the pod's termination grace period."""

    budget: int
    period: int
    grace: int


def pods_issue(pods: list[Obj], now: datetime | None = None) -> PodIssue | None:
    """The first failing container of `pods` (by pod name, so the choice is stable), saying which pod;
    None when no container is failing. Pods being deleted are not looked at. `now` (timezone-aware)
    lets a container still loading past its startup budget count as failing."""
    found: list[PodIssue] = []
    for pod in sorted(pods, key=lambda p: str(p.get("metadata", {}).get("name", ""))):
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            startup = startup_budget(pod, str(status.get("name", "")))
            issue = container_issue(str(meta.get("name", "?")), status, startup, now)
            if issue is not None:
                found.append(issue)
                break
    if not found:
        return None
    first = found[0]
    if len(found) > 1:
        others = len(found) - 1
        return PodIssue(
            first.reason, f"{first.message} ({others} more pod{'s' if others > 1 else ''} failing)"
        )
    return first


def startup_budget(pod: Obj, container: str) -> Startup | None:
    """The startupProbe budget of `container` in `pod`'s spec; None without a probe (or a spec)."""
    spec = pod.get("spec") or {}
    for item in spec.get("containers") or []:
        probe = item.get("startupProbe") if item.get("name") == container else None
        if probe:
            period = int(probe.get("periodSeconds") or 10)
            budget = (
                int(probe.get("initialDelaySeconds") or 0) + int(probe.get("failureThreshold") or 3) * period
            )
            grace = spec.get("terminationGracePeriodSeconds")
            return Startup(budget, period, _DEFAULT_GRACE_SECONDS if grace is None else int(grace))
    return None


def container_issue(
    pod: str, status: Obj, startup: Startup | None = None, now: datetime | None = None
) -> PodIssue | None:
    """Why one container (a containerStatuses item) is failing, or None."""
    name = str(status.get("name", "?"))
    state = status.get("state") or {}
    waiting = state.get("waiting") or {}
    waiting_reason = str(waiting.get("reason") or "")
    if waiting_reason in _WAITING_HINTS:
        detail = clip(str(waiting.get("message") or waiting_reason))
        return PodIssue(
            waiting_reason,
            f"pod {pod} container {name} cannot start: {detail}; {_WAITING_HINTS[waiting_reason]}",
        )
    current = state.get("terminated")
    last = current or (status.get("lastState") or {}).get("terminated")
    if startup is not None and now is not None and _loading_too_long(status, startup, now):
        return startup_issue(pod, name, startup, int(status.get("restartCount") or 0))
    if not last:
        return None
    restarts = int(status.get("restartCount") or 0)
    crashing = (
        waiting_reason == "CrashLoopBackOff"
        or (current is not None and (last.get("exitCode") != 0 or last.get("reason") == "OOMKilled"))
        or (restarts > 0 and not status.get("ready"))
    )
    if not crashing:
        return None
    return crash_issue(pod, name, last, restarts, startup)


def crash_issue(
    pod: str, container: str, terminated: Obj, restarts: int, startup: Startup | None = None
) -> PodIssue:
    """A container that exited and is being restarted: its own termination message when it left one."""
    facts = f"exit code {terminated.get('exitCode', '?')}, {restarts} restart{'s' if restarts != 1 else ''}"
    where = f"pod {pod} container {container}"
    if terminated.get("reason") == "OOMKilled":
        return PodIssue(
            "OOMKilled",
            f"{where} was killed for using more memory than its limit ({facts}); raise spec.resources.memory",
        )
    message = str(terminated.get("message") or "").strip()
    reason, text = termination_reason(message)
    timed_out = startup is not None and _stopped_at_startup_deadline(terminated, startup)
    if startup is not None and timed_out and reason in (None, STOPPED_WHILE_LOADING):
        # The runtime's message, when it left one, says which start-up phase the budget ran out in.
        return startup_issue(pod, container, startup, restarts, facts, clip(text) if reason else None)
    if reason is not None:
        return PodIssue(reason, f"{where}: {clip(text)} ({facts})")
    said = f"; last output: {clip(_last_lines(message))}" if message else ""
    return PodIssue(
        "RuntimeCrashLoop",
        f"{where} keeps exiting ({facts}) without a termination message{said}; "
        f"see `kubectl logs {pod} -c {container} --previous`",
    )


def startup_issue(
    pod: str,
    container: str,
    startup: Startup,
    restarts: int,
    facts: str | None = None,
    phases: str | None = None,
) -> PodIssue:
    """The model did not load within the startup budget: the kubelet restarts the container each time.
    `phases`: the runtime's account of where the time went (its StoppedWhileLoading message)."""
    facts = facts or f"{restarts} restart{'s' if restarts != 1 else ''}"
    where = f"; the runtime {phases}" if phases else ""
    return PodIssue(
        "StartupTimeout",
        f"pod {pod} container {container} did not become ready within its startup budget of "
        f"{startup.budget}s, so the kubelet restarts it ({facts}){where}; raise {STARTUP_FIELD}, or make "
        "loading faster (a persistent spec.model.cache keeps downloaded weights)",
    )


def _loading_for(status: Obj, now: datetime) -> float | None:
    """Seconds a running container has been loading (its startup probe not yet passed); None otherwise."""
    running = (status.get("state") or {}).get("running") or {}
    started = parse_time(running.get("startedAt"))
    if started is None or status.get("started") is not False:
        return None
    return (now - started).total_seconds()


def _loading_too_long(status: Obj, startup: Startup, now: datetime) -> bool:
    """Running, its startup probe not yet passed, for longer than the budget."""
    loading = _loading_for(status, now)
    return loading is not None and loading > startup.budget


def next_startup_deadline(pods: list[Obj], now: datetime) -> float | None:
    """Seconds until the first container still loading passes its startup budget (when StartupTimeout
    would apply), so a pass can be queued then rather than at the next resync; None when none is loading."""
    waits: list[float] = []
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            startup = startup_budget(pod, str(status.get("name", "")))
            loading = _loading_for(status, now)
            if startup is not None and loading is not None and loading <= startup.budget:
                waits.append(startup.budget - loading + 1.0)
    return min(waits) if waits else None


def _stopped_at_startup_deadline(terminated: Obj, startup: Startup) -> bool:
    """Ended the way a startup-probe restart ends: stopped (not crashed) at about the budget's age (the
    kubelet acts on the probe failure that reaches failureThreshold, within a period of the budget, then
    waits up to the grace period)."""
    began, ended = parse_time(terminated.get("startedAt")), parse_time(terminated.get("finishedAt"))
    if began is None or ended is None or terminated.get("exitCode") not in _STOPPED_EXIT_CODES:
        return False
    ran = (ended - began).total_seconds()
    return startup.budget - startup.period - 5 <= ran <= startup.budget + startup.grace + 30


def termination_reason(message: str) -> tuple[str | None, str]:
    """(`Reason`, rest) when the message starts with `Reason: `; else (None, message)."""
    match = _REASON.match(message)
    if match is None:
        return None, message
    return match.group(1), match.group(2).strip()


def _last_lines(text: str, count: int = 3) -> str:
    return " | ".join(line.strip() for line in text.splitlines()[-count:] if line.strip())


def clip(text: str) -> str:
    """`text` on one line (runs of whitespace as one space), at most MAX_DETAIL_CHARS long: for quoting a
    message from the cluster in a condition."""
    text = " ".join(text.split())
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 3] + "..."
