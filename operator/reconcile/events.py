"""Kubernetes Events (core/v1) about an InferenceService: one per pass that created, changed or deleted
children (naming them all), and those a status write is worth (`record_status_changes`: a Warning when the
object becomes Degraded, scaling, adapter failures, SLOUnmet and ScalingMetricsUnavailable flipping).
Recording an Event never fails a reconcile."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from typing import Any

from pagoda.operator.kube.adapters import failure_events
from pagoda.operator.kube.client import Kube, KubeError
from pagoda.operator.resources.meta import FIELD_MANAGER
from pagoda.operator.status.changes import degraded_now
from pagoda.operator.status.scaling import scale_event
from pagoda.operator.status.scalingmetrics import metrics_event
from pagoda.operator.status.slo import slo_event

log = logging.getLogger("pagoda.operator.events")
pass_log = logging.getLogger("pagoda.operator.reconcile")  # a status change is logged among the pass's lines
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


def record_status_changes(kube: Kube, owner: Obj, previous: Obj, status: Obj, now: Callable[[], str]) -> None:
    """The Events about the status written over `previous`, in this order: a Warning when the owner becomes
    Degraded or its Degraded reason changes, Scaled, each adapter failure, each flip of SLOUnmet and of
    ScalingMetricsUnavailable."""
    name, namespace = owner["metadata"]["name"], owner["metadata"]["namespace"]

    def event(type_: str, reason: str, message: str) -> None:
        record(kube, owner, type_=type_, reason=reason, message=message, now=now())

    was, became = degraded_now(previous), degraded_now(status)
    if became is not None and (was is None or was.reason != became.reason):
        event("Warning", became.reason, became.message)
    scaled = scale_event(previous.get("autoscaling"), status.get("autoscaling"))
    if scaled is not None:
        pass_log.info("Scaled name=%s namespace=%s %s", name, namespace, scaled)
        event("Normal", "Scaled", scaled)
    for reason, message in failure_events(previous, status):
        event("Warning", reason, message)
    flipped = slo_event(previous, status)
    if flipped is not None:
        type_, reason, message = flipped
        pass_log.info(
            "Changed condition type=SLOUnmet event=%s name=%s namespace=%s", reason, name, namespace
        )
        event(type_, reason, message)
    blind = metrics_event(previous, status)  # KEDA's fallback holds the replicas, or it ended
    if blind is not None:
        type_, reason, message = blind
        pass_log.info(
            "Changed condition type=ScalingMetricsUnavailable event=%s name=%s namespace=%s",
            reason,
            name,
            namespace,
        )
        event(type_, reason, message)
