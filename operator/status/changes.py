"""From the stored status to the one a pass computed (pure): whether it changed (`status_changed`), the
JSON merge patch that stores it (`status_patch`), whether a new service's first status waits a moment for
the Deployment controller's report (`first_report_wait`), and the Degraded condition a Warning Event is
about (`degraded_now`). What the status says is report.py's; this is when and how it is written.
"""

from __future__ import annotations

from typing import Any

from pagoda.operator.status.report import Problem, Verdict
from pagoda.operator.status.times import parse_time

Obj = dict[str, Any]


# Status fields present only when they apply (a URL, an autoscaler, a reported capacity, a node cache, a
# restart schedule, LoRA adapters).
OPTIONAL_FIELDS = (
    "url",
    "autoscaling",
    "capacity",
    "startup",
    "modelCache",
    "restarts",
    "adapters",
    "adaptersReady",
    "profile",
    "sizing",
)


def status_patch(previous: Obj, status: Obj) -> Obj:
    """The JSON merge patch that makes the stored status `status`: a merge patch keeps what it does not
    name, so an optional field that no longer applies, and a key gone from a nested object (e.g.
    status.profile.concurrency when a profile met the SLO at no step, status.sizing.inFlight during KEDA's
    fallback), is named with null."""
    patch = {**status, **{key: None for key in OPTIONAL_FIELDS if key in previous and key not in status}}
    return {key: _removals(previous.get(key), value) for key, value in patch.items()}


def _removals(previous: Any, value: Any) -> Any:
    if not isinstance(previous, dict) or not isinstance(value, dict):
        return value
    gone = {key: None for key in previous if key not in value}
    return {**{key: _removals(previous.get(key), item) for key, item in value.items()}, **gone}


def status_changed(live: Obj | None, new: Obj) -> bool:
    """True when writing `new` would change the fields of the status that we own."""
    live = live or {}
    return any(live.get(key) != value for key, value in new.items()) or any(
        key in live and key not in new for key in OPTIONAL_FIELDS
    )


def degraded_now(status: Obj) -> Verdict | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Degraded" and cond.get("status") == "True":
            return Verdict("Degraded", True, str(cond.get("reason")), str(cond.get("message")))
    return None


# How long the first status of a new InferenceService waits for the Deployment controller's first report on
# its Deployment (well under a second in a healthy cluster; seconds when many services are created at once).
FIRST_REPORT_GRACE_S = 10.0


def first_report_wait(
    previous: Obj, deployment: Obj | None, problems: list[Problem], now: str
) -> float | None:
    """Seconds to hold back the first status of a new InferenceService; None: write it now.

    Just after the Deployment is created, before its controller has reported on it (no
    `status.observedGeneration`), the status could only say "0 replicas, rollout not started", and the
    controller's report, whose watch event queues another pass, replaces that moments later: so the first
    status waits for that report, at most FIRST_REPORT_GRACE_S after the Deployment's creation, and one
    status write says what the first two would have. Never once a status was written, nor when something is
    wrong (a problem is reported at once)."""
    if previous or problems or deployment is None:
        return None
    if (deployment.get("status") or {}).get("observedGeneration") is not None:
        return None
    created = parse_time(str((deployment.get("metadata") or {}).get("creationTimestamp") or ""))
    current = parse_time(now)
    if created is None or current is None:
        return None
    left = FIRST_REPORT_GRACE_S - (current - created).total_seconds()
    return left if left > 0 else None
