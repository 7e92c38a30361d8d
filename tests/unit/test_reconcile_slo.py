"""A profile that met spec.slo at no step (status/slo.py, reconcile/profile.py): metric SLO keeps the
target of the last profile that met the SLO, or 1, never targetInFlight's 32; the condition SLOUnmet names
the step that came closest and flips with one Event; status.sizing's replicasNeeded uses the HPA's own
per-replica target, and no load figure comes from a reading taken during KEDA's fallback."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import pytest
from fakekube import StatusWrites, owner_object

from pagoda.operator.api import InferenceServiceSpec, InferenceServiceStatus
from pagoda.operator.api.scaling import DEFAULT_TARGET_IN_FLIGHT
from pagoda.operator.reconcile import core, desired, state
from pagoda.operator.reconcile.profile import JOB_NAME_LABEL, profile_status
from pagoda.operator.resources import DEFAULT_SETTINGS
from pagoda.operator.status.changes import status_patch
from pagoda.operator.status.profile import slo_concurrency
from pagoda.operator.status.report import Observed, compute_status
from pagoda.operator.status.sizing import sizing_status
from pagoda.operator.status.slo import MAX_ERROR_RATIO, closest_step, slo_condition, slo_event, target_at_slo
from tests.unit.test_reconcile_scaling import SCALED_OBJECT, hpa
from tests.unit.test_status_contract import URL, deployment

Obj = dict[str, Any]
NOW, LATER = "2026-12-04T10:00:00Z", "2026-12-04T11:00:00Z"
SLO = {"ttftMs": 500, "interTokenMs": 50}
SPEC: Obj = {
    "model": {"uri": "hf://pagoda-test/tiny-llama"},
    "resources": {"gpu": {"count": 1}},
    "slo": SLO,
    "autoscaling": {"minReplicas": 1, "maxReplicas": 8, "metric": "SLO"},
    "monitoring": {"serviceMonitor": {"enabled": True}},
}


def step(concurrency: int, ttft: float, itl: float, errors: int = 0, requests: int = 10) -> Obj:
    meets = ttft <= SLO["ttftMs"] and itl <= SLO["interTokenMs"] and errors <= MAX_ERROR_RATIO * requests
    return {
        "concurrency": concurrency,
        "ttftP95Ms": ttft,
        "interTokenP95Ms": itl,
        "requestsPerSecond": 1.0,
        "outputTokensPerSecond": 100.0,
        "requests": requests,
        "errors": errors,
        "meetsSlo": meets,
    }


def result(concurrency: int | None, steps: list[Obj]) -> str:
    """The runtime's termination message (runtime/profiling/result.py summarize)."""
    return json.dumps(
        {
            "slo": {"ttftMs": 500.0, "interTokenMs": 50.0},
            "concurrency": concurrency,
            "requestsPerSecond": 1.0 if concurrency else None,
            "outputTokensPerSecond": 100.0 if concurrency else None,
            "steps": steps,
        }
    )


MET_10 = result(10, [step(c, 100.0 * c / 10, 20.0) for c in (1, 2, 4, 10)])
# A tighter SLO than the one 10 was measured at: even one stream misses it.
UNMET = result(None, [step(1, 640.0, 44.0), step(2, 900.0, 71.0)])
MET_3 = result(3, [step(1, 100.0, 20.0), step(3, 400.0, 40.0), step(6, 700.0, 60.0)])


class JobPods:
    """The pod list of whichever Job is asked for, its runtime terminated with `message`."""

    def __init__(self, message: str | None = None) -> None:
        self.message = message

    def list(self, api_version: str, plural: str, namespace: str, selector: str | None = None) -> list[Obj]:
        assert (selector or "").startswith(f"{JOB_NAME_LABEL}=")
        if self.message is None:
            return []
        terminated = {"exitCode": 0, "message": self.message}
        return [
            {
                "metadata": {"name": "p"},
                "status": {"containerStatuses": [{"name": "runtime", "state": {"terminated": terminated}}]},
            }
        ]


def job(name: str, condition: str | None = "Complete") -> Obj:
    conditions = [{"type": condition, "status": "True", "lastTransitionTime": NOW}] if condition else []
    return {"metadata": {"name": name}, "status": {"conditions": conditions}}


