"""Kubernetes Events (core/v1) about an InferenceService: one per pass that created, changed or deleted
children (naming them all), and a Warning when the object becomes Degraded. Recording an Event never fails a
reconcile."""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from pagoda.operator.kube.client import Kube, KubeError
from pagoda.operator.resources.meta import FIELD_MANAGER

log = logging.getLogger("pagoda.operator.events")
INSTANCE = os.environ.get("POD_NAME") or socket.gethostname()

Obj = dict[str, Any]


def changes_event(changes: list[tuple[str, str, str]]) -> tuple[str, str]:
    """The reason and message of the one Event about a pass's (verb, kind, name) changes (pure), e.g.
    ("Created", "Created Deployment llm, Service llm, PodDisruptionBudget llm"). Verbs keep their first
    order; a pass that did more than one kind of change has the reason "Changed"."""
    grouped: dict[str, list[str]] = {}
    for verb, kind, name in changes:
        grouped.setdefault(verb, []).append(f"{kind} {name}")
    reason = next(iter(grouped)) if len(grouped) == 1 else "Changed"
    return reason, "; ".join(f"{verb} {', '.join(children)}" for verb, children in grouped.items())


def event_body(owner: Obj, *, type_: str, reason: str, message: str, now: str) -> Obj:
    """A core/v1 Event about `owner` (pure)."""
    meta = owner["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": FIELD_MANAGER},
        "reportingComponent": FIELD_MANAGER,
        "reportingInstance": INSTANCE,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def record(kube: Kube, owner: Obj, *, type_: str, reason: str, message: str, now: str) -> None:
    body = event_body(owner, type_=type_, reason=reason, message=message, now=now)
    try:
        kube.create(body, "events")
    except (KubeError, OSError) as exc:
        log.warning(
            "Failed to record Event reason=%s name=%s namespace=%s error=%r",
            reason,
            owner["metadata"]["name"],
            owner["metadata"]["namespace"],
            str(exc),
        )
