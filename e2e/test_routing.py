"""spec.routing end to end (issue #9): requests sent to Envoy are routed by the Gateway API Inference
Extension's real endpoint picker (GIE v1.5.0) to the real runtime pods of a two-replica service.

The operator writes the InferencePool and the picker's Deployment, ConfigMap and Service; the harness
(e2e/lab/gateway.py) runs the real picker from them and Envoy in front of it, on loopback.
1. Chat and streamed chat completions through Envoy succeed, each served by a Ready pod of the pool: the pod
   that Envoy names (x-pagoda-upstream) is the one whose own vLLM counter of finished requests went up by one.
2. The picker's flow-control queue metric reaches Prometheus, labelled with the service's namespace and the
   picker's Service, queryable by the pool's name.
3. Deleting the pod that serves the load fails no request: the picker drops a pod once it is terminating
   (during its preStop sleep, before the runtime drains), and requests already at it finish.
4. The picker runs as a leader and a standby (the default two replicas): the leader deleted under load by 6
   clients. Another replica takes the Lease once the leader lets it go and turns Ready; meanwhile Envoy
   retries opening its stream to the picker's Service (e2e/lab/envoy-bootstrap.yaml.j2), so no request fails
   in the hand-over. The one loss allowed is bounded and named: GIE v1.5.0 stops its flow control at SIGTERM
   before its gRPC server has drained, and answers 500 to a request it holds at that instant (at most one per
   client; none in most runs).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import yaml

from e2e.lab.chartenv import ChartOperator
from e2e.lab.cluster import Cluster
from e2e.lab.gateway import UPSTREAM_HEADER, Gateway, envoy_counter, start_gateway
from e2e.lab.observability import Load, PrometheusAt
from e2e.lab.processes import WaitTimeout, wait_until
from e2e.lab.realpods import (
    all_pods,
    finished,
    get_json,
    is_ready,
    pods,
    pods_matching,
    ready_pods,
    samples,
    wait_condition,
)
from e2e.lab.samples import tiny_sample
from e2e.lab.stack import Stack
from pagoda.operator.resources.routing import leader_lease_name, picker_selector

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
NAMESPACE = "routing"
NAME = "tiny"
REPLICAS = 2
PICKER_CLIENTS = 6  # above Envoy's default of 3 retries at once
QUEUE_METRIC = "inference_extension_flow_control_queue_size"


@pytest.fixture(scope="module")
def serving(cluster: Cluster, stack: Stack, operator: ChartOperator) -> Iterator[str]:
    """A Ready two-replica `tiny` service with spec.routing (the stack installs the InferencePool CRD)."""
    cluster.kubectl("create", "namespace", NAMESPACE)
    sample = tiny_sample(NAMESPACE, NAME, real_pods=True)
    sample["spec"]["replicas"] = REPLICAS
    sample["spec"]["runtime"]["startupTimeoutSeconds"] = 900  # engines start slowly on two shared cores
    # Prometheus scrapes the picker through the ServiceMonitor the operator writes for it.
    sample["spec"]["monitoring"] = {"serviceMonitor": {"enabled": True, "interval": "2s"}}
    # The real node has two cores: a small request for the picker (the default is a whole core).
    sample["spec"]["routing"] = {"endpointPicker": {"queueTimeoutSeconds": 300, "cpu": "250m"}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(sample))
    try:
        wait_condition(cluster, NAMESPACE, NAME, "Ready", timeout=600)
        wait_until(lambda: len(ready_pods(cluster, NAMESPACE, NAME)) == REPLICAS, "2 Ready pods", timeout=600)
        yield NAMESPACE
    finally:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


@pytest.fixture(scope="module")
def gateway(cluster: Cluster, serving: str) -> Iterator[Gateway]:
    with start_gateway(cluster, NAME, serving) as running:
        # The picker lists the pool's Ready pods (its pool gauge is refreshed every 5 s).
        wait_until(
            lambda: picker_value(running, "inference_pool_ready_pods", name=NAME) == REPLICAS,
            "the picker to see both Ready pods",
            timeout=60,
        )
        yield running


def picker_value(gateway: Gateway, metric: str, **labels: str) -> float | None:
    found = [
        v
        for n, got, v in samples(gateway.picker_metrics_url)
        if n == metric and labels.items() <= got.items()
    ]
    return sum(found) if found else None


def wait_finished(ip: str, count: float) -> None:
    """vLLM counts a request once it has finished, which may be a moment after the response."""
    wait_until(lambda: finished(ip) == count, f"{ip} to count {count:.0f} finished requests", timeout=10)


def ready_ips(cluster: Cluster) -> set[str]:
    return {p["status"]["podIP"] for p in ready_pods(cluster, NAMESPACE, NAME)}


def chat(gateway: Gateway, *, stream: bool, text: str) -> tuple[httpx.Response, str, int]:
    """One chat completion through Envoy; (response, content, completion tokens)."""
    body: dict[str, Any] = {
        "model": NAME,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 8,
        "temperature": 0,
    }
    if not stream:
        reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=300)
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        return reply, answer["choices"][0]["message"]["content"], answer["usage"]["completion_tokens"]
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    content, tokens, done = "", 0, False
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body, timeout=300) as reply:
        assert reply.status_code == 200, reply.read().decode()
        for line in reply.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line.removeprefix("data: "))
                content += "".join(c["delta"].get("content") or "" for c in chunk["choices"])
                tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
    assert done, "the stream ended without [DONE]"
    return reply, content, tokens


def test_chat_and_streamed_chat_through_envoy_are_served_by_ready_pods(
    cluster: Cluster, gateway: Gateway
) -> None:
    ready = ready_ips(cluster)
    assert len(ready) == REPLICAS
    for n, stream in enumerate([False, True, False, True]):
        before = {ip: finished(ip) for ip in ready}
        reply, content, tokens = chat(gateway, stream=stream, text=f"Question {n}: what is a GPU?")
        assert tokens > 0 and isinstance(content, str), (content, tokens)
        ip, _, port = reply.headers[UPSTREAM_HEADER].rpartition(":")
        assert ip in ready and port == "8000", (reply.headers[UPSTREAM_HEADER], ready)
        # The pod Envoy names finished exactly this request; the other one none (vLLM counts at the end).
        wait_finished(ip, before[ip] + 1)
        assert {other: finished(other) for other in ready - {ip}} == {o: before[o] for o in ready - {ip}}


def test_the_pickers_queue_metric_reaches_prometheus(
    cluster: Cluster, gateway: Gateway, stack: Stack
) -> None:
    chat(gateway, stream=False, text="Hello")  # the queue's series exists once a request went through it
    series = [labels for n, labels, _ in samples(gateway.picker_metrics_url) if n == QUEUE_METRIC]
    assert series and {s["inference_pool"] for s in series} == {NAME}, series  # the pool's plain name
    query = f'sum({QUEUE_METRIC}{{namespace="{NAMESPACE}",inference_pool="{NAME}"}})'

    def result() -> list[dict[str, Any]] | None:
        answer = httpx.get(f"{stack.prometheus_url}/api/v1/query", params={"query": query}, timeout=10).json()
        assert answer["status"] == "success", answer
        found: list[dict[str, Any]] = answer["data"]["result"]
        return found or None

    try:
        [row] = wait_until(result, f"Prometheus to answer {query}", timeout=60, interval=1)
    except WaitTimeout:
        targets = PrometheusAt(stack.prometheus_url).api("targets")["activeTargets"]
        mine = [t for t in targets if t["labels"].get("namespace") == NAMESPACE]
        raise AssertionError(f"no {QUEUE_METRIC} in Prometheus; its targets in {NAMESPACE}: {mine}") from None
    assert float(row["value"][1]) == 0.0  # nothing waits now
    by_labels = f'count by (service, job) ({QUEUE_METRIC}{{namespace="{NAMESPACE}"}})'
    answer = httpx.get(f"{stack.prometheus_url}/api/v1/query", params={"query": by_labels}, timeout=10).json()
    assert [r["metric"] for r in answer["data"]["result"]] == [
        {"service": f"{NAME}-epp", "job": f"{NAME}-epp"}
    ]


def test_a_pod_deleted_under_load_through_envoy_fails_no_request(cluster: Cluster, gateway: Gateway) -> None:
    ready = ready_ips(cluster)
    before = {ip: finished(ip) for ip in ready}
    load = Load(gateway.url, NAME, clients=2, pause=0.25, max_seconds=600).start()
    try:
        wait_until(lambda: load.completed >= 8, "requests to complete through Envoy", timeout=180)
        # The busiest pod: the picker's prefix-cache affinity may send most of this load to one of them.
        served = {ip: finished(ip) - before[ip] for ip in ready}
        busiest = max(served, key=lambda ip: served[ip])
        [victim] = [p for p in pods(cluster, NAMESPACE, NAME) if p["status"].get("podIP") == busiest]
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, victim["metadata"]["name"], "--wait=false")
        at_deletion = load.completed
        wait_until(
            lambda: (
                not any(
                    p["metadata"]["uid"] == victim["metadata"]["uid"]
                    for p in all_pods(cluster, NAMESPACE, NAME)
                )
            ),
            "the deleted pod to be gone",
            timeout=120,
            interval=1,
        )
        done = load.completed
        wait_until(lambda: load.completed >= done + 8, "more requests after the pod went", timeout=180)
    finally:
        load.stop()
    assert served[busiest] > 0, served
    assert load.failures == [], load.failures
    assert done > at_deletion  # requests completed while the pod terminated (preStop sleep, drain)


def picker_pods(cluster: Cluster) -> list[dict[str, Any]]:
    """The picker's pods that are not being deleted."""
    return pods_matching(cluster, NAMESPACE, ",".join(f"{k}={v}" for k, v in picker_selector(NAME).items()))


