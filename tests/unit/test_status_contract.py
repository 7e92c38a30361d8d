"""The status the operator computes is one the API's status model (and so the CRD's schema) accepts, field
for field: the two cannot drift apart."""

from __future__ import annotations

from typing import Any

import pytest

from pagoda.operator.api import CONDITION_TYPES, InferenceServiceStatus, RestartSchedule
from pagoda.operator.kube.capacity import CapacityReader
from pagoda.operator.reconcile.restarts import plan as restart_plan
from pagoda.operator.resources.meta import RESTART_SCHEDULE_SINCE_ANNOTATION, RESTARTED_AT_ANNOTATION
from pagoda.operator.status.report import Observed, Problem, compute_status
from pagoda.operator.status.scaling import autoscaling_status
from tests.unit.test_reconcile_scaling import SCALED_OBJECT, hpa

NOW = "2026-01-01T00:00:00Z"
OWNER = {"metadata": {"name": "m", "namespace": "ns", "generation": 3}}
URL = "http://m.ns.svc:8000"


def deployment(replicas: int, ready: int, updated: int, generation_seen: int = 7) -> dict[str, Any]:
    return {
        "metadata": {"generation": 7},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": generation_seen,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "availableReplicas": ready,
        },
    }


def crashing_pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "m-1"},
        "status": {
            "containerStatuses": [
                {
                    "name": "runtime",
                    "restartCount": 3,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 1, "message": "ModelNotFound: no such model"}},
                }
            ]
        },
    }


CASES: dict[str, dict[str, Any]] = {
    "ready": {"deployment": deployment(2, 2, 2), "url": URL},
    "rolling-out": {"deployment": deployment(3, 1, 1, generation_seen=6), "url": URL},
    "scaled-to-zero": {"deployment": deployment(0, 0, 0), "url": URL},
    "degraded-by-a-problem": {
        "deployment": deployment(2, 2, 2),
        "problems": [Problem("SecretNotFound", "create hf-token")],
        "url": URL,
    },
    "degraded-by-a-pod": {"deployment": deployment(1, 0, 1), "pods": [crashing_pod()], "url": URL},
    "invalid-spec-without-url": {"deployment": None, "problems": [Problem("InvalidSpec", "fix it", False)]},
    "not-created-yet": {"deployment": None, "url": URL},
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_computed_status_is_valid_for_the_status_model(case: dict[str, Any]) -> None:
    observed = Observed(
        case["deployment"],
        pods=case.get("pods") or [],
        problems=case.get("problems", []),
        url=case.get("url"),
    )
    status = compute_status(
        OWNER,
        observed,
        selector="app.kubernetes.io/name=pagoda-runtime,pagoda.dev/inferenceservice=m",
        now=NOW,
    )
    model = InferenceServiceStatus.model_validate(status)  # unknown or mistyped fields fail here
    assert model.model_dump(by_alias=True, exclude_none=True) == status  # and nothing is lost or renamed
    assert tuple(condition["type"] for condition in status["conditions"]) == CONDITION_TYPES


def test_a_pod_issue_reaches_the_status_model() -> None:
    """The pod case above really is Degraded by the pod (so the model sees a pod-made message)."""
    case = CASES["degraded-by-a-pod"]
    status = compute_status(
        OWNER, Observed(case["deployment"], pods=case["pods"], url=URL), selector="s", now=NOW
    )
    degraded = InferenceServiceStatus.model_validate(status).conditions[2]
    assert (degraded.type, degraded.status, degraded.reason) == ("Degraded", "True", "ModelNotFound")


def test_autoscaling_and_capacity_fields_fit_the_status_model() -> None:
    before = autoscaling_status(hpa(1, 1, "0", "0", None), SCALED_OBJECT, None)
    answer = {"kvCacheTokens": 131072, "maxModelLen": 2048, "maxConcurrency": 64.0, "blockSize": 128}
    pod = {
        "metadata": {"uid": "u1"},
        "status": {"podIP": "10.244.128.2", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    observed = Observed(
        deployment(3, 3, 3),
        url=URL,
        hpa=hpa(1, 3, "14", "350m", NOW),
        scaled_object=SCALED_OBJECT,
        capacity=CapacityReader(lambda url, timeout: answer).status([pod]),
    )
    status = compute_status({**OWNER, "status": {"autoscaling": before}}, observed, selector="a=b", now=NOW)
    assert {"autoscaling", "capacity"} <= set(status)
    model = InferenceServiceStatus.model_validate(status)
    assert model.model_dump(by_alias=True, exclude_none=True) == status


def test_restarts_fit_the_status_model() -> None:
    """status.restarts with every field: a due restart postponed by a rollout, after an earlier one."""
    rolling = deployment(3, 1, 1, generation_seen=6)
    rolling["spec"]["template"] = {
        "metadata": {"annotations": {RESTARTED_AT_ANNOTATION: "2025-12-31T00:00:00Z"}}
    }
    rolling["metadata"]["annotations"] = {RESTART_SCHEDULE_SINCE_ANNOTATION: "2025-12-30T00:00:00Z"}
    owner = {**OWNER, "spec": {"restartSchedule": {"every": "12h"}}}
    restarts = restart_plan(RestartSchedule(every="12h"), rolling, NOW).status()
    status = compute_status(owner, Observed(rolling, url=URL, restarts=restarts), selector="a=b", now=NOW)
    assert set(status["restarts"]) == {"last", "next", "message"}
    model = InferenceServiceStatus.model_validate(status)
    assert model.model_dump(by_alias=True, exclude_none=True) == status
