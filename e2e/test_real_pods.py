"""Pods that really run: the operator's pods on the node agent's node, as real `pagoda-runtime` processes
with their own network namespace and pod IP.

1. examples/tiny-cpu.yaml in a namespace that enforces the `restricted` Pod Security Standard: admitted,
   Running at a pod IP of the agent's range, Ready from its own readiness probe, listed Ready in the Service's
   EndpointSlice, and answering a chat request at that IP.
2. Deleting a pod under load: preStop, SIGTERM, drain; the Deployment's replacement takes over; no request
   fails, and the old pod's network namespace and processes are gone.
3. A runtime that cannot start crashes for real: restarts, a termination message, and the InferenceService
   turns Degraded with the runtime's own reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from e2e import podnet
from e2e.cluster import REAL_NODE, Cluster
from e2e.fixtures import tiny_sample
from e2e.observability import Load
from e2e.processes import OperatorProcess, wait_until
from e2e.realpods import (
    ServiceEndpoints,
    condition,
    get_json,
    is_real_pod_ip,
    pods,
    ready_pods,
    wait_condition,
)

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[1]


def apply(cluster: Cluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))


def netns_names() -> list[str]:
    return podnet._netns_names()


def test_tiny_service_runs_as_a_real_pod_in_a_restricted_namespace(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    apply(cluster, tiny_sample(namespace, real_pods=True))
    wait_condition(cluster, namespace, "tiny", "Ready")

    [pod] = ready_pods(cluster, namespace, "tiny")
    status = pod["status"]
    assert pod["spec"]["nodeName"] == REAL_NODE
    assert status["phase"] == "Running"
    assert is_real_pod_ip(status["podIP"]), status["podIP"]
    [container] = status["containerStatuses"]
    assert container["ready"] and container["started"] and container["restartCount"] == 0
    assert "running" in container["state"]

    endpoints = ServiceEndpoints(cluster, namespace, "tiny")
    try:
        assert endpoints.addresses == [status["podIP"]]
    finally:
        endpoints.stop()
    reply = httpx.post(
        f"http://{status['podIP']}:8000/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] > 0


def test_deleting_a_pod_under_load_loses_no_request(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    sample = tiny_sample(namespace, real_pods=True)
    sample["spec"]["replicas"] = 2
    apply(cluster, sample)
    wait_until(
        lambda: len(ready_pods(cluster, namespace, "tiny")) == 2, "2 Ready pods", timeout=600, interval=1
    )
    victim = ready_pods(cluster, namespace, "tiny")[0]
    uid = victim["metadata"]["uid"]

    endpoints = ServiceEndpoints(cluster, namespace, "tiny")
    load = Load(endpoints.pick, "tiny", clients=4, max_seconds=600).start()
    try:
        wait_until(lambda: load.completed >= 8, "requests to complete before the deletion", timeout=120)
        cluster.kubectl("delete", "pod", "-n", namespace, victim["metadata"]["name"], "--wait=false")
        wait_until(
            lambda: (
                not get_json(
                    cluster,
                    "-n",
                    namespace,
                    "pods",
                    "--field-selector",
                    f"metadata.name={victim['metadata']['name']}",
                )["items"]
            ),
            "the deleted pod to be removed",
            timeout=120,
            interval=1,
        )
        wait_until(
            lambda: len(ready_pods(cluster, namespace, "tiny")) == 2,
            "a replacement Ready",
            timeout=600,
            interval=1,
        )
        served_by_new = len(load.records)
        wait_until(
            lambda: len(load.records) >= served_by_new + 8, "requests after the replacement", timeout=120
        )
    finally:
        load.stop()
        endpoints.stop()
    assert load.failures == [], load.failures
    assert not any(name.endswith(uid[:8]) for name in netns_names())
    assert len({r.endpoint for r in load.records}) >= 3  # both old pods, then the replacement


def test_a_runtime_that_cannot_start_crashes_with_its_reason(
    cluster: Cluster, operator: OperatorProcess, namespace: str
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