JOBS = itertools.count()


def profiled(*messages: str | None, previous: Obj | None = None) -> Obj:
    """status.profile after a new Job per message has ended with it (None: a Job that failed)."""
    for message in messages:
        outcome = "Complete" if message is not None else "Failed"
        name = f"llm-profile-{next(JOBS)}"
        previous = profile_status(
            JobPods(message or "ServerNotReady: no"), "ns", job(name, outcome), previous
        )
    assert previous is not None
    return previous


def threshold(profile: Obj | None, autoscaling: Obj | None = None) -> int:
    """The in-flight threshold of the ScaledObject the operator builds with this status.profile."""
    spec = {**SPEC, "autoscaling": {**SPEC["autoscaling"], **(autoscaling or {})}}
    owner = {**owner_object(spec), "status": {"profile": profile} if profile else {}}
    children = desired.desired_state(owner, InferenceServiceSpec.model_validate(spec), DEFAULT_SETTINGS)
    (scaled,) = [c for c in children if c["kind"] == "ScaledObject"]
    (trigger,) = [t for t in scaled["spec"]["triggers"] if t["name"] == "in-flight"]
    return int(trigger["metadata"]["threshold"])


@pytest.mark.parametrize("autoscaling", [{}, {"targetInFlight": 48}, {"sloTargetRatio": 1}])
def test_a_tighter_slo_met_at_no_step_keeps_the_last_measured_target(autoscaling: Obj) -> None:
    before = threshold(profiled(MET_10), autoscaling)
    status = profiled(MET_10, UNMET)
    assert "concurrency" not in status and status["lastMetConcurrency"] == 10
    after = threshold(status, autoscaling)
    # Not targetInFlight (its default 32, or the spec's), not above what was last measured within the SLO.
    assert after == before <= 10 and after not in (DEFAULT_TARGET_IN_FLIGHT, 48)


def test_when_no_profile_ever_met_the_slo_the_target_is_one() -> None:
    assert threshold(None) == DEFAULT_TARGET_IN_FLIGHT  # before any profile: targetInFlight holds
    unmet = profiled(UNMET)
    assert "lastMetConcurrency" not in unmet and slo_concurrency(unmet) == 1
    assert threshold(unmet) == 1 and threshold(unmet, {"targetInFlight": 6}) == 1


def test_the_kept_measurement_outlives_further_profiles_until_one_meets_the_slo() -> None:
    unmet = profiled(MET_10, UNMET)
    # A new profile running, failing, or meeting no step again: still the 10 measured before.
    running = profile_status(JobPods(), "ns", job("llm-profile-new", None), unmet)
    failed = profiled(None, previous=running)
    again = profiled(UNMET, previous=failed)
    for status in (running, failed, again):
        assert status["lastMetConcurrency"] == 10 and threshold(status) == 8, status
    # One that meets it: its own measurement, and nothing kept.
    met = profiled(MET_3, previous=again)
    assert met["concurrency"] == 3 and "lastMetConcurrency" not in met and threshold(met) == 2
    for status in (unmet, running, failed, again, met):
        InferenceServiceStatus.model_validate({"profile": status})


def test_slo_unmet_names_the_step_that_came_closest() -> None:
    status = profiled(MET_10, UNMET)
    found = slo_condition(SPEC, status)
    assert found == (
        True,
        "NoStepMetSLO",
        f"No step of the profile {status['measuredBy']} met the SLO (p95 TTFT 500 ms, p95 inter-token 50 "
        "ms); the closest, 1 concurrent request, measured p95 TTFT 640 ms and p95 inter-token 44 ms. "
        "autoscaling.metric SLO targets 8 in flight per replica, from the 10 the last profile to meet the "
        "SLO measured. Loosen spec.slo, or make one replica faster (fewer tokens per request, more GPUs)",
    )
    first = slo_condition(SPEC, profiled(UNMET))
    assert first is not None and "targets 1 in flight per replica, as no profile met it" in first[2]
    without_metric = slo_condition({**SPEC, "autoscaling": None}, status)
    assert without_metric is not None and "autoscaling.metric" not in without_metric[2]


