"""Pure functions: status.profile, what the capacity profile Job (resources/profile.py) measured.

`pagoda-runtime profile` writes its result, one compact JSON object, to the container's termination message;
the kubelet keeps it in the pod's status (at most 4 KiB). A pass reads it when the Job has finished and the
status does not yet name that Job as finished: one list of the Job's pods, once per profile. Until then the
status says Running; a Job that failed or ran past its deadline is Failed, with the runtime's reason (its
termination message) or the Job controller's.

A profile that met the SLO at no step has no `concurrency`; `lastMetConcurrency` then keeps the last one
measured (the previous profile's `concurrency`, or its own `lastMetConcurrency`), and `slo_concurrency` gives
metric SLO's target that, or 1 when no profile ever met the SLO: a tighter SLO never loosens the autoscaler
(status/slo.py reports it as the condition SLOUnmet).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from pagoda.contract.payloads import ProfileResult
from pagoda.operator.api.status import ProfileStatus

Obj = dict[str, Any]
PROFILE_KIND = "Job"
FINISHED = ("Succeeded", "Failed")
# The runtime's result fields copied as they are, less their nulls (the SLO's two objectives become ttftMs
# and interTokenMs; in `engine`, the tuned batch settings, a field the choice leaves alone is absent).
RESULT_FIELDS = {"concurrency", "requests_per_second", "output_tokens_per_second", "steps", "engine"}
# What a successful profile measured: kept through later profiles until another succeeds.
MEASURED = (
    "concurrency",
    "requestsPerSecond",
    "outputTokensPerSecond",
    "steps",
    "engine",
    "ttftMs",
    "interTokenMs",
    "measuredBy",
    "measuredAt",
    "lastMetConcurrency",
)
# metric SLO's base while the newest profile met the SLO at no step and none before it did.
UNMET_CONCURRENCY = 1


def profile_status(
    job: Obj | None, previous: Obj | None, termination_message: Callable[[str], str | None]
) -> Obj | None:
    """status.profile for the current profile Job (None: no Job, so no profile). `termination_message`: the
    runtime's result for a Job that ended (reconcile/profile.py reads it from the Job's pod). `previous`: the
    status's last status.profile, kept as it is once it reports this Job as finished. The measured fields
    (MEASURED) are the last successful profile's until another succeeds: a new profile that runs or fails
    leaves the autoscaler (metric SLO) the target it has, and `measuredBy` names the Job they come from."""
    if job is None:
        return None
    name = job["metadata"]["name"]
    if previous and previous.get("job") == name and previous.get("state") in FINISHED:
        return previous
    kept = {key: previous[key] for key in MEASURED if previous and key in previous}
    state, finished_at, reason = job_outcome(job)
    if state == "Running":
        return {"job": name, "state": "Running", **kept}
    message = termination_message(name)
    status: Obj = {"job": name, "state": state}
    if finished_at:
        status["finishedAt"] = finished_at
    if state == "Failed":
        return _bounded({**status, **kept, "message": message or reason or "the profile Job failed"}, kept)
    fields = result_fields(message)
    if fields.get("state") == "Failed":
        return _bounded({**status, **kept, **fields}, kept)
    measured = {"measuredBy": name, **({"measuredAt": finished_at} if finished_at else {})}
    last_met = measured_concurrency(kept) or _count(kept.get("lastMetConcurrency"))
    if measured_concurrency(fields) is None and last_met is not None:  # met at no step: keep the last
        measured["lastMetConcurrency"] = last_met
    return _bounded({**status, **fields, **measured}, kept)


def measured_concurrency(profile: Obj | None) -> int | None:
    """The concurrency per replica the last successful profile measured within the SLO, if any."""
    return _count((profile or {}).get("concurrency"))


def slo_unmet(profile: Obj | None) -> bool:
    """The newest successful profile met the SLO at no step (it measured, and found no concurrency)."""
    return bool((profile or {}).get("measuredBy")) and measured_concurrency(profile) is None


def slo_concurrency(profile: Obj | None) -> int | None:
    """metric SLO's base (api/scaling.py slo_target), from status.profile: the concurrency the newest
    successful profile measured within the SLO; when it met the SLO at no step, the last one measured
    (lastMetConcurrency), else UNMET_CONCURRENCY; None before any profile measured (targetInFlight holds)."""
    if not slo_unmet(profile):
        return measured_concurrency(profile)
    return _count((profile or {}).get("lastMetConcurrency")) or UNMET_CONCURRENCY


def _count(value: Any) -> int | None:
    """`value` when it is an int of at least 1 as JSON stores it (not a bool); None otherwise."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def queued_profile(job: str, previous: Obj | None, message: str) -> Obj:
    """status.profile while a new profile Job (`job`, not created yet) waits for a slot of the fleet's
    profile budget (reconcile/profile.py): state Queued, why, and what the last profile measured."""
    kept = {key: previous[key] for key in MEASURED if previous and key in previous}
    return {"job": job, "state": "Queued", "message": message, **kept}


def job_outcome(job: Obj) -> tuple[str, str | None, str | None]:
    """(Running | Succeeded | Failed, when it ended, the Job controller's reason and message)."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return "Succeeded", condition.get("lastTransitionTime"), None
        if condition.get("type") == "Failed":
            text = f"{condition.get('reason', 'Failed')}: {condition.get('message', '')}".rstrip(": ")
            return "Failed", condition.get("lastTransitionTime"), text
    return "Running", None, None


def result_fields(message: str | None) -> Obj:
    """status.profile's measured fields from the runtime's result (contract/payloads.py ProfileResult,
    runtime/profiling/result.py); a result that is not one makes the profile Failed with what was read."""
    try:
        result = ProfileResult.model_validate_json(message or "")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the result"
        quoted = (message or "")[:512]
        return {"state": "Failed", "message": f"ProfileResultUnreadable: {where}: {first['msg']}: {quoted!r}"}
    fields: Obj = result.model_dump(mode="json", by_alias=True, exclude_none=True, include=RESULT_FIELDS)
    return {**fields, "ttftMs": result.slo.ttft_ms, "interTokenMs": result.slo.inter_token_ms}


def tuned_engine(profile: Obj | None) -> Obj | None:
    """The batch settings the last successful profile chose (status.profile.engine), if any."""
    engine = (profile or {}).get("engine")
    return engine if isinstance(engine, dict) else None


def _bounded(status: Obj, kept: Obj) -> Obj:
    """The status as the CRD's schema admits it: a result out of its bounds is reported (with the last
    measured fields, `kept`), not written."""
    try:
        ProfileStatus.model_validate(status)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return {
            "job": status["job"],
            "state": "Failed",
            **({"finishedAt": status["finishedAt"]} if "finishedAt" in status else {}),
            **kept,
            "message": f"ProfileResultUnreadable: {where}: {first['msg']}",
        }
    return status
