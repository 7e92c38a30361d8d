"""Pure status computation: Ready / Progressing / Degraded / DisruptionTolerant and lastTransitionTime
semantics."""

from __future__ import annotations

import copy
from typing import Any

from pagoda.operator.status.changes import status_changed
from pagoda.operator.status.report import Observed, Problem, compute_status

SELECTOR = "app.kubernetes.io/name=pagoda-runtime,pagoda.dev/inferenceservice=m"
T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T00:05:00Z"


def owner(
    generation: int = 2, status: dict[str, Any] | None = None, spec: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": "m", "namespace": "ns", "generation": generation},
        "spec": spec or {},
        "status": status or {},
    }


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
    return compute_status(
        own, Observed(dep, problems=problems, url="http://m.ns.svc:8000"), selector=SELECTOR, now=now
    )


def test_all_ready() -> None:
    status = compute(owner(), deployment(), [])
    assert conditions(status) == {
        "Ready": ("True", "ReplicasReady"),
        "Progressing": ("False", "RolloutComplete"),
        "Degraded": ("False", "Reconciled"),
        "DisruptionTolerant": ("True", "ReplicasKeptDuringDrain"),
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
    assert [c["lastTransitionTime"] for c in second["conditions"]] == [T0, T0, T0, T0]
    # Ready flips: only Ready's time moves.
    third = compute(owner(status=second), deployment(), [], now=T1)
    times = {c["type"]: c["lastTransitionTime"] for c in third["conditions"]}
    assert times == {"Ready": T1, "Progressing": T1, "Degraded": T0, "DisruptionTolerant": T0}


def test_status_changed_only_on_real_change() -> None:
    status = compute(owner(), deployment(), [])
    again = compute(owner(status=status), deployment(), [], now=T1)
    assert not status_changed(status, again)
    assert not status_changed({**status, "kopf": {"x": 1}}, again)
    assert status_changed(status, compute(owner(status=status), deployment(ready=1), [], now=T1))
    assert status_changed(None, status)


def crashing_pod(name: str, message: str, restarts: int = 3) -> dict[str, Any]:
    container = {
        "name": "runtime",
        "ready": False,
        "restartCount": restarts,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}},
    }
    return {"metadata": {"name": name, "namespace": "ns"}, "status": {"containerStatuses": [container]}}


DOES_NOT_FIT = (
    "ModelDoesNotFit: maxModelLen 4096 needs KV-cache space for 4096 tokens but the cache holds 1024 tokens; "
    "lower spec.engine.maxModelLen to at most 1024"
)


def test_failing_pod_makes_degraded_with_the_runtimes_reason_and_pod() -> None:
    dep = deployment(ready=0, updated=2, available=0)
    pods = [crashing_pod("m-6d9-x", DOES_NOT_FIT)]
    status = compute_status(owner(), Observed(dep, pods=pods), selector=SELECTOR, now=T0)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ModelDoesNotFit")
    assert degraded["message"].startswith("pod m-6d9-x container runtime: maxModelLen 4096 needs")
    assert "exit code 1, 3 restarts" in degraded["message"]
    # While replicas are missing, Ready carries the blocker's reason (the Reason column of kubectl get).
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ModelDoesNotFit")
    assert ready["message"] == "0/2 replicas are ready; the Degraded condition says why"
    # The same pods again: nothing to write; a new restart changes the message, not the transition time.
    again = compute_status(owner(status=status), Observed(dep, pods=pods), selector=SELECTOR, now=T1)
    assert not status_changed(status, again)
    later = [crashing_pod("m-6d9-x", DOES_NOT_FIT, restarts=4)]
    moved = compute_status(owner(status=status), Observed(dep, pods=later), selector=SELECTOR, now=T1)
    assert status_changed(status, moved)
    assert next(c for c in moved["conditions"] if c["type"] == "Degraded")["lastTransitionTime"] == T0
    # The operator's own problems come first; a stuck rollout comes after the pod's reason.
    ours = compute_status(
        owner(),
        Observed(dep, pods=pods, problems=[Problem("SecretNotFound", "x")]),
        selector=SELECTOR,
        now=T0,
    )
    assert conditions(ours)["Degraded"] == ("True", "SecretNotFound")
    dep["status"]["conditions"] = [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}
    ]
    stuck = compute_status(owner(), Observed(dep, pods=pods), selector=SELECTOR, now=T0)
    assert conditions(stuck)["Degraded"] == ("True", "ModelDoesNotFit")


