"""status.profile (status/profile.py, read by reconcile/profile.py): Running until the Job ends, then the
result from the runtime's termination message (read once), or Failed with the reason."""

from __future__ import annotations

import json
from typing import Any

from pagoda.operator.reconcile.profile import JOB_NAME_LABEL, profile_status
from pagoda.operator.status.profile import measured_concurrency, tuned_engine

Obj = dict[str, Any]
JOB = "llm-profile-0123456789"
RESULT = {
    "slo": {"ttftMs": 500.0, "interTokenMs": 50.0},
    "shape": {"promptTokens": 64, "outputTokens": 16},
    "concurrency": 2,
    "requestsPerSecond": 3.2,
    "outputTokensPerSecond": 51.0,
    "steps": [
        {
            "concurrency": c,
            "ttftP95Ms": t,
            "interTokenP95Ms": 20.0,
            "requestsPerSecond": 1.5 * c,
            "outputTokensPerSecond": 25.0 * c,
            "requests": 10,
            "errors": 0,
            "meetsSlo": t <= 500,
        }
        for c, t in ((1, 120.0), (2, 300.0), (4, 900.0))
    ],
}


class Pods:
    """The API server's pod list, as Kube.list answers it; counts the calls."""

    def __init__(self, pods: list[Obj]) -> None:
        self.pods = pods
        self.calls: list[tuple[str, str]] = []

    def list(self, api_version: str, plural: str, namespace: str, selector: str | None = None) -> list[Obj]:
        self.calls.append((plural, selector or ""))
        assert selector == f"{JOB_NAME_LABEL}={JOB}"
        return self.pods


def job(condition: str | None = None, reason: str = "", message: str = "") -> Obj:
    conditions = []
    if condition:
        conditions.append(
            {
                "type": condition,
                "status": "True",
                "reason": reason,
                "message": message,
                "lastTransitionTime": "2026-12-04T10:00:00Z",
            }
        )
    return {"metadata": {"name": JOB}, "status": {"conditions": conditions}}


def pod(message: str | None, created: str = "2026-12-04T09:00:00Z", container: str = "runtime") -> Obj:
    terminated = {"exitCode": 0, **({"message": message} if message is not None else {})}
    return {
        "metadata": {"name": "p", "creationTimestamp": created},
        "status": {"containerStatuses": [{"name": container, "state": {"terminated": terminated}}]},
    }


def test_no_job_no_profile() -> None:
    assert profile_status(Pods([]), "ns", None, {"job": JOB, "state": "Running"}) is None


def test_running_until_the_job_ends_without_reading_pods() -> None:
    pods = Pods([pod(json.dumps(RESULT))])
    assert profile_status(pods, "ns", job(), None) == {"job": JOB, "state": "Running"}
    assert pods.calls == []


def test_a_finished_profile_reports_the_runtimes_result() -> None:
    pods = Pods([pod(json.dumps(RESULT))])
    status = profile_status(pods, "ns", job("Complete"), {"job": JOB, "state": "Running"})
    assert status is not None
    assert status["state"] == "Succeeded" and status["concurrency"] == 2
    assert status["requestsPerSecond"] == 3.2 and status["outputTokensPerSecond"] == 51.0
    assert status["ttftMs"] == 500.0 and status["interTokenMs"] == 50.0
    assert [s["concurrency"] for s in status["steps"]] == [1, 2, 4]
    assert status["finishedAt"] == "2026-12-04T10:00:00Z"


def test_read_once_then_kept() -> None:
    pods = Pods([pod(json.dumps(RESULT))])
    first = profile_status(pods, "ns", job("Complete"), None)
    again = profile_status(pods, "ns", job("Complete"), first)
    assert again == first and len(pods.calls) == 1


def test_a_new_profile_keeps_the_last_measurement_until_it_succeeds() -> None:
    old = {
        "job": "llm-profile-old",
        "state": "Succeeded",
        "concurrency": 8,
        "ttftMs": 400.0,
        "interTokenMs": 40.0,
        "measuredBy": "llm-profile-old",
        "finishedAt": "2026-12-03T10:00:00Z",
    }
    measured = {k: v for k, v in old.items() if k not in ("job", "state", "finishedAt")}
    running = profile_status(Pods([]), "ns", job(), old)
    assert running == {"job": JOB, "state": "Running", **measured}
    failed = profile_status(
        Pods([pod("ServerNotReady: no")]), "ns", job("Failed", "BackoffLimitExceeded"), running
    )
    assert failed is not None and failed["state"] == "Failed" and failed["concurrency"] == 8
    assert failed["measuredBy"] == "llm-profile-old" and failed["message"] == "ServerNotReady: no"
    done = profile_status(Pods([pod(json.dumps(RESULT))]), "ns", job("Complete"), running)
    assert done is not None and done["concurrency"] == 2 and done["measuredBy"] == JOB
    assert done["ttftMs"] == 500.0 and done["measuredAt"] == "2026-12-04T10:00:00Z"


