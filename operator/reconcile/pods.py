"""Pure functions: what keeps an InferenceService's pods from running, for the Degraded condition.

The runtime writes `<Reason>: <message>` to its termination-message file when it cannot start
(runtime/termination.py: ModelNotFound, ModelDoesNotFit, ...); the kubelet copies it into the pod's
`containerStatuses[].lastState.terminated.message`. A container that keeps failing becomes a `PodIssue`
with that reason, or `OOMKilled`, or `RuntimeCrashLoop` when the runtime said nothing; a container that
cannot be created (image, config) keeps the kubelet's waiting reason. No I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
POD_KIND = ("v1", "Pod", "pods")  # (apiVersion, kind, plural): watched and cached beside the children
# `<Reason>: ` at the start of a termination message: a CamelCase word, as in a condition's reason.
_REASON = re.compile(r"^([A-Z][A-Za-z0-9]{1,62}): (.+)", re.DOTALL)
MAX_DETAIL_CHARS = 2000
# Waiting reasons of a container the kubelet cannot start, with what to change.
_WAITING_HINTS = {
    "ErrImagePull": "fix spec.runtime.image or the registry credentials",
    "ImagePullBackOff": "fix spec.runtime.image or the registry credentials",
    "InvalidImageName": "fix spec.runtime.image",
    "CreateContainerConfigError": "create the Secret or key it names, or fix the reference in the spec",
    "CreateContainerError": "see the pod's events",
}


@dataclass(frozen=True)
class PodIssue:
    reason: str
    message: str


def pods_issue(pods: list[Obj]) -> PodIssue | None:
    """The first failing container of `pods` (by pod name, so the choice is stable), saying which pod;
    None when no container is failing. Pods being deleted are not looked at."""
    found: list[PodIssue] = []
    for pod in sorted(pods, key=lambda p: str(p.get("metadata", {}).get("name", ""))):
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            issue = container_issue(str(meta.get("name", "?")), status)
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


def container_issue(pod: str, status: Obj) -> PodIssue | None:
    """Why one container (a containerStatuses item) is failing, or None."""
    name = str(status.get("name", "?"))
    state = status.get("state") or {}
    waiting = state.get("waiting") or {}
    waiting_reason = str(waiting.get("reason") or "")
    if waiting_reason in _WAITING_HINTS:
        detail = _clip(str(waiting.get("message") or waiting_reason))
        return PodIssue(
            waiting_reason,
            f"pod {pod} container {name} cannot start: {detail}; {_WAITING_HINTS[waiting_reason]}",
        )
    current = state.get("terminated")
    last = current or (status.get("lastState") or {}).get("terminated")
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
    return crash_issue(pod, name, last, restarts)


def crash_issue(pod: str, container: str, terminated: Obj, restarts: int) -> PodIssue:
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
    if reason is not None:
        return PodIssue(reason, f"{where}: {_clip(text)} ({facts})")
    said = f"; last output: {_clip(_last_lines(message))}" if message else ""
    return PodIssue(
        "RuntimeCrashLoop",
        f"{where} keeps exiting ({facts}) without a termination message{said}; "
        f"see `kubectl logs {pod} -c {container} --previous`",
    )


def termination_reason(message: str) -> tuple[str | None, str]:
    """(`Reason`, rest) when the message starts with `Reason: `; else (None, message)."""
    match = _REASON.match(message)
    if match is None:
        return None, message
    return match.group(1), match.group(2).strip()


def _last_lines(text: str, count: int = 3) -> str:
    return " | ".join(line.strip() for line in text.splitlines()[-count:] if line.strip())


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 3] + "..."
