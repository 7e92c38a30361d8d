"""Pods that really run: the operator's pods on the real node (kubelet, containerd, e2e/lab/realnode.py) from
the CPU runtime image, each with its own pod IP.

One `tiny` service (examples/tiny-cpu.yaml) in a namespace that enforces the `restricted` Pod Security
Standard serves the first four tests, in order:
1. its two pods are admitted, Running at pod IPs of the real node's range, Ready from their own readiness
   probes, listed Ready in the Service's EndpointSlice, and answer chat requests at those IPs;
2. deleting a pod under load (preStop, SIGTERM, drain; the other pod takes the load) fails no request, and
   the kubelet removed the old pod's cgroups; then the service goes down to one replica;
3. a spec change under load rolls the Deployment (surge, nothing unavailable) and fails no request; so does
   the scheduled restart (spec.restartSchedule) added just before it, and the status shows the next and the
   last restart.
The rollouts run on one replica: nothing else can take its traffic, so a moment without a Ready pod would
fail requests, and each rollout starts one engine, not two, beside the one serving. (Scale-in under load is
e2e/test_autoscaling.py's.)
4. etcd and the API server restarted under load: no request fails, the operator converges on a spec change
   made right after, with one Event and no rewrite.
Test 1 also reads where each replica's start went (status.startup, every phase, adding up).
5. A runtime that cannot start crashes for real: restarts, a termination message, and the InferenceService
   turns Degraded with the runtime's own reason.
The load goes through the Service's ClusterIP (kube-proxy) from clients that keep their connections alive
and never retry, as a user's would; each replaced pod drains and exits 0 by itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from e2e.lab import realnode
from e2e.lab.chartenv import ChartOperator
from e2e.lab.cluster import Cluster
from e2e.lab.observability import Load
from e2e.lab.processes import wait_until
from e2e.lab.realpods import (
    ServiceEndpoints,
    Terminations,
    all_pods,
    apply,
    condition,
    finished,
    get_json,
    is_real_pod_ip,
    isvc,
    patch_spec,
    pods,
    ready_pods,
    service_url,
    wait_condition,
    wait_ready_replicas,
)
from e2e.lab.samples import tiny_sample
from pagoda.operator.resources.meta import RESTARTED_AT_ANNOTATION
from pagoda.operator.status.startup import PHASES as STARTUP_STATUS_PHASES

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # real engines start slowly on two cores
REPLICAS = 2  # until the pod deletion; the rollouts run on one


@pytest.fixture(scope="module")
def serving(cluster: Cluster, operator: ChartOperator, cluster_api: Any) -> Iterator[str]:
    """The namespace of a Ready two-replica `tiny` service; the namespace enforces `restricted`. Its
    rollout is the default: one pod more during a rollout (maxSurge 1), none unavailable."""
    namespace = "real-pods"
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    sample = tiny_sample(namespace, real_pods=True)
    sample["spec"]["replicas"] = REPLICAS
    sample["spec"]["runtime"]["startupTimeoutSeconds"] = 900  # engines start slowly on two shared cores
    apply(cluster, sample)
    try:
        wait_condition(cluster, namespace, "tiny", "Ready", timeout=480)
        wait_ready_replicas(cluster, namespace, "tiny", REPLICAS)
        yield namespace
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def served(pod: dict[str, Any]) -> float:
    """Requests `pod` finished (vLLM's count): the load goes through the Service, which names no pod."""
    return finished(pod["status"]["podIP"])


def under_load(cluster: Cluster, namespace: str) -> Load:
    """A light, steady load through the Service's ClusterIP (kube-proxy), as a user's clients send it: each
    client keeps its connection alive and never retries. Requests flow through every transition, and the
    CPUs (two, here) stay free enough for the new replicas' engines to start."""
    url = service_url(cluster, namespace, "tiny")
    load = Load(url, "tiny", clients=2, pause=0.25, max_seconds=900).start()
    wait_until(lambda: load.completed >= 8, "requests to complete under load", timeout=120)
    return load


def test_pods_run_for_real_in_a_restricted_namespace(cluster: Cluster, serving: str) -> None:
    running = ready_pods(cluster, serving, "tiny")
    assert len(running) == REPLICAS
    addresses = sorted(p["status"]["podIP"] for p in running)
    endpoints = ServiceEndpoints(cluster, serving, "tiny")
    try:  # the EndpointSlice controller follows the pods' Ready condition within moments
        wait_until(
            lambda: endpoints.addresses == addresses, "both pods Ready in the EndpointSlice", timeout=30
        )
    finally:
        endpoints.stop()
    for pod in running:
        status = pod["status"]
        assert pod["spec"]["nodeName"] == realnode.NODE_NAME
        assert status["phase"] == "Running"
        assert is_real_pod_ip(status["podIP"]), status["podIP"]
        [container] = status["containerStatuses"]
        assert container["ready"] and container["started"] and container["restartCount"] == 0
        assert "running" in container["state"]
        reply = httpx.post(
            f"http://{status['podIP']}:8000/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
            timeout=120,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] > 0

    # What one replica holds, as the runtimes say it, reaches the status and `kubectl get -o wide`.
    answers = [
        httpx.get(f"http://{p['status']['podIP']}:8000/v1/pagoda/capacity", timeout=10).json()
        for p in running
    ]
    smallest = min(answers, key=lambda a: a["kvCacheTokens"])
    assert smallest["kvCacheTokens"] >= smallest["maxModelLen"] > 0, answers

    def reported() -> dict[str, Any] | None:
        found: dict[str, Any] | None = get_json(cluster, "-n", serving, "inferenceservice", "tiny")[
            "status"
        ].get("capacity")
        return found

    capacity = wait_until(reported, "status.capacity", timeout=120, interval=1)
    assert capacity == {
        "kvCacheTokens": smallest["kvCacheTokens"],
        "maxModelLen": smallest["maxModelLen"],
        "maxConcurrency": round(smallest["maxConcurrency"], 2),
    }
    header, row = cluster.kubectl(
        "-n", serving, "get", "inferenceservice", "tiny", "-o", "wide"
    ).stdout.splitlines()
    assert "KV TOKENS" in header and "MAX CONCURRENCY" in header, header
    assert str(smallest["kvCacheTokens"]) in row.split(), row

    # Where each replica's start went: the kubelet's phases from the Pod, the runtime's from itself.
    def both_started() -> dict[str, Any] | None:
        found = get_json(cluster, "-n", serving, "inferenceservice", "tiny")["status"].get("startup")
        return found if found and len(found.get("recent") or []) == REPLICAS else None

    startup = wait_until(both_started, "status.startup for both replicas", timeout=120, interval=1)
    print("status.startup:", json.dumps(startup))  # the figures docs/observability.md quotes
    assert sorted(r["pod"] for r in startup["recent"]) == sorted(p["metadata"]["name"] for p in running)
    for start in startup["recent"]:
        phases = start["phases"]
        assert set(phases) == set(STARTUP_STATUS_PHASES), phases  # every phase
        assert phases["imports"] > 1 and phases["engineInit"] > 0, phases
        # The Pod's timestamps have whole seconds: the phases add up to the total within a few.
        assert abs(sum(phases.values()) - start["seconds"]) <= 4, start
        assert start["modelBytes"] > 1_000_000, start  # the tiny model baked into the image
    # The newest start (both may have become Ready in the same second).
    assert startup["last"] in startup["recent"]
    assert startup["last"]["readyAt"] == max(r["readyAt"] for r in startup["recent"])
    assert startup["typical"]["starts"] == REPLICAS
    header, row = cluster.kubectl("-n", serving, "get", "inferenceservice", "tiny").stdout.splitlines()
    assert "COLD-START" in header, header
    assert str(startup["last"]["seconds"]).removesuffix(".0") in row.split(), row


def test_deleting_a_pod_under_load_loses_no_request(cluster: Cluster, serving: str) -> None:
    """The deleted pod is one that holds kept-alive connections of the load: it drains (preStop, SIGTERM,
    the runtime serving on with `Connection: close` until its clients moved) while the other takes the load,
    and its container exits 0 within its grace period. Then spec.replicas goes to 1 for the rollouts below:
    the ReplicaSet removes the replacement the Deployment started, still loading (not Ready pods go first),
    and the pod that served stays."""
    running = ready_pods(cluster, serving, "tiny")
    before = {p["metadata"]["uid"]: served(p) for p in running}
    ended = Terminations(cluster, serving, "tiny")
    load = under_load(cluster, serving)
    try:
        # kube-proxy spread the clients' connections over the pods: the victim is one that serves some.
        busy = wait_until(
            lambda: [p for p in running if served(p) > before[p["metadata"]["uid"]]], "a pod serving the load"
        )
        victim = busy[0]
        (survivor,) = [p for p in running if p["metadata"]["uid"] != victim["metadata"]["uid"]]
        name, uid = victim["metadata"]["name"], victim["metadata"]["uid"]
        cluster.kubectl("delete", "pod", "-n", serving, name, "--wait=false")

        def removed() -> bool:
            selector = f"metadata.name={name}"
            return not get_json(cluster, "-n", serving, "pods", "--field-selector", selector)["items"]

        wait_until(removed, "the deleted pod to be removed", timeout=180, interval=1)
        done = served(survivor)
        wait_until(lambda: served(survivor) >= done + 8, "requests after the deletion", timeout=120)
        assert ended.of(uid) == [(0, "Completed")]  # drained and exited by itself, never SIGKILLed
    finally:
        load.stop()
        ended.stop()
    print(f"A pod deleted under load: completed={load.completed} failed={len(load.failures)}")
    assert load.failures == [], load.failures
    node = cluster.node
    assert node is not None
    wait_until(
        lambda: not realnode.pod_cgroups(node, uid), "the kubelet to remove the pod's cgroups", timeout=60
    )

    scaled_down = Terminations(cluster, serving, "tiny")
    try:
        patch_spec(cluster, serving, "tiny", {"replicas": 1})
        wait_ready_replicas(cluster, serving, "tiny", 1)
        assert [p["metadata"]["uid"] for p in pods(cluster, serving, "tiny")] == [survivor["metadata"]["uid"]]
        # The removed replacement, deleted while it started (runtime/serving/signals.py), stops at once and by
        # itself: gone before the rollouts below watch how their pods end.
        wait_until(
            lambda: len(all_pods(cluster, serving, "tiny")) == 1, "the replacement to be removed", timeout=120
        )
        assert all(ended == [(0, "Completed")] for ended in scaled_down.ended.values()), scaled_down.ended
    finally:
        scaled_down.stop()


def test_a_spec_change_and_a_scheduled_restart_roll_under_load_with_no_failed_request(
    cluster: Cluster, serving: str
) -> None:
    """Two rollouts under one load, neither failing a request:
    1. a spec change (spec.runtime.drainTimeoutSeconds) rolls the Deployment at once: one pod more, none
       unavailable, and the old pod drains;
    2. spec.restartSchedule, added just before: one interval (1m) after it the restart is due (a due restart
       waits while a rollout is in progress, so if the first is slower than that, it waits for it); the
       operator stamps the pod template (pagoda.dev/restartedAt) and the pod rolls again. The status shows
       the next and then the last restart; the schedule is removed once the restart began, so exactly one
       happens.
    The schedule's interval runs while the first rollout does, instead of a minute of its own after it."""
    [first] = pods(cluster, serving, "tiny")

    def isvc_restarts() -> dict[str, Any]:
        found: dict[str, Any] = (
            get_json(cluster, "-n", serving, "inferenceservice", "tiny")["status"].get("restarts") or {}
        )
        return found

    def stamp() -> str | None:
        template = get_json(cluster, "-n", serving, "deployment", "tiny")["spec"]["template"]
        found: str | None = (template["metadata"].get("annotations") or {}).get(RESTARTED_AT_ANNOTATION)
        return found

    def set_schedule(schedule: dict[str, Any] | None) -> None:
        patch_spec(cluster, serving, "tiny", {"restartSchedule": schedule})

    assert stamp() is None
    ended = Terminations(cluster, serving, "tiny")
    load = under_load(cluster, serving)
    try:
        set_schedule({"every": "1m"})
        planned = wait_until(lambda: isvc_restarts().get("next"), "status.restarts.next", timeout=60)
        patch_spec(cluster, serving, "tiny", {"runtime": {"drainTimeoutSeconds": 12}})
        restarted_at = wait_until(stamp, "the scheduled restart", timeout=600, interval=1)
        assert restarted_at >= planned
        wait_until(
            lambda: isvc_restarts().get("last") == restarted_at,
            "status.restarts.last",
            timeout=60,
            interval=1,
        )
        set_schedule(None)  # one restart only: the next would be due as soon as this rollout completes
        wait_ready_replicas(cluster, serving, "tiny", 1)  # the stamped template's pod
        [last] = pods(cluster, serving, "tiny")
        done = served(last)
        wait_until(lambda: served(last) >= done + 4, "requests to the last pod", timeout=120)

        # The first pod and the spec change's drained under load and exited by themselves.
        def both_replaced_ended() -> list[str] | None:
            uids = [uid for uid in ended.ended if uid != last["metadata"]["uid"]]
            return uids if len(uids) >= 2 else None

        replaced = wait_until(both_replaced_ended, "both replaced pods to end", timeout=120)
        assert first["metadata"]["uid"] in replaced and len(replaced) == 2, ended.ended
        assert all(ended.of(uid) == [(0, "Completed")] for uid in replaced), ended.ended
    finally:
        load.stop()
        ended.stop()
    print(f"Two rollouts under load: completed={load.completed} failed={len(load.failures)}")
    assert load.failures == [], load.failures
    assert first["metadata"]["uid"] not in {p["metadata"]["uid"] for p in pods(cluster, serving, "tiny")}
    deployment = get_json(cluster, "-n", serving, "deployment", "tiny")
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--drain-timeout") + 1] == "12"
    assert stamp() == restarted_at  # the last restart stays on the template: nothing rolled again
    assert isvc_restarts() == {}
    assert len(ready_pods(cluster, serving, "tiny")) == 1


def _operator_events(cluster: Cluster, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    """The Events on InferenceService `name`, by uid."""
    selector = f"involvedObject.kind=InferenceService,involvedObject.name={name}"
    listed = get_json(cluster, "-n", namespace, "events", "--field-selector", selector)["items"]
    return {e["metadata"]["uid"]: e for e in listed}


def test_etcd_and_the_api_server_restart_under_load_and_the_operator_converges(
    cluster: Cluster, serving: str, operator: ChartOperator
) -> None:
    """etcd, then the API server, restarted (SIGTERM, then the same command again: a control-plane upgrade
    or crash) while a load runs through the ClusterIP. kube-proxy's rules and the pods need neither, so no
    request fails and no pod is replaced. The operator's watches and Lease renewals fail while the API
    server is away; it reconnects (a leader that cannot renew for 10 s exits and its container restarts, as
    client-go's controllers do; the standby or the restarted one leads) and applies a spec change made right
    after (spec.disruption, which only the PodDisruptionBudget carries): the status turns current, the
    Deployment is not rewritten, and the service gets one Event, the change's, not a storm of rewrites."""
    [pod] = pods(cluster, serving, "tiny")
    generation = get_json(cluster, "-n", serving, "deployment", "tiny")["metadata"]["generation"]
    events_before = _operator_events(cluster, serving, "tiny")
    restarts_before, holders_before = operator.restarts(), operator.holders()
    load = under_load(cluster, serving)
    try:
        unready = {name: round(cluster.restart(name), 1) for name in ("etcd", "kube-apiserver")}
        patch_spec(cluster, serving, "tiny", {"disruption": {"maxUnavailable": 0}})
        wait_until(
            lambda: get_json(cluster, "-n", serving, "pdb", "tiny")["spec"].get("maxUnavailable") == 0,
            "the operator to apply the spec change to the PodDisruptionBudget",
            timeout=180,
            interval=1,
        )

        def current() -> bool:
            obj = isvc(cluster, serving, "tiny")
            ready = condition(obj, "Ready")
            return bool(
                obj["status"].get("observedGeneration") == obj["metadata"]["generation"]
                and ready.get("status") == "True"
            )

        wait_until(current, "the status of the changed spec, Ready", timeout=120, interval=1)
        done = load.completed
        wait_until(lambda: load.completed >= done + 4, "requests after the restarts", timeout=120)
    finally:
        load.stop()
    # The leader exits when it cannot renew its Lease for 10 s (exit 1; a waiting replica rides the outage
    # out), and then another process holds the Lease. The kubelet reports the restart only once the API
    # server takes its status again, which can be after the convergence above: so the Lease says whether the
    # leader exited, and the restart is waited for when it did.
    holders = operator.holders()
    exited = {holder.rpartition("_")[0] for holder in holders_before} if holders != holders_before else set()
    expected = {name: count + (name in exited) for name, count in restarts_before.items()}
    wait_until(
        lambda: operator.restarts() == expected,
        f"the operator's restarts to be {expected} (the Lease went from {holders_before} to {holders})",
        timeout=120,
        interval=1,
    )
    print(f"Restarts (s unready) {unready}: completed={load.completed} failed={len(load.failures)}")
    print(f"Operator restarts before {restarts_before}, after {expected}; leader exited: {sorted(exited)}")
    for operator_pod in operator.pods():
        if operator_pod["metadata"]["name"] in exited:
            [status] = operator_pod["status"]["containerStatuses"]
            assert status["lastState"]["terminated"]["exitCode"] == 1, status
    operator.expected_restarts.update(expected)
    assert load.failures == [], load.failures
    assert [p["metadata"]["uid"] for p in pods(cluster, serving, "tiny")] == [pod["metadata"]["uid"]]
    assert get_json(cluster, "-n", serving, "deployment", "tiny")["metadata"]["generation"] == generation
    new = [e for uid, e in _operator_events(cluster, serving, "tiny").items() if uid not in events_before]
    assert len(new) == 1 and "PodDisruptionBudget" in new[0]["message"], new
    patch_spec(cluster, serving, "tiny", {"disruption": None})


def test_a_runtime_that_cannot_start_crashes_with_its_reason(
    cluster: Cluster, operator: ChartOperator, namespace: str
) -> None:
    sample = tiny_sample(namespace, "broken", real_pods=True)
    sample["spec"]["model"]["uri"] = "file:///models/does-not-exist"
    apply(cluster, sample)

    def crashed() -> dict[str, Any] | None:
        for pod in pods(cluster, namespace, "broken"):
            for container in pod["status"].get("containerStatuses") or []:
                if container["restartCount"] >= 1 and container["lastState"].get("terminated"):
                    return dict(container)
        return None

    container = wait_until(crashed, "the runtime to crash and be restarted", timeout=300, interval=1)
    terminated = container["lastState"]["terminated"]
    assert terminated["exitCode"] != 0
    assert terminated["message"].startswith("ModelNotFound:"), terminated["message"]
    degraded = wait_condition(cluster, namespace, "broken", "Degraded", timeout=120)
    assert degraded["reason"] == "ModelNotFound", degraded
    assert "spec.model.uri" in degraded["message"], degraded
    assert condition(pods(cluster, namespace, "broken")[0], "Ready").get("status") == "False"
