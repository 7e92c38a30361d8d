"""Pure functions: `status.startup`, where the replicas' start-up time goes.

A replica's start, pod creation to Ready, in phases:

  scheduling      creationTimestamp -> the PodScheduled condition (the scheduler)
  containerStart  scheduled -> the runtime's process started (the kubelet: image pull, volumes, sandbox)
  imports ... apiServer   the runtime's own phases (runtime/serving/startup.py), as it reports them on
                  /v1/pagoda/capacity once ready (capacity.py asks each Ready pod once)
  readiness       the runtime ready -> the Ready condition (the kubelet's next startup and readiness probes)

The Pod's timestamps have whole seconds and come from other machines' clocks than the runtime's, so the
phases add up to about the total (each is clamped at 0). Only a replica's first start counts: a container the
kubelet restarted has a Pod creation time from before its earlier runs. `recent` keeps the last
RECENT_STARTS starts (oldest first), `typical` their medians, `last` the newest.
"""

from __future__ import annotations

import math
import statistics
from datetime import datetime
from typing import Any

from pagoda.contract import STARTUP_PHASES
from pagoda.contract.payloads import ModelCacheReport, StartupRecord
from pagoda.operator.resources.meta import CONTAINER_NAME
from pagoda.operator.status.times import parse_time, rfc3339

Obj = dict[str, Any]

PHASES = ("scheduling", "containerStart", *STARTUP_PHASES, "readiness")
RECENT_STARTS = 10


def record(pod: Obj, report: StartupRecord) -> Obj | None:
    """One replica's start from its Pod and its runtime's `startup` report (contract/payloads.py, which
    leaves out a phase or a size it cannot read); None when it is not a first start that became Ready."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    container = next(
        (c for c in status.get("containerStatuses") or [] if c.get("name") == CONTAINER_NAME), None
    )
    if container is None or int(container.get("restartCount") or 0) != 0:
        return None
    created = parse_time(meta.get("creationTimestamp"))
    scheduled = _condition_time(status, "PodScheduled")
    ready = _condition_time(status, "Ready")
    process_started = parse_time(report.started_at)
    runtime_ready = parse_time(report.ready_at)
    if (
        created is None
        or scheduled is None
        or ready is None
        or process_started is None
        or runtime_ready is None
    ):
        return None
    phases: dict[str, float] = {
        "scheduling": _seconds(scheduled, created),
        "containerStart": _seconds(process_started, scheduled),
    }
    for name in STARTUP_PHASES:
        if name in report.phases:
            phases[name] = round(report.phases[name], 1)
    phases["readiness"] = _seconds(ready, runtime_ready)
    start: Obj = {
        "pod": str(meta.get("name") or ""),
        "readyAt": rfc3339(ready),
        "seconds": _seconds(ready, created),
        "phases": phases,
    }
    if report.model_bytes is not None:
        start["modelBytes"] = report.model_bytes
    if report.fetched_bytes is not None:
        start["fetchedBytes"] = report.fetched_bytes
    return start


MAX_CACHE_NODES, MAX_CACHED_MODELS = 64, 16


def model_cache_status(reports: list[tuple[str, ModelCacheReport]]) -> Obj | None:
    """`status.modelCache` (spec.model.cache.scope Node) from (node, the runtime's `modelCache` report)
    pairs, the newest report of a node last: per node, the models in the namespace's folder there, biggest
    first (the report leaves out a model it cannot read). None without a report."""
    nodes: dict[str, Obj] = {}
    for node, report in reports:
        models = []
        for item in report.models or []:
            model: Obj = {"uri": item.uri, "bytes": item.bytes, "inUse": item.in_use is True}
            if item.revision is not None:
                model["revision"] = item.revision
            if item.last_used is not None:
                model["lastUsed"] = item.last_used
            models.append(model)
        entry: Obj = {
            "node": node,
            "bytes": sum(m["bytes"] for m in models),
            "models": models[:MAX_CACHED_MODELS],
        }
        if report.max_bytes is not None:
            entry["maxBytes"] = report.max_bytes
        nodes[node] = entry
    if not nodes:
        return None
    return {"nodes": [nodes[name] for name in sorted(nodes)][:MAX_CACHE_NODES]}


def startup_status(previous: Obj | None, starts: list[Obj]) -> Obj | None:
    """`status.startup` with `starts` (records of this pass) added to the previous status's; None while no
    replica has started."""
    recent = [dict(r) for r in (previous or {}).get("recent") or [] if isinstance(r, dict)]
    known = {r.get("pod") for r in recent}
    new = [s for s in starts if s["pod"] not in known]
    if not new and previous:
        return previous
    recent = sorted(recent + new, key=lambda r: str(r.get("readyAt")))[-RECENT_STARTS:]
    if not recent:
        return None
    return {"last": recent[-1], "typical": typical(recent), "recent": recent}


def typical_seconds(startup: Obj | None) -> float | None:
    """status.startup.typical.seconds when it is a number of seconds under a day (a person can edit a
    status), else None."""
    value = _number(((startup or {}).get("typical") or {}).get("seconds"))
    return value if value is not None and value < 86_400 else None


def typical(starts: list[Obj]) -> Obj:
    """The medians of `starts`: of their totals and, per phase, of the starts that report it."""
    phases: dict[str, float] = {}
    for name in PHASES:
        values = [float(s["phases"][name]) for s in starts if name in (s.get("phases") or {})]
        if values:
            phases[name] = round(statistics.median(values), 1)
    totals = [float(s.get("seconds") or 0) for s in starts]
    return {"starts": len(starts), "seconds": round(statistics.median(totals), 1), "phases": phases}


def _number(value: Any) -> float | None:
    """A finite number of at least 0 from the status's JSON (a person can edit a status), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _condition_time(status: Obj, type_: str) -> datetime | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") == type_ and cond.get("status") == "True":
            return parse_time(cond.get("lastTransitionTime"))
    return None


def _seconds(later: datetime, earlier: datetime) -> float:
    return round(max(0.0, (later - earlier).total_seconds()), 1)