def test_pod_recovers_and_degraded_clears() -> None:
    dep = deployment(ready=0, updated=2, available=0)
    failing = compute_status(
        owner(), Observed(dep, pods=[crashing_pod("p", DOES_NOT_FIT)]), selector=SELECTOR, now=T0
    )
    running = {"name": "runtime", "ready": True, "restartCount": 0, "state": {"running": {}}}
    healthy = {"metadata": {"name": "p"}, "status": {"containerStatuses": [running]}}
    status = compute_status(
        owner(status=failing), Observed(deployment(), pods=[healthy]), selector=SELECTOR, now=T1
    )
    assert conditions(status)["Degraded"] == ("False", "Reconciled")


GPU_VERDICT = (
    "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 Insufficient nvidia.com/gpu. no new "
    "claims to deallocate, preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
)
QUOTA = (
    'pods "m-557c56cb76-zvghq" is forbidden: exceeded quota: gpu, requested: requests.nvidia.com/gpu=1, '
    "used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2"
)


def pending_pod(name: str, message: str = GPU_VERDICT) -> dict[str, Any]:
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "status": {"phase": "Pending", "conditions": [cond]},
    }


def owner_with_spec(status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {**owner(status=status), "spec": {"resources": {"gpu": {"count": 1}}, "replicas": 2}}


def test_unschedulable_pod_is_the_blocker_in_ready_and_degraded() -> None:
    dep = deployment(ready=0, updated=2, available=0)
    pods = [pending_pod("m-6d9-b"), pending_pod("m-6d9-a")]
    status = compute_status(owner_with_spec(), Observed(dep, pods=pods), selector=SELECTOR, now=T0)
    assert conditions(status) == {
        "Ready": ("False", "InsufficientGPU"),
        "Progressing": ("True", "RollingOut"),
        "Degraded": ("True", "InsufficientGPU"),
        "DisruptionTolerant": ("True", "ReplicasKeptDuringDrain"),
    }
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["message"].startswith(
        "pod m-6d9-a cannot be scheduled: no node has 1 free nvidia.com/gpu"
    )
    assert "spec.resources.gpu.count" in degraded["message"]
    # Passes later with the same pods write nothing.
    again = compute_status(owner_with_spec(status), Observed(dep, pods=[*pods]), selector=SELECTOR, now=T1)
    assert not status_changed(status, again)
    # Scheduled at last: Ready's reason goes back to the replica count, Degraded clears.
    done = compute_status(owner_with_spec(status), Observed(deployment(), pods=[]), selector=SELECTOR, now=T1)
    assert conditions(done)["Ready"] == ("True", "ReplicasReady")
    assert conditions(done)["Degraded"] == ("False", "Reconciled")


def test_quota_from_the_deployments_replica_failure() -> None:
    dep = deployment(replicas=3, ready=2, updated=2, available=2, total=2)
    dep["status"]["conditions"] = [
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": QUOTA}
    ]
    status = compute_status(owner_with_spec(), Observed(dep, pods=[]), selector=SELECTOR, now=T0)
    assert conditions(status)["Degraded"] == ("True", "QuotaExceeded")
    assert conditions(status)["Ready"] == ("False", "QuotaExceeded")
    assert status["readySummary"] == "2/3"


def test_blockers_most_specific_first() -> None:
    dep = deployment(ready=0, updated=2, available=0)
    dep["status"]["conditions"] = [
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": QUOTA},
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "x"},
    ]
    crash = crashing_pod("m-z", DOES_NOT_FIT)
    pending = pending_pod("m-a")

    def degraded(pods: list[dict[str, Any]], problems: list[Problem] | None = None) -> tuple[str, str]:
        status = compute_status(
            owner_with_spec(), Observed(dep, pods=pods, problems=problems or []), selector=SELECTOR, now=T0
        )
        return conditions(status)["Degraded"]

    assert degraded([crash, pending], [Problem("SecretNotFound", "x")]) == ("True", "SecretNotFound")
    assert degraded([crash, pending]) == ("True", "ModelDoesNotFit")  # the runtime's own words
    assert degraded([pending]) == ("True", "InsufficientGPU")
    assert degraded([]) == ("True", "QuotaExceeded")
    dep["status"]["conditions"] = dep["status"]["conditions"][1:]
    assert degraded([]) == ("True", "RolloutStuck")


def disruption(replicas: int, spec: dict[str, Any]) -> tuple[str, str, str]:
    status = compute(owner(spec=spec), deployment(replicas=replicas, ready=replicas), [])
    cond = next(c for c in status["conditions"] if c["type"] == "DisruptionTolerant")
    return cond["status"], cond["reason"], cond["message"]


def test_one_replica_with_the_default_budget_is_reported_as_a_drain_outage() -> None:
    status, reason, message = disruption(1, {})
    assert (status, reason) == ("False", "DrainTakesEveryReplica")
    assert "spec.disruption.maxUnavailable 1" in message
    assert "Set spec.replicas to 2 or more" in message
    # Not Degraded: nothing is broken until a drain comes.
    full = compute(owner(), deployment(replicas=1, ready=1, updated=1, available=1, total=1), [])
    assert conditions(full)["Degraded"] == ("False", "Reconciled")


