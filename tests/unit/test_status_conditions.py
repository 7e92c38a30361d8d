"""Pure status computation: Ready / Progressing / Degraded and lastTransitionTime semantics."""

from __future__ import annotations

from typing import Any

from pagoda.operator.reconcile.status import Problem, compute_status, status_changed

SELECTOR = "app.kubernetes.io/name=pagoda-runtime,pagoda.dev/inferenceservice=m"
T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T00:05:00Z"


def owner(generation: int = 2, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "m", "namespace": "ns", "generation": generation}, "status": status or {}}


def deployment(
    replicas: int = 2, ready: int = 2, updated: int = 2, available: int = 2, total: int = 2, seen: bool = True
) -> dict[str, Any]:
    return {
        "metadata": {"generation": 5},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": 5 if seen else 4,
            "replicas": total,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "availableReplicas": available,
        },
    }


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def compute(own: dict[str, Any], dep: dict[str, Any] | None, problems: list[Problem], now: str = T0) -> Any:
    return compute_status(own, dep, problems, selector=SELECTOR, url="http://m.ns.svc:8000", now=now)


def test_all_ready() -> None:
    status = compute(owner(), deployment(), [])
    assert conditions(status) == {
        "Ready": ("True", "ReplicasReady"),
        "Progressing": ("False", "RolloutComplete"),
        "Degraded": ("False", "Reconciled"),
    }
    assert status["observedGeneration"] == 2
    assert all(c["observedGeneration"] == 2 for c in status["conditions"])
    assert (status["replicas"], status["readyReplicas"], status["readySummary"]) == (2, 2, "2/2")
    assert status["selector"] == SELECTOR
    assert status["url"] == "http://m.ns.svc:8000"


def test_rolling_out_and_not_ready() -> None:
    status = compute(owner(), deployment(ready=1, updated=1, available=1, total=3), [])
    assert conditions(status)["Ready"] == ("False", "ReplicasNotReady")
    assert conditions(status)["Progressing"] == ("True", "RollingOut")


def test_deployment_not_yet_observed_is_progressing() -> None:
    status = compute(owner(), deployment(seen=False), [])
    assert conditions(status)["Progressing"] == ("True", "RollingOut")


def test_no_deployment_yet() -> None:
    status = compute(owner(), None, [])
    assert conditions(status)["Ready"] == ("False", "DeploymentMissing")
    assert conditions(status)["Progressing"] == ("True", "Creating")
    assert status["readySummary"] == "0/0"


def test_problem_makes_degraded_with_every_message() -> None:
    problems = [Problem("SecretNotFound", "create hf-token"), Problem("ApiNotInstalled", "install KEDA")]
    status = compute(owner(), deployment(), problems)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "SecretNotFound")
    assert "create hf-token" in degraded["message"] and "install KEDA" in degraded["message"]
    assert conditions(status)["Ready"] == ("True", "ReplicasReady")  # what runs still serves


def test_invalid_spec_without_deployment() -> None:
    status = compute(owner(), None, [Problem("InvalidSpec", "spec.engine.dtype: bad", retry=False)])
    assert conditions(status)["Ready"] == ("False", "InvalidSpec")
    assert conditions(status)["Progressing"] == ("False", "InvalidSpec")


def test_stuck_rollout_and_replica_failure_are_degraded() -> None:
    dep = deployment(ready=0, updated=1, available=0)
    dep["status"]["conditions"] = [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}
    ]
    status = compute(owner(), dep, [])
    assert conditions(status)["Progressing"] == ("False", "ProgressDeadlineExceeded")
    assert conditions(status)["Degraded"] == ("True", "RolloutStuck")
    dep["status"]["conditions"] = [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate"}]
    assert conditions(compute(owner(), dep, []))["Degraded"] == ("True", "FailedCreate")


def test_scaled_to_zero() -> None:
    assert conditions(compute(owner(), deployment(replicas=0, ready=0), []))["Ready"] == (
        "False",
        "ScaledToZero",
    )


def test_transition_time_changes_only_when_status_flips() -> None:
    first = compute(owner(), deployment(ready=1, available=1), [], now=T0)
    # Same statuses later (different message): times are kept, and nothing to write when equal.
    second = compute(owner(status=first), deployment(ready=1, available=1, updated=1), [], now=T1)
    assert [c["lastTransitionTime"] for c in second["conditions"]] == [T0, T0, T0]
    # Ready flips: only Ready's time moves.
    third = compute(owner(status=second), deployment(), [], now=T1)
    times = {c["type"]: c["lastTransitionTime"] for c in third["conditions"]}
    assert times == {"Ready": T1, "Progressing": T1, "Degraded": T0}


def test_status_changed_only_on_real_change() -> None:
    status = compute(owner(), deployment(), [])
    again = compute(owner(status=status), deployment(), [], now=T1)
    assert not status_changed(status, again)
    assert not status_changed({**status, "kopf": {"x": 1}}, again)
    assert status_changed(status, compute(owner(status=status), deployment(ready=1), [], now=T1))
    assert status_changed(None, status)
