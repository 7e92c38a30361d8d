"""LoRA adapters on real runtimes (issue #11): added to and removed from a running two-replica service
without a restart, under load.

1. Adding an adapter to spec.lora.adapters loads it into both replicas at run time: the pods keep their uid,
   start time and restart count; a light load on the base model fails no request; both pods list it in
   /v1/models and answer requests for it; status.adapters says 2/2 replicas and `kubectl get` 1/1.
2. Removing it drains and unloads it: requests for it already running finish, later ones get OpenAI's 404 at
   every pod, and the status no longer lists it.

The adapter is the one the CPU runtime image carries for its tiny model (`pagoda-runtime make-tiny-adapter`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from e2e.chartenv import ChartOperator
from e2e.cluster import Cluster
from e2e.fixtures import tiny_sample
from e2e.observability import Load
from e2e.processes import wait_until
from e2e.realpods import ServiceEndpoints, get_json, patch_spec, ready_pods, wait_condition

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
REPLICAS = 2
ADAPTER = "sql"
# The CPU runtime image carries this adapter for its tiny model (runtime/Dockerfile.cpu), like the model.
ADAPTER_URI = f"file:///models/adapters/{ADAPTER}"
LIMITS = {"maxLoras": 2, "maxLoraRank": 8, "maxCpuLoras": 2}


def set_adapters(cluster: Cluster, namespace: str, adapters: list[dict[str, str]]) -> None:
    patch_spec(cluster, namespace, "tiny", {"lora": {**LIMITS, "adapters": adapters}})


def status(cluster: Cluster, namespace: str) -> dict[str, Any]:
    found: dict[str, Any] = get_json(cluster, "-n", namespace, "inferenceservice", "tiny").get("status") or {}
    return found


def identities(cluster: Cluster, namespace: str) -> dict[str, tuple[str, int]]:
    """uid -> (start time, restart count) of each Ready pod."""
    return {
        p["metadata"]["uid"]: (p["status"]["startTime"], p["status"]["containerStatuses"][0]["restartCount"])
        for p in ready_pods(cluster, namespace, "tiny")
    }


@pytest.fixture(scope="module")
def serving(cluster: Cluster, operator: ChartOperator) -> Iterator[str]:
    """A Ready two-replica `tiny` service with LoRA limits and no adapter yet."""
    namespace = "lora"
    cluster.kubectl("create", "namespace", namespace)
    sample = tiny_sample(namespace, real_pods=True)
    sample["spec"]["replicas"] = REPLICAS
    sample["spec"]["runtime"]["startupTimeoutSeconds"] = 900
    sample["spec"]["lora"] = {**LIMITS, "adapters": []}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(sample))
    try:
        wait_condition(cluster, namespace, "tiny", "Ready", timeout=600)
        wait_until(
            lambda: len(ready_pods(cluster, namespace, "tiny")) == REPLICAS, "2 Ready pods", timeout=600
        )
        yield namespace
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def served_models(ip: str) -> set[str]:
    return {m["id"] for m in httpx.get(f"http://{ip}:8000/v1/models", timeout=10).json()["data"]}


def complete(ip: str, model: str) -> httpx.Response:
    body = {"model": model, "prompt": "SELECT", "max_tokens": 8, "temperature": 0}
    return httpx.post(f"http://{ip}:8000/v1/completions", json=body, timeout=120)


def test_an_added_adapter_is_served_by_every_replica_without_a_restart(
    cluster: Cluster, serving: str
) -> None:
    before = identities(cluster, serving)
    endpoints = ServiceEndpoints(cluster, serving, "tiny")
    load = Load(endpoints.pick, "tiny", clients=2, pause=0.25, max_seconds=600).start()
    try:
        wait_until(lambda: load.completed >= 8, "requests to complete under load", timeout=120)
        set_adapters(cluster, serving, [{"name": ADAPTER, "uri": ADAPTER_URI}])

        def loaded() -> dict[str, Any] | None:
            found = status(cluster, serving)
            return found if found.get("adaptersReady") == "1/1" else None

        found = wait_until(loaded, "status.adaptersReady 1/1", timeout=180, interval=1)
        done = load.completed
        wait_until(lambda: load.completed >= done + 8, "more requests after the load", timeout=120)
    finally:
        load.stop()
        endpoints.stop()
    assert load.failures == [], load.failures
    assert found["adapters"] == [
        {"name": ADAPTER, "readyReplicas": REPLICAS, "replicas": REPLICAS, "state": "Ready"}
    ]
    assert identities(cluster, serving) == before  # same pods, same start, no restart
    for pod in ready_pods(cluster, serving, "tiny"):
        ip = pod["status"]["podIP"]
        assert served_models(ip) == {"tiny", ADAPTER}
        reply = complete(ip, ADAPTER)
        assert reply.status_code == 200, reply.text
        # The operator loaded it with signed calls; a caller without its key is refused (docs/security.md).
        unsigned = httpx.delete(f"http://{ip}:8000/v1/pagoda/adapters/{ADAPTER}", timeout=10)
        assert unsigned.status_code == 401, unsigned.text
    header, row = cluster.kubectl("-n", serving, "get", "inferenceservice", "tiny").stdout.splitlines()
    columns = header.split()
    assert "ADAPTERS" in columns and row.split()[columns.index("ADAPTERS")] == "1/1", (header, row)


def test_a_removed_adapter_drains_and_is_unloaded(cluster: Cluster, serving: str) -> None:
    before = identities(cluster, serving)
    endpoints = ServiceEndpoints(cluster, serving, "tiny")
    base = Load(endpoints.pick, "tiny", clients=1, pause=0.25, max_seconds=600).start()
    adapter = Load(endpoints.pick, ADAPTER, clients=1, pause=0.25, max_seconds=600).start()
    try:
        wait_until(lambda: adapter.completed >= 4, "requests for the adapter", timeout=120)
        served = adapter.completed
        set_adapters(cluster, serving, [])
        wait_until(
            lambda: status(cluster, serving).get("adaptersReady") == "0/0",
            "the adapter to leave the status",
            timeout=180,
        )
        for pod in ready_pods(cluster, serving, "tiny"):
            ip = pod["status"]["podIP"]
            wait_until(
                lambda ip=ip: ADAPTER not in served_models(ip), f"{ip} to unload {ADAPTER}", timeout=60
            )
    finally:
        adapter.stop()
        base.stop()
        endpoints.stop()
    assert base.failures == [], base.failures
    # Requests sent before the removal finished; those after it were refused with OpenAI's 404, never a 5xx.
    assert adapter.completed >= served
    assert {f.split(": ", 1)[1] for f in adapter.failures} <= {"HTTP 404"}, adapter.failures
    for pod in ready_pods(cluster, serving, "tiny"):
        reply = complete(pod["status"]["podIP"], ADAPTER)
        assert reply.status_code == 404 and reply.json()["error"]["type"] == "NotFoundError", reply.text
    assert identities(cluster, serving) == before