def test_the_closest_step_weighs_each_objective_and_the_errors() -> None:
    latency = step(2, 600.0, 30.0)  # 1.2 x the TTFT objective
    failing = step(1, 100.0, 20.0, errors=2)  # within the latencies, but 20% errors: 4 x the 5% allowed
    slow = step(4, 400.0, 90.0)  # 1.8 x the inter-token objective
    assert closest_step({"steps": [failing, latency, slow], **SLO}, SLO) == latency
    assert closest_step({"steps": [failing, step(3, 3000.0, 20.0)], **SLO}, SLO) == failing  # 6 x
    unmet = {**profiled(UNMET), "steps": [failing, step(3, 3000.0, 20.0)]}
    found = slo_condition(SPEC, unmet)
    assert found is not None and "1 concurrent request, measured p95 TTFT 100 ms" in found[2]
    assert "with 2 of 10 requests failed" in found[2]


def test_slo_unmet_is_false_once_a_profile_meets_it_and_absent_before_one_measured() -> None:
    met = profiled(MET_10, UNMET, MET_3)
    assert slo_condition(SPEC, met) == (
        False,
        "SLOMet",
        f"The profile {met['measuredBy']} met the SLO at up to 3 concurrent requests per replica",
    )
    assert slo_condition(SPEC, None) is None
    assert slo_condition(SPEC, {"job": "llm-profile-0", "state": "Running"}) is None
    assert slo_condition(SPEC, {"job": "llm-profile-0", "state": "Failed", "message": "no"}) is None
    assert slo_condition({**SPEC, "slo": None}, profiled(UNMET)) is None


def status_of(
    profile: Obj, previous: Obj | None = None, now: str = NOW, scaled_object: Obj | None = None
) -> Obj:
    owner = {**owner_object(SPEC), "status": previous or {}}
    observed = Observed(
        deployment(2, 2, 2),
        url=URL,
        hpa=hpa(2, 2, "5", "350m", None),
        scaled_object=scaled_object or SCALED_OBJECT,
        profile=profile,
    )
    return compute_status(owner, observed, selector="a=b", now=now)


def slo_unmet(status: Obj) -> Obj:
    (condition,) = [c for c in status["conditions"] if c["type"] == "SLOUnmet"]
    return condition


def test_compute_status_reports_slo_unmet_as_a_condition_of_the_status_model() -> None:
    unmet = status_of(profiled(MET_10, UNMET))
    condition = slo_unmet(unmet)
    assert (condition["status"], condition["reason"], condition["observedGeneration"]) == (
        "True",
        "NoStepMetSLO",
        1,
    )
    assert [c["type"] for c in unmet["conditions"]][:4] == [
        "Ready",
        "Progressing",
        "Degraded",
        "DisruptionTolerant",
    ]
    model = InferenceServiceStatus.model_validate(unmet)
    assert model.model_dump(by_alias=True, exclude_none=True) == unmet
    # The next pass keeps the transition time; a profile that meets the SLO flips it.
    assert slo_unmet(status_of(unmet["profile"], unmet, LATER))["lastTransitionTime"] == NOW
    met = status_of(profiled(MET_3, previous=unmet["profile"]), unmet, LATER)
    assert (slo_unmet(met)["status"], slo_unmet(met)["lastTransitionTime"]) == ("False", LATER)
    # An invalid spec reads no profile: the last one stands, and so does the condition.
    owner = {**owner_object({**SPEC, "replicas": "x"}), "status": unmet}
    kept = Observed(deployment(2, 2, 2), url=URL, kept=frozenset({"profile", "sizing"}))
    assert slo_unmet(compute_status(owner, kept, selector="a=b", now=LATER)) == condition


def test_slo_event_once_per_flip() -> None:
    unmet = status_of(profiled(UNMET))
    met = status_of(profiled(MET_3, previous=unmet["profile"]), unmet, LATER)
    first_met = status_of(profiled(MET_3))
    assert slo_event({}, unmet) == ("Warning", "SLOUnmet", slo_unmet(unmet)["message"])
    assert slo_event(unmet, unmet) is None
    assert slo_event(unmet, met) == ("Normal", "SLOMet", slo_unmet(met)["message"])
    assert slo_event(met, met) is None and slo_event({}, first_met) is None
    assert slo_event(met, unmet) is not None and slo_event(unmet, {"conditions": []}) is None


