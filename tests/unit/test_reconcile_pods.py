"""Pure: what the pods say blocks the service (termination-message reasons, OOM, crash loops, image pulls,
startup timeouts)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pagoda.operator.status.pods import container_issue, next_startup_deadline, pods_issue, termination_reason

NOT_FOUND = (
    "ModelNotFound: model file:///models/nope: /models/nope does not exist or is not a directory "
    "(spec.model.uri); fix spec.model.uri (and spec.model.revision for hf://), or put the model there"
)


def terminated(code: int = 1, reason: str = "Error", message: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"exitCode": code, "reason": reason, "finishedAt": "2026-01-01T00:00:00Z"}
    if message is not None:
        out["message"] = message
    return out


def container(
    *,
    restarts: int = 3,
    ready: bool = False,
    waiting: str | None = "CrashLoopBackOff",
    last: dict[str, Any] | None = None,
    current: dict[str, Any] | None = None,
) -> dict[str, Any]:
    state: dict[str, Any] = {}
    if current is not None:
        state["terminated"] = current
    elif waiting is not None:
        state["waiting"] = {"reason": waiting, "message": f"{waiting} detail"}
    else:
        state["running"] = {"startedAt": "2026-01-01T00:00:00Z"}
    return {
        "name": "runtime",
        "ready": ready,
        "restartCount": restarts,
        "state": state,
        "lastState": {"terminated": last} if last is not None else {},
    }


def pod(name: str, *statuses: dict[str, Any], deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"containerStatuses": list(statuses)}}


def test_reason_comes_from_the_termination_message() -> None:
    issue = pods_issue([pod("m-7f-abc", container(last=terminated(message=NOT_FOUND)))])
    assert issue is not None
    assert issue.reason == "ModelNotFound"
    assert issue.message.startswith("pod m-7f-abc container runtime: model file:///models/nope: /models/nope")
    assert "(spec.model.uri)" in issue.message
    assert issue.message.endswith("(exit code 1, 3 restarts)")


def test_crash_without_a_message_is_a_runtime_crash_loop_with_the_log_tail() -> None:
    issue = pods_issue([pod("p", container(last=terminated(code=2)))])
    assert issue is not None and issue.reason == "RuntimeCrashLoop"
    assert "exit code 2, 3 restarts" in issue.message
    assert "kubectl logs p -c runtime --previous" in issue.message
    # FallbackToLogsOnError: the log's tail starts with a timestamp, not a reason.
    tail = "2026-01-01 00:00:01,403 INFO x\nTraceback (most recent call last):\nKeyError: 'x'"
    issue = pods_issue([pod("p", container(last=terminated(message=tail)))])
    assert issue is not None and issue.reason == "RuntimeCrashLoop"
    assert "KeyError: 'x'" in issue.message


def test_oom_killed_points_at_the_memory_limit() -> None:
    issue = pods_issue([pod("p", container(last=terminated(code=137, reason="OOMKilled")))])
    assert issue is not None and issue.reason == "OOMKilled"
    assert "raise spec.resources.memory" in issue.message
    assert "exit code 137" in issue.message
    # Just killed, not yet restarted: the current state says it.
    now = container(restarts=0, waiting=None, current=terminated(code=137, reason="OOMKilled"))
    issue = pods_issue([pod("p", now)])
    assert issue is not None and issue.reason == "OOMKilled"
    assert "0 restarts" in issue.message


def test_healthy_or_recovered_containers_are_no_issue() -> None:
    running = container(restarts=0, waiting=None)
    assert pods_issue([pod("p", running)]) is None
    # Crashed once, long ago; serving again.
    recovered = container(restarts=1, ready=True, waiting=None, last=terminated(message=NOT_FOUND))
    assert pods_issue([pod("p", recovered)]) is None
    # Still loading the model for the first time.
    assert pods_issue([pod("p", container(restarts=0, waiting="ContainerCreating"))]) is None
    assert pods_issue([pod("p")]) is None
    assert pods_issue([]) is None


def test_restarted_and_loading_again_keeps_the_last_reason() -> None:
    loading = container(restarts=2, ready=False, waiting=None, last=terminated(message=NOT_FOUND))
    issue = pods_issue([pod("p", loading)])
    assert issue is not None and issue.reason == "ModelNotFound"


def test_first_failing_pod_by_name_and_the_count_of_others() -> None:
    crash = container(last=terminated(message=NOT_FOUND))
    fine = container(restarts=0, waiting=None)
    issue = pods_issue(
        [pod("m-c", crash), pod("m-a", fine), pod("m-b", crash), pod("m-0", crash, deleting=True)]
    )
    assert issue is not None
    assert issue.message.startswith("pod m-b container runtime:")
    assert issue.message.endswith("(1 more pod failing)")
    issue = pods_issue([pod("m-c", crash), pod("m-d", crash), pod("m-b", crash)])
    assert issue is not None and issue.message.endswith("(2 more pods failing)")


def test_container_that_cannot_start_keeps_the_kubelets_reason() -> None:
    issue = container_issue("p", container(restarts=0, waiting="ImagePullBackOff"))
    assert issue is not None and issue.reason == "ImagePullBackOff"
    assert "spec.runtime.image" in issue.message and "pod p container runtime" in issue.message
    issue = container_issue("p", container(restarts=0, waiting="CreateContainerConfigError"))
    assert issue is not None and issue.reason == "CreateContainerConfigError"


def test_termination_reason_needs_a_camel_case_word_and_a_colon() -> None:
    assert termination_reason("ModelDoesNotFit: maxModelLen 4096 ...") == (
        "ModelDoesNotFit",
        "maxModelLen 4096 ...",
    )
    assert termination_reason("2026-01-01 22:45:21,403 INFO x") == (None, "2026-01-01 22:45:21,403 INFO x")
    assert termination_reason("Traceback (most recent call last):")[0] is None
    assert termination_reason("lowercase: no")[0] is None
    assert termination_reason("")[0] is None


PROBE = {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 10, "failureThreshold": 180}
NOW = datetime(2026, 1, 1, 1, 0, 0, tzinfo=UTC)


def with_probe(p: dict[str, Any], probe: dict[str, Any] | None = None, grace: int = 140) -> dict[str, Any]:
    containers = [{"name": "runtime", "startupProbe": probe or PROBE}]
    return {**p, "spec": {"containers": containers, "terminationGracePeriodSeconds": grace}}


def loading(started: str, restarts: int = 0, last: dict[str, Any] | None = None) -> dict[str, Any]:
    status = container(restarts=restarts, waiting=None, last=last)
    status["state"] = {"running": {"startedAt": started}}
    status["started"] = False
    return status


def stopped(ran_seconds: int, code: int = 0, message: str | None = None) -> dict[str, Any]:
    began = datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC)
    out = terminated(code=code, reason="Completed" if code == 0 else "Error", message=message)
    out["startedAt"] = began.strftime("%Y-%m-%dT%H:%M:%SZ")
    out["finishedAt"] = (began + timedelta(seconds=ran_seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return out


def test_still_loading_past_the_startup_budget() -> None:
    # Started 1801 s ago, budget 180 x 10 s: StartupTimeout, naming the budget and the field.
    issue = pods_issue([with_probe(pod("p", loading("2026-01-01T00:29:59Z")))], NOW)
    assert issue is not None and issue.reason == "StartupTimeout"
    assert issue.message == (
        "pod p container runtime did not become ready within its startup budget of 1800s, so the kubelet "
        "restarts it (0 restarts); raise spec.runtime.startupTimeoutSeconds, or make loading faster (a "
        "persistent spec.model.cache keeps downloaded weights)"
    )
    # Within the budget, without `now`, without a probe, or once the probe passed: still loading, no issue.
    assert pods_issue([with_probe(pod("p", loading("2026-01-01T00:30:01Z")))], NOW) is None
    assert pods_issue([with_probe(pod("p", loading("2026-01-01T00:29:59Z")))]) is None
    assert pods_issue([pod("p", loading("2026-01-01T00:29:59Z"))], NOW) is None
    started = {**loading("2026-01-01T00:29:59Z"), "started": True}
    assert pods_issue([with_probe(pod("p", started))], NOW) is None
    # initialDelaySeconds counts: 600 + 180 x 10 = 2400 s.
    delayed = with_probe(pod("p", loading("2026-01-01T00:29:59Z")), {**PROBE, "initialDelaySeconds": 600})
    assert pods_issue([delayed], NOW) is None


def test_next_pass_is_due_when_a_loading_replica_runs_out_of_budget() -> None:
    # Started 1000 s before NOW with a 1800 s budget: StartupTimeout applies in 800 s (+1 s past the edge),
    # so the operator looks again then, not at the next resync.
    young = with_probe(pod("a", loading("2026-01-01T00:43:20Z")))
    old = with_probe(pod("b", loading("2026-01-01T00:41:40Z")))  # 1100 s of loading: 700 s left
    assert next_startup_deadline([young], NOW) == 801.0
    assert next_startup_deadline([young, old], NOW) == 701.0
    # Past the budget (already StartupTimeout), no probe, loaded, or being deleted: nothing to wait for.
    assert next_startup_deadline([with_probe(pod("p", loading("2026-01-01T00:29:59Z")))], NOW) is None
    assert next_startup_deadline([pod("p", loading("2026-01-01T00:43:20Z"))], NOW) is None
    started = {**loading("2026-01-01T00:43:20Z"), "started": True}
    assert next_startup_deadline([with_probe(pod("p", started))], NOW) is None
    deleting = with_probe(pod("p", loading("2026-01-01T00:43:20Z"), deleting=True))
    assert next_startup_deadline([deleting], NOW) is None


def test_restarted_by_the_startup_probe() -> None:
    # The kubelet stopped it at about the budget; the runtime, stopped while loading, exits 0 with no reason.
    for ran, code in ((1791, 0), (1800, 0), (1930, 137), (1795, 143)):
        p = with_probe(pod("p", loading("2026-01-01T00:59:00Z", restarts=1, last=stopped(ran, code))))
        issue = pods_issue([p], NOW)
        assert issue is not None and issue.reason == "StartupTimeout", (ran, code)
        assert f"exit code {code}, 1 restart)" in issue.message
        assert "spec.runtime.startupTimeoutSeconds" in issue.message
    # In CrashLoopBackOff after several such restarts.
    backoff = container(restarts=4, last=stopped(1800))
    issue = pods_issue([with_probe(pod("p", backoff))], NOW)
    assert issue is not None and issue.reason == "StartupTimeout" and "4 restarts" in issue.message


def test_a_startup_timeout_names_the_phase_the_runtime_was_in() -> None:
    """The runtime stopped while loading says where its time went (runtime/serving/termination.py)."""
    said = (
        "StoppedWhileLoading: stopped 1799s after the process started, in start-up phase modelFetch for "
        "1780s (done before it: imports 19.0s)"
    )
    p = with_probe(pod("p", loading("2026-01-01T00:59:00Z", restarts=1, last=stopped(1800, 0, said))))
    issue = pods_issue([p], NOW)
    assert issue is not None and issue.reason == "StartupTimeout"
    assert (
        "restarts it (exit code 0, 1 restart); the runtime stopped 1799s after the process started, in "
        "start-up phase modelFetch for 1780s (done before it: imports 19.0s); raise "
        "spec.runtime.startupTimeoutSeconds"
    ) in issue.message
    # Stopped long before the budget (not the probe's doing): the runtime's own word, as any reason.
    early = with_probe(pod("p", loading("2026-01-01T00:59:00Z", restarts=1, last=stopped(30, 0, said))))
    issue = pods_issue([early], NOW)
    assert issue is not None and issue.reason == "StoppedWhileLoading" and "phase modelFetch" in issue.message


def test_other_exits_are_not_startup_timeouts() -> None:
    cases = [
        stopped(1800, code=1, message=NOT_FOUND),  # the runtime's own reason wins
        stopped(1800, code=1),  # a crash (exit 1) at that age is a crash
        stopped(30),  # far too early for the probe
        stopped(7200),  # served, then was stopped (a liveness restart)
    ]
    expected = ["ModelNotFound", "RuntimeCrashLoop", "RuntimeCrashLoop", "RuntimeCrashLoop"]
    for last, reason in zip(cases, expected, strict=True):
        p = with_probe(pod("p", loading("2026-01-01T00:59:00Z", restarts=1, last=last)))
        issue = pods_issue([p], NOW)
        assert issue is not None and issue.reason == reason, last
    oom = stopped(1800, code=137)
    oom["reason"] = "OOMKilled"
    issue = pods_issue([with_probe(pod("p", container(last=oom)))], NOW)
    assert issue is not None and issue.reason == "OOMKilled"