def test_a_success_without_a_passing_step_drops_the_old_concurrency() -> None:
    old = {"job": "llm-profile-old", "state": "Succeeded", "concurrency": 8, "measuredBy": "llm-profile-old"}
    result = {**RESULT, "concurrency": None, "requestsPerSecond": None, "outputTokensPerSecond": None}
    status = profile_status(Pods([pod(json.dumps(result))]), "ns", job("Complete"), old)
    assert status is not None and "concurrency" not in status and status["measuredBy"] == JOB
    assert measured_concurrency(status) is None and measured_concurrency(old) == 8


def test_no_step_meets_the_slo() -> None:
    result = {**RESULT, "concurrency": None, "requestsPerSecond": None, "outputTokensPerSecond": None}
    status = profile_status(Pods([pod(json.dumps(result))]), "ns", job("Complete"), None)
    assert status is not None and status["state"] == "Succeeded"
    assert "concurrency" not in status and len(status["steps"]) == 3


def test_a_failed_profile_says_why_from_the_runtime() -> None:
    pods = Pods([pod("ServerNotReady: the runtime exited with status 1 before it was ready")])
    status = profile_status(
        pods, "ns", job("Failed", "BackoffLimitExceeded", "Job has reached the limit"), None
    )
    assert status is not None and status["state"] == "Failed"
    assert status["message"].startswith("ServerNotReady: the runtime exited")


def test_a_deadline_without_a_message_says_the_job_controllers_reason() -> None:
    pods = Pods([pod(None)])
    status = profile_status(pods, "ns", job("Failed", "DeadlineExceeded", "Job was active longer"), None)
    assert status is not None and status["message"] == "DeadlineExceeded: Job was active longer"


def test_an_unreadable_result_fails_the_profile_and_quotes_it() -> None:
    for message in ("not json", json.dumps([1, 2]), json.dumps({"concurrency": 2})):
        status = profile_status(Pods([pod(message)]), "ns", job("Complete"), None)
        assert status is not None and status["state"] == "Failed", message
        assert status["message"].startswith("ProfileResultUnreadable: ")


def test_a_result_out_of_the_schemas_bounds_is_not_written() -> None:
    result = {**RESULT, "concurrency": -1}
    status = profile_status(Pods([pod(json.dumps(result))]), "ns", job("Complete"), None)
    assert status is not None and status["state"] == "Failed"
    assert status["message"].startswith("ProfileResultUnreadable: concurrency")


def test_the_newest_pod_with_a_message_wins() -> None:
    older = pod("ServerNotReady: old", created="2026-12-04T08:00:00Z")
    newer = pod(json.dumps(RESULT), created="2026-12-04T09:00:00Z")
    sidecar = pod("something else", created="2026-12-04T09:30:00Z", container="other")
    status = profile_status(Pods([older, sidecar, newer]), "ns", job("Complete"), None)
    assert status is not None and status["state"] == "Succeeded"


ENGINE = {
    "maxNumBatchedTokens": 1024,
    "maxNumSeqs": None,
    "goodput": 3.2,
    "baselineGoodput": 2.5,
    "candidates": [
        {"maxNumBatchedTokens": None, "maxNumSeqs": None, "concurrency": 2, "requestsPerSecond": 2.5},
        {"maxNumBatchedTokens": 1024, "maxNumSeqs": None, "concurrency": 2, "requestsPerSecond": 3.2},
        {"maxNumBatchedTokens": 512, "maxNumSeqs": None, "concurrency": None, "requestsPerSecond": None},
    ],
}


def test_the_engine_choice_is_copied_without_its_nulls_and_kept_until_the_next_success() -> None:
    tuned = profile_status(Pods([pod(json.dumps({**RESULT, "engine": ENGINE}))]), "ns", job("Complete"), None)
    assert tuned is not None and tuned["state"] == "Succeeded"
    assert tuned["engine"] == {
        "maxNumBatchedTokens": 1024,
        "goodput": 3.2,
        "baselineGoodput": 2.5,
        "candidates": [
            {"concurrency": 2, "requestsPerSecond": 2.5},
            {"maxNumBatchedTokens": 1024, "concurrency": 2, "requestsPerSecond": 3.2},
            {"maxNumBatchedTokens": 512},
        ],
    }
    assert tuned_engine(tuned) == tuned["engine"] and tuned_engine(None) is None
    # A new profile (the spec changed) leaves the replicas the choice they run until it succeeds.
    running = profile_status(Pods([]), "ns", {**job(), "metadata": {"name": "llm-profile-new"}}, tuned)
    assert running is not None and running["state"] == "Running" and running["engine"] == tuned["engine"]
    # One without tuning (tuneEngine turned off) measures no choice: the replicas go back to the spec's.
    plain = profile_status(Pods([pod(json.dumps(RESULT))]), "ns", job("Complete"), running)
    assert plain is not None and "engine" not in plain and tuned_engine(plain) is None


def test_more_candidates_than_a_profile_runs_are_not_written() -> None:
    many = {**ENGINE, "candidates": ENGINE["candidates"] * 3}
    status = profile_status(Pods([pod(json.dumps({**RESULT, "engine": many}))]), "ns", job("Complete"), None)
    assert status is not None and status["state"] == "Failed" and "engine" not in status
    assert status["message"].startswith("ProfileResultUnreadable: engine.candidates:"), status["message"]