def test_write_status_records_one_event_per_flip() -> None:
    kube = StatusWrites(SPEC)
    unmet = status_of(profiled(MET_10, UNMET))

    def write(previous: Obj, status: Obj) -> None:
        owner = {**owner_object(SPEC), "status": previous}
        p = state.Pass(kube, None, owner, "ns", "llm", lambda: LATER, {}, [], [])  # type: ignore[arg-type]
        core.write_status(p, status)

    write({**unmet, "conditions": unmet["conditions"][:4]}, unmet)
    write(unmet, {**unmet, "readyReplicas": 1})  # another change, the condition as it was: no Event
    met = status_of(profiled(MET_3, previous=unmet["profile"]), unmet, LATER)
    write(unmet, met)
    assert [(e["type"], e["reason"]) for e in kube.events] == [("Warning", "SLOUnmet"), ("Normal", "SLOMet")]
    assert "closest, 1 concurrent request" in kube.events[0]["message"]


@pytest.mark.parametrize("ratio", [0.5, 0.8, 1.0])
@pytest.mark.parametrize("messages", [(MET_10,), (MET_3,), (MET_10, UNMET), (UNMET,)])
@pytest.mark.parametrize("in_flight", ["1", "2.5", "7", "31"])
def test_replicas_needed_is_the_load_over_the_hpas_own_target(
    ratio: float, messages: tuple[str, ...], in_flight: str
) -> None:
    profile = profiled(*messages)
    spec = {**SPEC, "autoscaling": {**SPEC["autoscaling"], "sloTargetRatio": ratio}}
    target = threshold(profile, {"sloTargetRatio": ratio})  # what KEDA's HPA holds each replica to
    reading = {
        "currentReplicas": 2,
        "triggers": [{"name": "in-flight", "value": in_flight, "perReplica": True}],
    }
    sizing = sizing_status(spec, profile, reading, ready_replicas=2)
    assert sizing is not None and target_at_slo(spec, profile) == sizing["targetPerReplica"] == target
    load = 2 * float(in_flight)
    assert sizing["replicasNeeded"] == math.ceil(load / target)


FALLBACK = {
    **SCALED_OBJECT,
    "status": {
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "Fallback", "status": "True", "reason": "FallbackExists", "message": "falling back"},
        ]
    },
}


def test_a_reading_during_keda_fallback_is_not_load() -> None:
    status = status_of(profiled(MET_10), scaled_object=FALLBACK)
    sizing = status["sizing"]
    assert not {"inFlight", "loadPercent", "replicasNeeded"} & set(sizing), sizing
    assert sizing["capacity"] == 20 and sizing["targetPerReplica"] == 8
    assert "fallback" in sizing["message"] and "not load" in sizing["message"]
    InferenceServiceStatus.model_validate(status)
    ended = {**FALLBACK, "status": {"conditions": [{"type": "Fallback", "status": "False"}]}}
    assert status_of(profiled(MET_10), scaled_object=ended)["sizing"]["replicasNeeded"] == 2  # 10 / 8


def test_the_status_patch_removes_what_a_nested_object_no_longer_has() -> None:
    """A JSON merge patch keeps what it does not name: without a null, a Running profile's kept concurrency
    would survive the write of one that met no step (and SLOUnmet would flip back on the next pass), and a
    reading taken before KEDA's fallback would stay in status.sizing."""
    running = profile_status(JobPods(), "ns", job("llm-profile-next", None), profiled(MET_10))
    unmet = profiled(UNMET, previous=running)
    before = {"profile": running, "sizing": {"inFlight": 7.0, "capacity": 20}, "url": URL}
    after = {"profile": unmet, "sizing": {"capacity": 20, "message": "fallback"}}
    patch = status_patch(before, after)
    assert patch["profile"]["concurrency"] is None and patch["profile"]["lastMetConcurrency"] == 10
    assert patch["sizing"] == {"capacity": 20, "message": "fallback", "inFlight": None}
    assert patch["url"] is None
    stored = merge(before, patch)
    assert stored == after and slo_condition(SPEC, stored["profile"]) == slo_condition(SPEC, unmet)


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies a merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out
