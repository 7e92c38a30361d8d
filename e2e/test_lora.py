"""LoRA adapters on real runtimes (issue #11): added to and removed from a running two-replica service
without a restart, under load; the base model comes from S3 (MinIO) through the node's model cache.

0. The node cache (spec.model.cache.scope Node): the two replicas start together; one downloads the base
   model, the other waits for that download and moves no byte; status.startup (fetchedBytes) and
   status.modelCache say so, and the namespace's folder on the node belongs to the runtime's user.
1. Adding an adapter to spec.lora.adapters loads it into both replicas at run time: the pods keep their uid,
   start time and restart count; a light load on the base model fails no request; both pods list it in
   /v1/models and answer requests for it; status.adapters says 2/2 replicas and `kubectl get` 1/1.
2. Removing it drains and unloads it: requests for it already running finish, later ones get OpenAI's 404 at
   every pod, and the status no longer lists it.

The adapter is the one the CPU runtime image carries for its tiny model (`pagoda-runtime make-tiny-adapter`);
the base model is a tiny model made on the host with the same shapes, uploaded to MinIO on the node's
address. The node cache needs the namespace's Pod Security level privileged (a hostPath volume, a root init
container); the test removes the namespace's folder on the node before and after.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from e2e.lab import realnode
from e2e.lab.chartenv import ChartOperator
from e2e.lab.cluster import Cluster
from e2e.lab.minio import USER, MinioServer
from e2e.lab.observability import Load
from e2e.lab.processes import VENV_BIN, wait_until
from e2e.lab.realpods import ServiceEndpoints, apply, get_json, patch_spec, ready_pods, wait_condition
from e2e.lab.samples import tiny_sample
from pagoda.operator.api.model import NODE_CACHE_ROOT
from pagoda.operator.resources.pod import RUN_AS_USER

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
REPLICAS = 2
ADAPTER = "sql"
# The CPU runtime image carries this adapter for its tiny model (runtime/Dockerfile.cpu), like the model.
ADAPTER_URI = f"file:///models/adapters/{ADAPTER}"
LIMITS = {"maxLoras": 2, "maxLoraRank": 8, "maxCpuLoras": 2}
BUCKET, PREFIX = "models", "llama/tiny"
MODEL_URI = f"s3://{BUCKET}/{PREFIX}"
CACHE_BOUND = "1Gi"


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
def store(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MinioServer, int]]:
    """MinIO on the node's address (pods reach the host there) holding a tiny model; the model's bytes."""
    assert cluster.node is not None, "the runtime pods need the real node"
    work = tmp_path_factory.mktemp("model-store")
    model = work / "tiny"
    subprocess.run([str(VENV_BIN / "pagoda-runtime"), "make-tiny-model", str(model)], check=True)
    with MinioServer(work, cluster.bin_dir, host=cluster.node.address).start() as server:
        yield server, server.upload(BUCKET, PREFIX, model)


@pytest.fixture(scope="module")
def serving(cluster: Cluster, operator: ChartOperator, store: tuple[MinioServer, int]) -> Iterator[str]:
    """A Ready two-replica `tiny` service with LoRA limits and no adapter yet, its model from MinIO through
    the node cache."""
    namespace, (server, _) = "lora", store
    folder = Path(NODE_CACHE_ROOT) / namespace
    shutil.rmtree(folder, ignore_errors=True)  # a run before this one left nothing cached
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=privileged")
    cluster.kubectl(
        *("create", "secret", "generic", "models", "-n", namespace),
        f"--from-literal=AWS_ACCESS_KEY_ID={USER}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={server.password}",
        f"--from-literal=AWS_ENDPOINT_URL={server.url}",
    )
    sample = tiny_sample(namespace, real_pods=True)
    sample["spec"]["replicas"] = REPLICAS
    sample["spec"]["model"] = {
        "uri": MODEL_URI,
        "servedName": "tiny",
        "credentialsSecret": "models",
        "cache": {"scope": "Node", "size": CACHE_BOUND},
    }
    sample["spec"]["runtime"]["startupTimeoutSeconds"] = 900
    sample["spec"]["lora"] = {**LIMITS, "adapters": []}
    apply(cluster, sample)
    try:
        wait_condition(cluster, namespace, "tiny", "Ready", timeout=600)
        wait_until(
            lambda: len(ready_pods(cluster, namespace, "tiny")) == REPLICAS, "2 Ready pods", timeout=600
        )
        yield namespace
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
        shutil.rmtree(folder, ignore_errors=True)  # files the stopping runtimes hold open go when they exit


def test_the_replicas_downloaded_the_base_model_once_into_the_node_cache(
    cluster: Cluster, serving: str, store: tuple[MinioServer, int]
) -> None:
    _, size = store

    def both_recorded() -> dict[str, Any] | None:
        found = status(cluster, serving)
        recent = (found.get("startup") or {}).get("recent") or []
        return found if len(recent) == REPLICAS and found.get("modelCache") else None

    found = wait_until(both_recorded, "both starts and the node cache in the status", timeout=120)
    # One replica downloaded the model; the other waited for it and found every file in place.
    assert sorted(start["fetchedBytes"] for start in found["startup"]["recent"]) == [0, size]
    assert {start["modelBytes"] for start in found["startup"]["recent"]} == {size}
    [node] = found["modelCache"]["nodes"]
    assert (node["node"], node["bytes"], node["maxBytes"]) == (realnode.NODE_NAME, size, 1024**3)
    assert [(m["uri"], m["bytes"], m["inUse"]) for m in node["models"]] == [(MODEL_URI, size, True)]
    # The namespace's folder on the node, handed to the runtime's user by the init container.
    folder = Path(NODE_CACHE_ROOT) / serving
    assert folder.stat().st_uid == RUN_AS_USER
    [model] = (folder / "s3").glob(f"*/{BUCKET}/{PREFIX}")  # one folder per store: this test's MinIO
    assert (model / "config.json").is_file()


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
