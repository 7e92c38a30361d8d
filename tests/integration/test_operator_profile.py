"""spec.slo against a real API server and controller manager: the operator starts the capacity profile
Job, reports it Running, copies the result into status.profile when the Job completes, runs a new Job when
the SLO changes (deleting the old one) and removes both when spec.slo goes.

Tier 2 has no kubelet that runs the runtime (the real profile runs in e2e/test_capacity_profile.py): here the
pod's end is written into its status as the kubelet would write it (the container terminated with the
runtime's result as its termination message), and the real Job controller turns that into the Job's
Complete condition. The services' pods select a node no one has (UNBOUND), so they stay unscheduled and
kwok never plays its stages on them: its pod-complete stage ends a Job's pod by itself, without a
termination message, and when that raced the test's own end (a CI run, with tier 3 beside it), the operator
read the Job's end before the message and reported the profile unreadable."""

from __future__ import annotations

import json
import time
from typing import Any

from harness import OperatorProcess, wait_until
from isvc import condition, get, patch
from isvc import create as create_service
from kubernetes import client

from pagoda.operator.kube.client import Kube
from pagoda.operator.reconcile.profile import JOB_NAME_LABEL
from pagoda.operator.resources.meta import OWNER_LABEL
from pagoda.operator.resources.profile import PROFILE_REQUEST_ANNOTATION

SLO = {"ttftMs": 500, "interTokenMs": 50, "profile": {"streams": [1, 2], "stepSeconds": 5}}
RESULT = {
    "slo": {"ttftMs": 500.0, "interTokenMs": 50.0},
    "shape": {"promptTokens": 256, "outputTokens": 128},
    "concurrency": 1,
    "requestsPerSecond": 0.8,
    "outputTokensPerSecond": 102.4,
    "steps": [
        {
            "concurrency": 1,
            "ttftP95Ms": 210.0,
            "interTokenP95Ms": 31.0,
            "requestsPerSecond": 0.8,
            "outputTokensPerSecond": 102.4,
            "requests": 4,
            "errors": 0,
            "meetsSlo": True,
        },
        {
            "concurrency": 2,
            "ttftP95Ms": 640.0,
            "interTokenP95Ms": 44.0,
            "requestsPerSecond": 1.1,
            "outputTokensPerSecond": 140.8,
            "requests": 6,
            "errors": 0,
            "meetsSlo": False,
        },
    ],
}


UNBOUND = {"nodeSelector": {"pagoda.dev/test-node": "none"}}  # no node has it: the pods are never bound


def create(api: client.CustomObjectsApi, name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """The InferenceService, its pods (the replicas' and the profile Job's) never bound to a node."""
    return create_service(api, name, namespace, scheduling=UNBOUND, **spec)


def jobs(raw: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    return raw.list("batch/v1", "jobs", namespace, f"{OWNER_LABEL}={name}")


def profile(kube: client.CustomObjectsApi, name: str, namespace: str) -> dict[str, Any]:
    return ((get(kube, name, namespace) or {}).get("status") or {}).get("profile") or {}


def one_job(raw: Kube, namespace: str, name: str, other_than: str | None = None) -> dict[str, Any]:
    found: list[dict[str, Any]] = wait_until(
        lambda: [j for j in jobs(raw, namespace, name) if j["metadata"]["name"] != other_than],
        "the profile Job",
        60,
    )
    assert len(found) == 1, [j["metadata"]["name"] for j in found]
    return found[0]


def end_pod_as_the_kubelet_would(
    core: client.CoreV1Api, namespace: str, job: str, message: str, exit_code: int = 0
) -> None:
    """The Job's pod ends, its runtime container terminated with `message` as its termination message."""
    pod = wait_until(
        lambda: core.list_namespaced_pod(namespace, label_selector=f"{JOB_NAME_LABEL}={job}").items,
        "the Job controller's pod",
        60,
    )[0]
    now = "2026-12-04T12:00:00Z"
    terminated = {
        "exitCode": exit_code,
        "reason": "Error" if exit_code else "Completed",
        "message": message,
        "startedAt": now,
        "finishedAt": now,
    }
    container = {
        "name": "runtime",
        "image": pod.spec.containers[0].image,
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {"terminated": terminated},
    }
    status = {
        "phase": "Failed" if exit_code else "Succeeded",
        "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted"}],
        "containerStatuses": [container],
    }
    core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": status})


