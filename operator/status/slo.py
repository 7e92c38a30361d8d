"""Pure functions: what the newest capacity profile says of spec.slo, as the condition SLOUnmet, its Events,
and the in-flight target per replica at the SLO (docs/capacity.md).

A profile that met the SLO at no step (status.profile without `concurrency`) leaves metric SLO the target
of the last profile that met it, or 1 (profile.py slo_concurrency), never targetInFlight's default: a tighter
SLO must not scale later. The condition says so, with the step that came closest: its concurrency and its
p95s against the objectives it was profiled against. It is there with spec.slo once a profile has measured:
True while the newest one met the SLO at no step, False once one does.

It reads the spec as stored (camelCase), like the other conditions. No I/O.
"""

from __future__ import annotations

from typing import Any

from pagoda.operator.api.scaling import DEFAULT_SLO_TARGET_RATIO, slo_target
from pagoda.operator.api.status import SLO_UNMET
from pagoda.operator.status.profile import measured_concurrency, slo_concurrency, slo_unmet

Obj = dict[str, Any]
# The runtime's MAX_ERROR_RATIO (runtime/profiling/result.py): a step with a larger share of errored requests
# misses.
MAX_ERROR_RATIO = 0.05
UNMET_REASON = "NoStepMetSLO"
MET_REASON = "SLOMet"


def slo_target_ratio(spec: Obj) -> float:
    """spec.autoscaling.sloTargetRatio as stored, or its default when absent or not a ratio in (0, 1]."""
    ratio = (spec.get("autoscaling") or {}).get("sloTargetRatio")
    if isinstance(ratio, int | float) and not isinstance(ratio, bool) and 0 < ratio <= 1:
        return float(ratio)
    return DEFAULT_SLO_TARGET_RATIO


def target_at_slo(spec: Obj, profile: Obj | None) -> int | None:
    """In-flight requests per replica to aim for within the SLO: the target metric SLO's ScaledObject holds
    (the same slo_target of the same slo_concurrency); None before a profile has measured."""
    base = slo_concurrency(profile)
    return slo_target(base, slo_target_ratio(spec)) if base is not None else None


def _miss(step: Obj, ttft_ms: float, inter_token_ms: float) -> float:
    """How far a step is from meeting the SLO: the largest of its p95s over their objectives and its error
    share over MAX_ERROR_RATIO (at most 1: within)."""
    requests = step.get("requests") or 0
    errors = (step.get("errors") or 0) / requests / MAX_ERROR_RATIO if requests else float("inf")
    ttft = float(step.get("ttftP95Ms") or 0) / ttft_ms
    inter_token = float(step.get("interTokenP95Ms") or 0) / inter_token_ms
    return max(ttft, inter_token, errors)


def closest_step(profile: Obj, slo: Obj) -> Obj | None:
    """The step of status.profile that came closest to the SLO (the smallest `_miss`; the lowest concurrency
    of equals), against the objectives it was profiled against (else spec.slo's)."""
    ttft_ms, inter_token_ms = _objectives(profile, slo)
    steps = [step for step in profile.get("steps") or [] if isinstance(step, dict)]
    if not steps or not ttft_ms or not inter_token_ms:
        return None
    return min(steps, key=lambda s: (_miss(s, ttft_ms, inter_token_ms), int(s.get("concurrency") or 0)))


def _objectives(profile: Obj, slo: Obj) -> tuple[float, float]:
    ttft, inter_token = profile.get("ttftMs") or slo.get("ttftMs"), profile.get("interTokenMs")
    return float(ttft or 0), float(inter_token or slo.get("interTokenMs") or 0)


def _ms(value: Any) -> str:
    return f"{float(value or 0):g} ms"


def unmet_message(spec: Obj, profile: Obj) -> str:
    """SLOUnmet's message: the step that came closest against the SLO, and the target metric SLO holds."""
    slo = spec.get("slo") or {}
    ttft_ms, inter_token_ms = _objectives(profile, slo)
    text = (
        f"No step of the profile {profile.get('measuredBy')} met the SLO (p95 TTFT {_ms(ttft_ms)}, "
        f"p95 inter-token {_ms(inter_token_ms)})"
    )
    step = closest_step(profile, slo)
    if step is not None:
        concurrency = int(step.get("concurrency") or 0)
        text += (
            f"; the closest, {concurrency} concurrent request{'s' if concurrency != 1 else ''}, measured "
            f"p95 TTFT {_ms(step.get('ttftP95Ms'))} and p95 inter-token {_ms(step.get('interTokenP95Ms'))}"
        )
        if step.get("errors"):
            text += f" with {step['errors']} of {step.get('requests')} requests failed"
    if ((spec.get("autoscaling") or {}).get("metric")) == "SLO":
        target, last = target_at_slo(spec, profile), profile.get("lastMetConcurrency")
        text += f". autoscaling.metric SLO targets {target} in flight per replica, " + (
            f"from the {last} the last profile to meet the SLO measured" if last else "as no profile met it"
        )
    return f"{text}. Loosen spec.slo, or make one replica faster (fewer tokens per request, more GPUs)"


def slo_condition(spec: Obj, profile: Obj | None) -> tuple[bool, str, str] | None:
    """SLOUnmet as (status, reason, message); None without spec.slo or before a profile has measured."""
    if not spec.get("slo") or profile is None or not profile.get("measuredBy"):
        return None
    if slo_unmet(profile):
        return True, UNMET_REASON, unmet_message(spec, profile)
    return (
        False,
        MET_REASON,
        f"The profile {profile['measuredBy']} met the SLO at up to {measured_concurrency(profile)} "
        "concurrent requests per replica",
    )


def slo_event(previous: Obj, status: Obj) -> tuple[str, str, str] | None:
    """(type, reason, message) of the Event for an SLOUnmet flip between the status written before and the
    new one: Warning SLOUnmet when it becomes True (also when it first appears so), Normal SLOMet when a True
    one becomes False; None otherwise."""
    was, now = status_condition(previous, SLO_UNMET), status_condition(status, SLO_UNMET)
    if now is None or (was or {}).get("status") == now.get("status"):
        return None
    if now.get("status") == "True":
        return "Warning", SLO_UNMET, str(now.get("message") or "")
    if (was or {}).get("status") == "True":
        return "Normal", MET_REASON, str(now.get("message") or "")
    return None


def status_condition(status: Obj, type_: str) -> Obj | None:
    """The condition `type_` of an object's `status` (ours, or a child's such as KEDA's), or None."""
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)