def ready_picker(cluster: Cluster) -> str | None:
    """The name of the picker's one Ready pod (the leader), None while none is Ready."""
    ready = [p["metadata"]["name"] for p in picker_pods(cluster) if is_ready(p)]
    assert len(ready) <= 1, f"only the leader may be Ready: {ready}"
    return ready[0] if ready else None


def lease_holder(cluster: Cluster) -> str:
    lease = get_json(cluster, "lease", "-n", NAMESPACE, leader_lease_name(NAME, NAMESPACE))
    holder: str = lease["spec"]["holderIdentity"]
    return holder


@contextmanager
def picker_logs(cluster: Cluster, pods: set[str]) -> Iterator[None]:
    """Follows the picker pods' logs into <cluster workdir>/logs/picker-<pod>.log while the block runs (a
    deleted pod's log is gone with it), then writes those of the picker pods started meanwhile."""
    follows = []
    for pod in sorted(pods):
        out = (cluster.workdir / "logs" / f"picker-{pod}.log").open("wb")
        argv = [str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", "logs", "-f"]
        proc = subprocess.Popen([*argv, "-n", NAMESPACE, pod], stdout=out, stderr=subprocess.STDOUT)
        follows.append((proc, out))
    try:
        yield
    finally:
        for proc, out in follows:
            proc.terminate()
            proc.wait(timeout=10)
            out.close()
        for pod in {p["metadata"]["name"] for p in picker_pods(cluster)} - pods:
            log = cluster.kubectl("logs", "-n", NAMESPACE, pod, check=False)
            (cluster.workdir / "logs" / f"picker-{pod}.log").write_text(log.stdout + log.stderr)


def access_log(gateway: Gateway) -> list[dict[str, Any]]:
    """Envoy's access log: one JSON object per request (the file also holds Envoy's own log lines)."""
    lines = gateway.envoy.log_path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def test_the_pickers_leader_deleted_under_load_hands_over_losing_at_most_what_it_held(
    cluster: Cluster, gateway: Gateway
) -> None:
    leader = wait_until(lambda: ready_picker(cluster), "a Ready picker (the leader)", timeout=60)
    standby = {p["metadata"]["name"] for p in picker_pods(cluster)} - {leader}
    assert len(standby) == 1, f"a leader and a standby: {leader}, {standby}"
    assert lease_holder(cluster).startswith(f"{leader}_")  # controller-runtime's identity: <pod>_<uuid>
    load = Load(gateway.url, NAME, clients=PICKER_CLIENTS, pause=0.1, max_seconds=600).start()
    with picker_logs(cluster, {leader, *standby}):
        try:
            wait_until(lambda: load.completed >= 6, "requests to complete through Envoy", timeout=180)
            deleted = time.monotonic()
            cluster.kubectl("delete", "pod", "-n", NAMESPACE, leader, "--wait=false")

            def another_leader() -> str | None:
                name = ready_picker(cluster)
                return name if name != leader else None

            new_leader = wait_until(
                another_leader,
                "another picker to be Ready",
                timeout=120,
                interval=0.25,
            )
            handover = time.monotonic() - deleted
            done = load.completed
            wait_until(lambda: load.completed >= done + 6, "requests through the new leader", timeout=180)
        finally:
            load.stop()
    # How often Envoy retried opening a stream to the picker (0 when no request arrived in the hand-over).
    retries = envoy_counter(gateway.admin_url, "cluster.ext_proc.upstream_rq_retry")
    print(
        f"picker hand-over: {handover:.1f} s; ext_proc stream retries={retries}; "
        f"completed={load.completed} failed={len(load.failures)}"
    )
    # Envoy failed none itself (a refused stream to the picker that it did not retry names its gRPC error in
    # the access log's details); the picker's own answers have none.
    envoy_errors = [e for e in access_log(gateway) if e["code"] != 200 and e["details"]]
    assert envoy_errors == [], envoy_errors
    # The bounded loss: requests the stopping leader held at its SIGTERM, each a 500 from the picker.
    failed = [r for r in load.records if r.failure is not None]
    assert len(failed) <= PICKER_CLIENTS, load.failures
    assert all(r.failure == "HTTP 500" and deleted - 5 < r.started < deleted + handover for r in failed), [
        (r.started - deleted, r.failure) for r in failed
    ]
    # The Lease goes to whichever replica asks first once the leader lets it go: the standby (it asks every
    # 2 s) or the leader's replacement, which the ReplicaSet starts as soon as the leader is deleted.
    assert new_leader != leader
    assert lease_holder(cluster).startswith(f"{new_leader}_")