def test_profile_job_lifecycle(
    operator: OperatorProcess, kube: client.CustomObjectsApi, cluster_api: Any, raw: Kube, namespace: str
) -> None:
    core = client.CoreV1Api(cluster_api)
    create(kube, "slo", namespace, replicas=1, slo=SLO)
    job = one_job(raw, namespace, "slo")
    name = job["metadata"]["name"]
    assert (
        name.startswith("slo-profile-")
        and job["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"
    )
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "profile" and args[args.index("--streams") + 1] == "1,2"
    wait_until(lambda: profile(kube, "slo", namespace) == {"job": name, "state": "Running"}, "Running", 60)
    # The profile pod is no replica: the Deployment's pods are the only ones the status counts.
    assert get(kube, "slo", namespace)["status"]["readySummary"].endswith("/1")

    end_pod_as_the_kubelet_would(core, namespace, name, json.dumps(RESULT))
    done = wait_until(
        lambda: (p := profile(kube, "slo", namespace)).get("state") == "Succeeded" and p, "Succeeded", 90
    )
    assert done["job"] == name and done["concurrency"] == 1 and done["outputTokensPerSecond"] == 102.4
    assert done["ttftMs"] == 500 and [s["meetsSlo"] for s in done["steps"]] == [True, False]
    assert done.get("finishedAt")

    # A new SLO: a new Job, the old one deleted, the status Running again.
    patch(kube, "slo", namespace, {"slo": {**SLO, "ttftMs": 700}})
    second = one_job(raw, namespace, "slo", other_than=name)["metadata"]["name"]
    wait_until(
        lambda: [j["metadata"]["name"] for j in jobs(raw, namespace, "slo")] == [second], "old gone", 60
    )
    wait_until(lambda: profile(kube, "slo", namespace).get("job") == second, "the new Job reported", 60)

    # On request: a new annotation value, a new Job.
    kube.patch_namespaced_custom_object(
        "pagoda.dev",
        "v1alpha1",
        namespace,
        "inferenceservices",
        "slo",
        {"metadata": {"annotations": {PROFILE_REQUEST_ANNOTATION: "again"}}},
    )
    third = one_job(raw, namespace, "slo", other_than=second)["metadata"]["name"]
    assert third != name

    # No SLO: no Job, no status.profile.
    patch(kube, "slo", namespace, {"slo": None})
    wait_until(lambda: not jobs(raw, namespace, "slo"), "no profile Job", 60)
    wait_until(
        lambda: "profile" not in (get(kube, "slo", namespace) or {}).get("status", {}), "no profile", 60
    )


def test_a_failed_profile_is_reported_with_the_runtimes_reason(
    operator: OperatorProcess, kube: client.CustomObjectsApi, cluster_api: Any, raw: Kube, namespace: str
) -> None:
    core = client.CoreV1Api(cluster_api)
    create(kube, "slofail", namespace, replicas=1, slo=SLO)
    name = one_job(raw, namespace, "slofail")["metadata"]["name"]
    end_pod_as_the_kubelet_would(
        core, namespace, name, "ServerNotReady: the runtime exited with status 1", exit_code=1
    )
    failed = wait_until(
        lambda: (p := profile(kube, "slofail", namespace)).get("state") == "Failed" and p, "Failed", 90
    )
    assert failed["message"] == "ServerNotReady: the runtime exited with status 1"
    assert "concurrency" not in failed


def test_metric_slo_scales_at_a_share_of_the_measured_concurrency(
    operator: OperatorProcess, kube: client.CustomObjectsApi, cluster_api: Any, raw: Kube, namespace: str
) -> None:
    """Before a profile: targetInFlight; after one that measured 5 within the SLO: 0.8 x 5 = 4; while a new
    profile (a tighter SLO) runs, still 4; when it meets the SLO at no step, still 4 (not targetInFlight),
    with the condition SLOUnmet and its Event; a later profile that measures 3 within it: 0.8 x 3 = 2, and
    SLOUnmet turns False."""
    core = client.CoreV1Api(cluster_api)
    autoscaling = {"minReplicas": 1, "maxReplicas": 3, "metric": "SLO", "targetInFlight": 6}
    create(
        kube,
        "sloscale",
        namespace,
        replicas=None,
        autoscaling=autoscaling,
        monitoring={"serviceMonitor": {"enabled": True}},
        slo=SLO,
    )

    def threshold() -> str | None:
        scaled = raw.get("keda.sh/v1alpha1", "scaledobjects", namespace, "sloscale")
        return scaled["spec"]["triggers"][0]["metadata"]["threshold"] if scaled else None

    wait_until(lambda: threshold() == "6", "the fallback target before a profile", 60)
    name = one_job(raw, namespace, "sloscale")["metadata"]["name"]
    end_pod_as_the_kubelet_would(core, namespace, name, json.dumps({**RESULT, "concurrency": 5}))
    wait_until(lambda: threshold() == "4", "0.8 of the measured 5", 90)
    patch(kube, "sloscale", namespace, {"slo": {**SLO, "ttftMs": 200}})
    second = one_job(raw, namespace, "sloscale", other_than=name)["metadata"]["name"]
    wait_until(lambda: profile(kube, "sloscale", namespace).get("job") == second, "the new Job reported", 60)
    running = profile(kube, "sloscale", namespace)
    assert running["state"] == "Running" and running["measuredBy"] == name and running["concurrency"] == 5
    assert threshold() == "4"

    # The tighter SLO is met at no step: the target stays 4, and the service says so.
    unmet = {
        **RESULT,
        "slo": {"ttftMs": 200.0, "interTokenMs": 50.0},
        "concurrency": None,
        "requestsPerSecond": None,
        "outputTokensPerSecond": None,
        "steps": [{**s, "meetsSlo": False} for s in RESULT["steps"]],
    }
    end_pod_as_the_kubelet_would(core, namespace, second, json.dumps(unmet))
    flagged = wait_until(
        lambda: (
            condition(get(kube, "sloscale", namespace), "SLOUnmet").get("status") == "True"
            and get(kube, "sloscale", namespace)
        ),
        "SLOUnmet",
        90,
    )
    status = flagged["status"]
    assert status["profile"]["lastMetConcurrency"] == 5 and "concurrency" not in status["profile"]
    message = condition(flagged, "SLOUnmet")["message"]
    assert "the closest, 1 concurrent request, measured p95 TTFT 210 ms" in message, message
    time.sleep(2)  # a pass after the status write: the ScaledObject keeps the last measured target
    assert threshold() == "4"

    def reasons() -> list[str]:
        events = core.list_namespaced_event(namespace).items
        return [e.reason for e in events if e.involved_object.name == "sloscale"]

    wait_until(lambda: "SLOUnmet" in reasons(), "the SLOUnmet Event", 30)

    # A new profile on request meets the SLO at 3: its target, and SLOUnmet False.
    kube.patch_namespaced_custom_object(
        "pagoda.dev",
        "v1alpha1",
        namespace,
        "inferenceservices",
        "sloscale",
        {"metadata": {"annotations": {PROFILE_REQUEST_ANNOTATION: "again"}}},
    )
    third = one_job(raw, namespace, "sloscale", other_than=second)["metadata"]["name"]
    met = {**unmet, "concurrency": 3, "requestsPerSecond": 1.0, "outputTokensPerSecond": 120.0}
    end_pod_as_the_kubelet_would(core, namespace, third, json.dumps(met))
    wait_until(lambda: threshold() == "2", "0.8 of the measured 3", 90)
    cleared = condition(get(kube, "sloscale", namespace), "SLOUnmet")
    assert (cleared["status"], cleared["reason"]) == ("False", "SLOMet"), cleared
    wait_until(lambda: "SLOMet" in reasons(), "the SLOMet Event", 30)
    assert reasons().count("SLOUnmet") == 1


def test_the_replicas_run_the_engine_choice_and_the_profile_is_not_run_again(
    operator: OperatorProcess, kube: client.CustomObjectsApi, cluster_api: Any, raw: Kube, namespace: str
) -> None:
    """A profile that tuned the engine (spec.slo.tuneEngine, the default): the choice lands in
    status.profile.engine and in the replicas' args for the setting the spec leaves unset, the one the spec
    gives stays, and the profile Job is the same one (built from the spec's own settings: no new profile)."""
    core, apps = client.CoreV1Api(cluster_api), client.AppsV1Api(cluster_api)
    create(kube, "slotune", namespace, replicas=1, slo=SLO, engine={"maxNumSeqs": 4})
    job = one_job(raw, namespace, "slotune")
    name = job["metadata"]["name"]
    assert "--tune-engine" in job["spec"]["template"]["spec"]["containers"][0]["args"]
    engine = {
        "maxNumBatchedTokens": 512,
        "maxNumSeqs": 2,  # the runtime never tunes a setting the spec gives; were it to, the spec still wins
        "goodput": 1.1,
        "baselineGoodput": 0.8,
        "candidates": [
            {"maxNumBatchedTokens": None, "maxNumSeqs": None, "concurrency": 1, "requestsPerSecond": 0.8},
            {"maxNumBatchedTokens": 512, "maxNumSeqs": None, "concurrency": 2, "requestsPerSecond": 1.1},
        ],
    }
    end_pod_as_the_kubelet_would(core, namespace, name, json.dumps({**RESULT, "engine": engine}))

    def runtime_args() -> list[str]:
        deployment = apps.read_namespaced_deployment("slotune", namespace)
        args: list[str] = deployment.spec.template.spec.containers[0].args
        return args[: args.index("--")] if "--" in args else args

    def tuned() -> list[str] | None:
        args = runtime_args()
        return args if "--max-num-batched-tokens" in args else None

    args = wait_until(tuned, "the replicas' args to carry the choice", 90)
    assert args[args.index("--max-num-batched-tokens") + 1] == "512"
    assert args[args.index("--max-num-seqs") + 1] == "4"
    status = profile(kube, "slotune", namespace)
    assert status["state"] == "Succeeded" and status["engine"]["goodput"] == 1.1
    assert status["engine"]["candidates"][0] == {"concurrency": 1, "requestsPerSecond": 0.8}
    # The operator's later passes keep the same Job: applying the choice changed no part of it.
    time.sleep(5)
    assert [j["metadata"]["name"] for j in jobs(raw, namespace, "slotune")] == [name]
    assert profile(kube, "slotune", namespace)["job"] == name


def test_at_most_two_profiles_run_at_once_in_the_cluster_and_a_third_waits_queued(
    operator: OperatorProcess, kube: client.CustomObjectsApi, cluster_api: Any, raw: Kube, namespace: str
) -> None:
    """The operator's default profile budget (--max-concurrent-profiles 2, the chart's profiles.maxConcurrent,
    reconcile/profile.py): three new services with spec.slo at once get two profile Jobs; the third has none,
    its status.profile Queued naming its place; sampled every second, never more than two profile Jobs run
    in the cluster. One ends: the third's Job is created and reported Running."""
    core = client.CoreV1Api(cluster_api)

    def running() -> list[str]:  # every namespace's profile Jobs (the only Jobs a service owns), not ended
        return [
            f"{j['metadata']['namespace']}/{j['metadata']['name']}"
            for j in raw.list("batch/v1", "jobs", None, OWNER_LABEL)
            if not any(c.get("status") == "True" for c in (j.get("status") or {}).get("conditions") or [])
        ]

    # Earlier tests' namespaces are deleted without waiting: their Jobs go first.
    wait_until(lambda: not running(), "no profile Job of an earlier test running", 120)
    names = ["qa", "qb", "qc"]
    for name in names:
        create(kube, name, namespace, replicas=1, slo=SLO)
    most = 0

    def jobs_of(services: list[str]) -> list[dict[str, Any]]:
        return [j for n in services for j in jobs(raw, namespace, n)]

    def sampled(condition: Any) -> Any:
        nonlocal most
        now = running()
        most = max(most, len(now))
        assert len(now) <= 2, now
        return condition()

    wait_until(lambda: sampled(lambda: len(jobs_of(names)) == 2), "two profile Jobs", 60, 1.0)
    [waiting] = [n for n in names if not jobs(raw, namespace, n)]
    queued = wait_until(
        lambda: sampled(lambda: (p := profile(kube, waiting, namespace)).get("state") == "Queued" and p),
        "the third service's profile Queued",
        60,
        1.0,
    )
    assert queued["job"].startswith(f"{waiting}-profile-"), queued
    assert "1 of 1 in the queue; 2 of 2 profile Jobs running" in queued["message"], queued
    for _ in range(5):  # the queue holds: no third Job while two run
        sampled(lambda: None)
        assert not jobs(raw, namespace, waiting)
        time.sleep(1)

    first = next(n for n in names if n != waiting)
    end_pod_as_the_kubelet_would(core, namespace, one_job(raw, namespace, first)["metadata"]["name"], "{}")
    job = wait_until(
        lambda: sampled(lambda: jobs(raw, namespace, waiting)), "the third's profile Job", 60, 1.0
    )
    assert [j["metadata"]["name"] for j in job] == [queued["job"]]
    wait_until(
        lambda: sampled(lambda: profile(kube, waiting, namespace).get("state") == "Running"),
        "Running",
        60,
        1.0,
    )
    assert most == 2
