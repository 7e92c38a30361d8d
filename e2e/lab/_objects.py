"""API objects every local control plane starts with: the third-party CRDs and the fake GPU nodes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from e2e.lab.processes import Launcher, wait_until
from pagoda.operator.resources.meta import GPU_PRODUCT_LABEL

GPU_RESOURCE = "nvidia.com/gpu"
# kwok manages the nodes that carry it (--manage-nodes-with-annotation-selector).
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node=fake"


def request(api: Any, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """A raw API call through a kubernetes ApiClient, without the client's models: (status, JSON)."""
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    m, url, hdrs, data, _ = api.param_serialize(
        method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
    )
    resp = api.call_api(m, url, hdrs, data)
    raw = resp.read()
    return resp.status, json.loads(raw) if raw else None


def _create(api: Any, path: str, body: dict[str, Any]) -> None:
    status, result = request(api, "POST", path, body)
    if status not in (201, 409):  # 409: already there, a reused workdir
        raise RuntimeError(f"Creating {body['kind']} {body['metadata']['name']} failed ({status}): {result}")


def create_crds(api: Any, crd_dir: Path, names: Iterable[str]) -> list[str]:
    """Creates the CRDs from their upstream YAML files; returns their names."""
    created = []
    for name in names:
        for doc in yaml.safe_load_all((crd_dir / name).read_text()):
            if doc:
                _create(api, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)
                created.append(doc["metadata"]["name"])
    return created


# kwok's own convention for its nodes. The harness taints them when a real node runs, so that a plain pod
# lands on the real node and only pods that ask for simulation (KWOK_SCHEDULING) come here.
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
KWOK_SCHEDULING = {
    "nodeSelector": {"type": "kwok"},
    "tolerations": [{"key": KWOK_TAINT["key"], "operator": "Exists", "effect": KWOK_TAINT["effect"]}],
}


def fake_gpu_node(name: str, product: str, ip: str, *, tainted: bool = False) -> dict[str, Any]:
    """A Node that kwok manages: 8 GPUs, 64 CPUs, 512Gi memory, 110 pods; KWOK_TAINT when `tainted`."""
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU_RESOURCE: "8", "ephemeral-storage": "1Ti"}
    key, value = FAKE_NODE_ANNOTATION.split("=")
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {key: value},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                GPU_PRODUCT_LABEL: product,
                "nvidia.com/gpu.count": "8",
            },
        },
        "spec": {"taints": [KWOK_TAINT]} if tainted else {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
        },
    }


def create_fake_gpu_node(api: Any, name: str, product: str, ip: str, *, tainted: bool = False) -> None:
    _create(api, "/api/v1/nodes", fake_gpu_node(name, product, ip, tainted=tainted))


def _condition(obj: dict[str, Any], kind: str) -> str | None:
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status"))
    return None


def wait_crds_established(launcher: Launcher, api: Any, names: Iterable[str], deadline: float) -> None:
    for name in names:

        def established(name: str = name) -> bool:
            _, crd = request(api, "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            return _condition(crd, "Established") == "True"

        launcher.wait(established, f"CRD {name} to be Established", deadline)


def wait_nodes_ready(
    launcher: Launcher, api: Any, names: Iterable[str], deadline: float, log_of: str = "kwok"
) -> None:
    for name in names:

        def ready(name: str = name) -> bool:
            status, node = request(api, "GET", f"/api/v1/nodes/{name}")
            if status != 200 or _condition(node, "Ready") != "True":
                return False
            # The node lifecycle controller removes the not-ready taint some seconds after Ready; until
            # then the scheduler keeps pods off the node.
            taints = node.get("spec", {}).get("taints") or []
            return not any(t.get("key") == "node.kubernetes.io/not-ready" for t in taints)

        launcher.wait(ready, f"node {name} to be Ready ({log_of})", deadline, log_of=log_of)


def wait_service_account(launcher: Launcher | None, api: Any, namespace: str, deadline: float) -> None:
    """Waits for the namespace's `default` ServiceAccount (made by the controller manager): until it
    exists, the API server rejects pods in that namespace."""

    def exists() -> bool:
        status, result = request(api, "GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
        if status not in (200, 404):
            raise RuntimeError(f"Reading ServiceAccount {namespace}/default failed ({status}): {result}")
        return status == 200

    what = f"ServiceAccount {namespace}/default"
    if launcher is not None:
        launcher.wait(exists, what, deadline, "kube-controller-manager")
    else:
        wait_until(exists, what, timeout=deadline - time.monotonic(), interval=0.1)