def test_an_autoscaled_service_is_told_to_raise_its_minimum() -> None:
    _, reason, message = disruption(1, {"autoscaling": {"minReplicas": 1, "maxReplicas": 3}})
    assert reason == "DrainTakesEveryReplica"
    assert "Set autoscaling.minReplicas to 2 or more" in message


def test_a_budget_below_the_replica_count_keeps_replicas_serving() -> None:
    assert disruption(3, {"disruption": {"maxUnavailable": 2}})[:2] == ("True", "ReplicasKeptDuringDrain")
    assert disruption(3, {"disruption": {"maxUnavailable": 3}})[:2] == ("False", "DrainTakesEveryReplica")


def test_a_percentage_budget_rounds_up_as_the_disruption_controller_does() -> None:
    # 50% of 1 replica rounds up to 1: the only replica may go.
    assert disruption(1, {"disruption": {"maxUnavailable": "50%"}})[1] == "DrainTakesEveryReplica"
    # 50% of 3 is 2 (rounded up): one stays.
    status, reason, message = disruption(3, {"disruption": {"maxUnavailable": "50%"}})
    assert (status, reason) == ("True", "ReplicasKeptDuringDrain")
    assert "at most 2 of 3" in message


def test_a_zero_budget_blocks_drains_and_says_so() -> None:
    status, reason, message = disruption(1, {"disruption": {"maxUnavailable": 0}})
    assert (status, reason) == ("True", "EvictionsBlocked")
    assert "waits" in message
    assert disruption(2, {"disruption": {"maxUnavailable": "0%"}})[1] == "EvictionsBlocked"


def test_no_replica_means_nothing_to_drain() -> None:
    assert disruption(0, {})[:2] == ("True", "NoReplicas")
    cond = next(c for c in compute(owner(), None, [])["conditions"] if c["type"] == "DisruptionTolerant")
    assert (cond["status"], cond["reason"]) == ("True", "NoReplicas")


# The replicas' and KEDA's reports: what one pass observed goes in; what it did not look for stands.
CAPACITY = {"kvCacheTokens": 4096, "maxModelLen": 512, "maxConcurrency": 8.0}
RESTARTS = {"next": T1, "message": "Next restart at 00:05"}
ADAPTERS = {
    "adapters": [{"name": "sql", "readyReplicas": 2, "replicas": 2, "state": "Ready"}],
    "adaptersReady": "1/1",
}
CACHE = {"nodes": [{"node": "n1", "bytes": 10, "models": []}]}
START = {"last": {"seconds": 30.0}, "typical": {"seconds": 30.0}, "recent": []}


def test_reports_observed_in_a_pass_go_into_the_status() -> None:
    observed = Observed(
        deployment(),
        capacity=CAPACITY,
        model_cache=CACHE,
        restarts=RESTARTS,
        adapters=ADAPTERS,
    )
    status = compute_status(owner(), observed, selector=SELECTOR, now=T0)
    assert status["capacity"] == CAPACITY and status["modelCache"] == CACHE
    assert status["restarts"] == RESTARTS
    assert status["adapters"] == ADAPTERS["adapters"] and status["adaptersReady"] == "1/1"


def test_reports_not_looked_for_stand_and_reports_gone_leave_the_status() -> None:
    before = {"capacity": CAPACITY, "modelCache": CACHE, "restarts": RESTARTS, "startup": START, **ADAPTERS}
    kept = frozenset({"capacity", "modelCache", "restarts", "adapters", "adaptersReady"})
    stood = compute_status(owner(status=before), Observed(deployment(), kept=kept), selector=SELECTOR, now=T0)
    assert {key: stood[key] for key in before} == before
    # Looked for and not found: gone (write_status then removes them with the merge patch), but the start-up
    # history stays, since where start-up time went outlives the replicas.
    gone = compute_status(owner(status=before), Observed(deployment()), selector=SELECTOR, now=T0)
    assert not {"capacity", "modelCache", "restarts", "adapters", "adaptersReady"} & set(gone)
    assert gone["startup"] == START
    assert status_changed(stood, gone)


def test_compute_status_is_pure() -> None:
    """The same observation gives the same status, and nothing given is changed."""
    own = owner(status={"capacity": CAPACITY})
    observed = Observed(deployment(ready=1), pods=[], problems=[Problem("SecretNotFound", "x")], url="u")
    before = copy.deepcopy((own, observed))
    first = compute_status(own, observed, selector=SELECTOR, now=T0)
    assert compute_status(own, observed, selector=SELECTOR, now=T0) == first
    assert (own, observed) == before
