"""The local control plane itself: it serves, RBAC is enforced, the scheduler places GPU pods on the
fake GPU nodes and kwok makes them Ready, the garbage collector runs, and the third-party CRDs carry
their real schemas."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.lab import realnode
from e2e.lab._objects import GPU_RESOURCE, KWOK_SCHEDULING, KWOK_TAINT, request
from e2e.lab.cluster import COMPONENTS, GPU_NODES, GPU_PRODUCT, Cluster, ToolsMissingError, check_bin_dir
from e2e.lab.processes import REPO_ROOT, all_alive, wait_until
from pagoda.operator.resources.meta import GPU_PRODUCT_LABEL

pytestmark = pytest.mark.e2e
# What `python -m e2e.lab up --no-real-node` runs: the control plane and the operator. The add-ons
# (KEDA, kube-state-metrics, the Prometheus Operator's Prometheus pod) need a real node.
UP_COMPONENTS = [*COMPONENTS, "pagoda-operator"]


def test_cluster_serves_with_fake_gpu_nodes_and_the_real_node(cluster: Cluster) -> None:
    assert cluster.kubectl("get", "--raw", "/readyz").stdout == "ok"
    nodes = {
        n["metadata"]["name"]: n
        for n in json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    }
    assert sorted(nodes) == sorted([*GPU_NODES, realnode.NODE_NAME])
    kubelet_node = nodes.pop(realnode.NODE_NAME)  # e2e/test_real_node.py checks it further
    assert [c["status"] for c in kubelet_node["status"]["conditions"] if c["type"] == "Ready"] == ["True"]
    assert kubelet_node["status"]["allocatable"][GPU_RESOURCE] == realnode.GPU_CAPACITY
    assert not kubelet_node["spec"].get("taints"), "a plain pod must land on the real node"
    for node in nodes.values():  # kwok's, tainted so that only pods asking for simulation go there
        assert node["spec"]["taints"] == [KWOK_TAINT]
        assert node["status"]["allocatable"][GPU_RESOURCE] == "8"
        assert node["metadata"]["labels"][GPU_PRODUCT_LABEL] == GPU_PRODUCT
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"


def test_rbac_denies_an_unprivileged_service_account(
    cluster: Cluster, cluster_api: Any, namespace: str
) -> None:
    sa_path = f"/api/v1/namespaces/{namespace}/serviceaccounts"
    assert _post(cluster_api, sa_path, {"metadata": {"name": "nobody"}})
    token = _post(cluster_api, f"{sa_path}/nobody/token", {"spec": {"expirationSeconds": 600}})["status"][
        "token"
    ]
    config = client.Configuration(host=cluster.server, api_key={"BearerToken": f"Bearer {token}"})
    config.ssl_ca_cert = cluster_api.configuration.ssl_ca_cert
    with client.ApiClient(config) as as_nobody:
        status, review = request(
            as_nobody, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", {"spec": {}}
        )
        assert status == 201, review
        assert review["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:nobody"
        status, denied = request(as_nobody, "GET", "/api/v1/namespaces/kube-system/secrets")
        assert status == 403, denied
        assert denied["reason"] == "Forbidden"


def _gpu_deployment(name: str, gpus: int) -> dict[str, Any]:
    labels = {"app": name}
    container = {
        "name": "main",
        "image": "pagoda-runtime:fake",  # never pulled: it asks for kwok's nodes, which only simulate it
        "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [container], **KWOK_SCHEDULING},
            },
        },
    }


def _post(api: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, result = request(api, "POST", path, body)
    assert status == 201, result
    return dict(result)


def _get(api: Any, path: str) -> dict[str, Any] | None:
    status, result = request(api, "GET", path)
    assert status in (200, 404), result
    return dict(result) if status == 200 else None


def _pods(api: Any, namespace: str, app: str) -> list[dict[str, Any]]:
    pods = _get(api, f"/api/v1/namespaces/{namespace}/pods?labelSelector=app%3D{app}")
    return list(pods["items"]) if pods else []


def _condition(pod: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in pod.get("status", {}).get("conditions") or [] if c["type"] == kind), None)


def test_gpu_pod_is_scheduled_on_a_fake_gpu_node_and_ready(cluster_api: Any, namespace: str) -> None:
    deployments = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    _post(cluster_api, deployments, _gpu_deployment("one-gpu", 1))
    _post(cluster_api, deployments, _gpu_deployment("nine-gpus", 9))

    def ready_pod() -> dict[str, Any] | None:
        return next(
            (
                p
                for p in _pods(cluster_api, namespace, "one-gpu")
                if (_condition(p, "Ready") or {}).get("status") == "True"
            ),
            None,
        )

    pod = wait_until(ready_pod, "the one-GPU pod to be Ready")
    assert pod["spec"]["nodeName"] in GPU_NODES
    assert pod["status"]["phase"] == "Running"
    assert pod["status"]["hostIP"].startswith("10.254.0.")

    def available() -> bool:
        deployment = _get(cluster_api, f"{deployments}/one-gpu") or {}
        return bool(deployment.get("status", {}).get("availableReplicas") == 1)

    wait_until(available, "Deployment one-gpu to be available")

    # No node has 9 GPUs: the real scheduler must refuse, naming the resource.
    def unschedulable() -> dict[str, Any] | None:
        pods = _pods(cluster_api, namespace, "nine-gpus")
        cond = _condition(pods[0], "PodScheduled") if pods else None
        return cond if cond and cond.get("reason") == "Unschedulable" else None

    cond = wait_until(unschedulable, "the nine-GPU pod to be reported Unschedulable")
    assert f"Insufficient {GPU_RESOURCE}" in cond["message"]


def test_garbage_collector_deletes_owned_objects(cluster_api: Any, namespace: str) -> None:
    # Through the typed client, as the operator's code would.
    core = client.CoreV1Api(cluster_api)
    owner = core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    assert owner.metadata and owner.metadata.uid
    ref = client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)
    owned = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owned", owner_references=[ref]))
    core.create_namespaced_config_map(namespace, owned)
    core.delete_namespaced_config_map("owner", namespace)
    path = f"/api/v1/namespaces/{namespace}/configmaps/owned"
    wait_until(lambda: _get(cluster_api, path) is None, "the garbage collector to delete ConfigMap owned")


def _scaled_object(name: str, **spec: Any) -> dict[str, Any]:
    trigger = {
        "type": "prometheus",
        "metadata": {"serverAddress": "http://prometheus:9090", "query": "sum(x)", "threshold": "5"},
    }
    base = {
        "scaleTargetRef": {"name": name},
        "minReplicaCount": 1,
        "maxReplicaCount": 3,
        "triggers": [trigger],
    }
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name},
        "spec": {**base, **spec},
    }


def test_keda_schema_rejects_an_invalid_scaled_object(cluster_api: Any, namespace: str) -> None:
    path = f"/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects"
    status, created = request(cluster_api, "POST", path, _scaled_object("good"))
    assert status == 201, created

    status, rejected = request(cluster_api, "POST", path, _scaled_object("bad", minReplicaCount="three"))
    assert status == 422, rejected
    assert "spec.minReplicaCount" in rejected["message"]

    status, rejected = request(cluster_api, "POST", path, _scaled_object("no-triggers", triggers=None))
    assert status == 422, rejected
    assert "spec.triggers" in rejected["message"]


def test_prometheus_operator_crds_are_served(cluster_api: Any, namespace: str) -> None:
    monitor: dict[str, Any] = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "m"},
        "spec": {
            "selector": {"matchLabels": {"app": "x"}},
            "endpoints": [{"port": "http", "interval": "15s"}],
        },
    }
    path = f"/apis/monitoring.coreos.com/v1/namespaces/{namespace}/servicemonitors"
    status, created = request(cluster_api, "POST", path, monitor)
    assert status == 201, created
    monitor["metadata"]["name"] = "bad"
    monitor["spec"]["endpoints"] = [{"port": "http", "interval": "often"}]
    status, rejected = request(cluster_api, "POST", path, monitor)
    assert status == 422, rejected
    assert "interval" in rejected["message"]


def test_missing_binaries_fail_naming_make_tools(tmp_path: Path) -> None:
    with pytest.raises(ToolsMissingError, match=r"kube-apiserver.*Run `make tools`"):
        check_bin_dir(tmp_path)


def test_cli_up_and_down_manage_exactly_their_processes(cluster: Cluster, tmp_path: Path) -> None:
    workdir, kubeconfig = tmp_path / "cluster", tmp_path / "kubeconfig"
    cli = [sys.executable, "-m", "e2e.lab"]
    # Without a real node: one per machine, and the session's cluster has it.
    flags = [f"--workdir={workdir}", f"--kubeconfig={kubeconfig}", "--no-real-node"]
    env = {**os.environ, "PAGODA_BIN": str(cluster.bin_dir)}
    up = subprocess.run(
        [*cli, "up", *flags], capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=180
    )
    state = Cluster.load_state(workdir)
    try:
        assert up.returncode == 0, up.stderr
        assert state is not None and sorted(state.pids) == sorted(UP_COMPONENTS)
        assert all_alive(state.pids, cluster.bin_dir)
        detached = Cluster.from_kubeconfig(kubeconfig, cluster.bin_dir)
        assert detached.server == state.server != cluster.server
        assert detached.kubectl("get", "--raw", "/readyz").stdout == "ok"
    finally:
        down = subprocess.run(
            [*cli, "down", *flags], capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=60
        )
    assert down.returncode == 0, down.stderr
    assert state is not None
    assert not any(all_alive({name: pid}, cluster.bin_dir) for name, pid in state.pids.items())
    assert not kubeconfig.exists()
    # The session's own cluster is untouched.
    assert cluster.kubectl("get", "--raw", "/readyz").stdout == "ok"
