"""Why not Ready, in the InferenceService's own words: what the real scheduler and API server say about its
pods becomes the Degraded reason (and the Ready reason, the Reason column of `kubectl get`), with a message
that names the field to change.

The pods run on kwok's fake GPU nodes (two nodes of 8 nvidia.com/gpu, labelled NVIDIA-H100-80GB-HBM3) beside
the tainted real-pods node, so the scheduler's verdicts are the real ones. An image that cannot be pulled
is not tested here (kwok pulls nothing): tests/unit/test_reconcile_pods.py covers it, and crash loops run
for real in e2e/test_real_pods.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from harness import OperatorProcess, wait_until
from isvc import condition, create, get, patch, wait_ready
from kubernetes import client

from e2e.lab.cluster import GPU_NODES, Cluster
from pagoda.operator.resources.meta import OWNER_LABEL

TAINT_KEY = "pagoda.dev/test-dedicated"


def wait_degraded(kube: client.CustomObjectsApi, name: str, namespace: str, reason: str) -> dict[str, Any]:
    """Waits until Degraded=True with `reason` for the current generation; returns the object."""

    def degraded() -> dict[str, Any] | None:
        obj = get(kube, name, namespace)
        cond = condition(obj, "Degraded")
        current = obj is not None and cond.get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and (cond.get("status"), cond.get("reason")) == ("True", reason) else None

    found: dict[str, Any] = wait_until(degraded, f"Degraded=True reason={reason} on {name}", timeout=90)
    return found


def reason_column(cluster: Cluster, name: str, namespace: str) -> str:
    """The Reason column of `kubectl get infsvc` (the CRD's printer column, evaluated by the API server)."""
    table = cluster.kubectl("get", "infsvc", name, "-n", namespace).stdout.splitlines()
    header, row = table[0].split(), table[1].split()
    return row[header.index("REASON")]


def assert_blocked(
    cluster: Cluster, obj: dict[str, Any], reason: str, fields: list[str], ready: str = "0/2"
) -> None:
    degraded = condition(obj, "Degraded")
    for field in fields:
        assert field in degraded["message"], (field, degraded["message"])
    assert (condition(obj, "Ready")["status"], condition(obj, "Ready")["reason"]) == ("False", reason)
    assert obj["status"]["readySummary"] == ready
    name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
    wait_until(
        lambda: reason_column(cluster, name, namespace) == reason, f"the Reason column to say {reason}"
    )


def test_not_enough_gpus(
    operator: OperatorProcess, cluster: Cluster, kube: client.CustomObjectsApi, namespace: str
) -> None:
    create(kube, "big", namespace, resources={"gpu": {"count": 16}})  # the nodes have 8 each
    obj = wait_degraded(kube, "big", namespace, "InsufficientGPU")
    assert_blocked(
        cluster, obj, "InsufficientGPU", ["no node has 16 free nvidia.com/gpu", "spec.resources.gpu.count"]
    )
    assert "Insufficient nvidia.com/gpu" in condition(obj, "Degraded")["message"]  # the scheduler's count
    # Fixing the field clears it.
    patch(kube, "big", namespace, {"resources": {"gpu": {"count": 1}}})
    wait_ready(kube, "big", namespace)


def test_a_rollout_with_every_gpu_allocated_is_blocked_until_it_may_roll_in_place(
    operator: OperatorProcess, cluster: Cluster, kube: client.CustomObjectsApi, namespace: str
) -> None:
    """Two replicas of 8 GPUs take both kwok GPU nodes; a spec change's surge replica finds no room (the
    default rollout keeps every old replica until a new one is Ready): RolloutBlocked names the fields, and
    rolling in place (maxUnavailable 1, maxSurge 0) completes it."""
    create(kube, "full", namespace, replicas=2, resources={"gpu": {"count": 8}})
    wait_ready(kube, "full", namespace, timeout=120)
    patch(kube, "full", namespace, {"engine": {"maxNumSeqs": 64}})  # a new pod template
    obj = wait_degraded(kube, "full", namespace, "RolloutBlocked")
    message = condition(obj, "Degraded")["message"]
    for part in (
        "of the rollout cannot be scheduled",
        "Insufficient nvidia.com/gpu",
        "spec.rollout.maxUnavailable",
    ):
        assert part in message, (part, message)
    patch(kube, "full", namespace, {"rollout": {"maxSurge": 0, "maxUnavailable": 1}})
    wait_ready(kube, "full", namespace, timeout=180)


def test_no_node_with_the_gpu_product(
    operator: OperatorProcess, cluster: Cluster, kube: client.CustomObjectsApi, namespace: str
) -> None:
    create(kube, "b200", namespace, resources={"gpu": {"count": 1, "product": "NVIDIA-B200"}})
    obj = wait_degraded(kube, "b200", namespace, "NoMatchingNode")
    assert_blocked(
        cluster,
        obj,
        "NoMatchingNode",
        ["nvidia.com/gpu.product=NVIDIA-B200", "spec.resources.gpu.product", "spec.scheduling.nodeSelector"],
    )


@pytest.fixture
def tainted_gpu_nodes(cluster: Cluster) -> Iterator[str]:
    """Both kwok GPU nodes tainted NoSchedule (as GPU nodes reserved for one team are); untainted after."""
    cluster.kubectl("taint", "node", *GPU_NODES, f"{TAINT_KEY}=llm:NoSchedule", "--overwrite")
    try:
        yield TAINT_KEY
    finally:
        cluster.kubectl("taint", "node", *GPU_NODES, f"{TAINT_KEY}-", check=False)


def test_untolerated_taint(
    operator: OperatorProcess,
    cluster: Cluster,
    kube: client.CustomObjectsApi,
    namespace: str,
    tainted_gpu_nodes: str,
) -> None:
    create(kube, "taint", namespace)
    obj = wait_degraded(kube, "taint", namespace, "UntoleratedTaint")
    assert_blocked(cluster, obj, "UntoleratedTaint", ["spec.scheduling.tolerations"])
    toleration = {"key": tainted_gpu_nodes, "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
    patch(kube, "taint", namespace, {"scheduling": {"tolerations": [toleration]}})
    wait_ready(kube, "taint", namespace)


def test_missing_model_claim(
    operator: OperatorProcess, cluster: Cluster, kube: client.CustomObjectsApi, namespace: str
) -> None:
    create(kube, "pvc", namespace, model={"uri": "pvc://models/llama-3-8b"})
    obj = wait_degraded(kube, "pvc", namespace, "VolumeClaimNotFound")
    assert_blocked(
        cluster,
        obj,
        "VolumeClaimNotFound",
        ["PersistentVolumeClaim models", "spec.model.uri pvc://models/llama-3-8b", f"namespace {namespace}"],
    )


def test_resource_quota_refuses_pods(
    operator: OperatorProcess,
    cluster: Cluster,
    kube: client.CustomObjectsApi,
    cluster_api: Any,
    namespace: str,
) -> None:
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="gpu"),
        spec=client.V1ResourceQuotaSpec(hard={"requests.nvidia.com/gpu": "1"}),
    )
    core = client.CoreV1Api(cluster_api)
    core.create_namespaced_resource_quota(namespace, quota)
    # Until the quota controller has set its status, admission refuses pods with "status unknown for quota".
    wait_until(
        lambda: (core.read_namespaced_resource_quota("gpu", namespace).status.hard or {}).get(
            "requests.nvidia.com/gpu"
        ),
        "the quota controller to set the ResourceQuota's status",
    )
    create(kube, "quota", namespace)  # two replicas of one GPU each: the second is refused
    wait_degraded(kube, "quota", namespace, "QuotaExceeded")
    obj = wait_until(
        lambda: (o := get(kube, "quota", namespace)) and o["status"].get("readySummary") == "1/2" and o,
        "the pod the quota allows to be ready",
    )
    assert_blocked(
        cluster,
        obj,
        "QuotaExceeded",
        ["ResourceQuota gpu", "limited: requests.nvidia.com/gpu=1", "spec.replicas"],
        "1/2",
    )


def test_limit_range_refuses_pods(
    operator: OperatorProcess,
    cluster: Cluster,
    kube: client.CustomObjectsApi,
    cluster_api: Any,
    namespace: str,
) -> None:
    limits = client.V1LimitRange(
        metadata=client.V1ObjectMeta(name="gpu-max"),
        spec=client.V1LimitRangeSpec(
            limits=[client.V1LimitRangeItem(type="Container", max={"nvidia.com/gpu": "1"})]
        ),
    )
    client.CoreV1Api(cluster_api).create_namespaced_limit_range(namespace, limits)
    create(kube, "limits", namespace, resources={"gpu": {"count": 2}})
    obj = wait_degraded(kube, "limits", namespace, "AdmissionRejected")
    assert_blocked(
        cluster,
        obj,
        "AdmissionRejected",
        ["LimitRange", "maximum nvidia.com/gpu usage per Container is 1, but limit is 2", "spec.resources"],
    )


def _serving_pods(core: client.CoreV1Api, name: str, namespace: str) -> list[str]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"{OWNER_LABEL}={name}").items
    return sorted(p.metadata.name for p in pods if p.metadata.deletion_timestamp is None)


def _evict(core: client.CoreV1Api, pod: str, namespace: str) -> int:
    """The eviction API's answer for `pod`, as `kubectl drain` calls it: 201 evicted, 429 refused by the
    PodDisruptionBudget."""
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
    try:
        core.create_namespaced_pod_eviction(pod, namespace, body)
    except client.ApiException as exc:
        return int(exc.status)
    return 201


def _disruptions_allowed(policy: client.PolicyV1Api, name: str, namespace: str, want: int) -> bool:
    status = policy.read_namespaced_pod_disruption_budget(name, namespace).status
    return status is not None and (status.expected_pods, status.disruptions_allowed) == (want, 1)


@pytest.fixture
def cordon(cluster: Cluster) -> Iterator[Callable[[], None]]:
    """Cordons both kwok GPU nodes when called, as `kubectl drain` does before its evictions, so that an
    evicted replica's replacement stays Pending (the drain's outage, and a budget that stays spent);
    uncordons them after the test."""

    def cordon_nodes() -> None:
        cluster.kubectl("cordon", *GPU_NODES)

    yield cordon_nodes
    cluster.kubectl("uncordon", *GPU_NODES, check=False)


def test_a_drain_that_would_take_every_replica_is_reported_and_two_replicas_keep_one_serving(
    operator: OperatorProcess,
    cluster: Cluster,
    kube: client.CustomObjectsApi,
    cluster_api: Any,
    namespace: str,
    cordon: Callable[[], None],
) -> None:
    """One replica under the default budget (maxUnavailable 1): DisruptionTolerant=False names what to
    change, and a drain (cordon, then the eviction API) does take the only replica: Ready turns False. With
    two replicas the condition is True, and the real disruption controller lets one eviction through and
    refuses the second (429): the drain leaves a replica serving."""
    core, policy = client.CoreV1Api(cluster_api), client.PolicyV1Api(cluster_api)
    create(kube, "solo", namespace, replicas=1)
    obj = wait_ready(kube, "solo", namespace)
    tolerant = condition(obj, "DisruptionTolerant")
    assert (tolerant["status"], tolerant["reason"]) == ("False", "DrainTakesEveryReplica"), tolerant
    assert "spec.replicas to 2" in tolerant["message"] and "maxUnavailable" in tolerant["message"]
    assert condition(obj, "Degraded")["status"] == "False"  # a risk, not a fault
    wait_until(lambda: _disruptions_allowed(policy, "solo", namespace, 1), "the PDB to count the replica")
    cordon()
    (only,) = _serving_pods(core, "solo", namespace)
    assert _evict(core, only, namespace) == 201  # the budget lets the drain take the only replica
    wait_until(
        lambda: condition(get(kube, "solo", namespace), "Ready").get("status") == "False",
        "Ready=False: the drain's outage",
    )
    cluster.kubectl("uncordon", *GPU_NODES)
    wait_ready(kube, "solo", namespace)

    patch(kube, "solo", namespace, {"replicas": 2})

    def tolerant_now() -> dict[str, Any] | None:
        found = get(kube, "solo", namespace)
        cond = condition(found, "DisruptionTolerant")
        current = found is not None and cond.get("observedGeneration") == found["metadata"]["generation"]
        return cond if current and cond.get("status") == "True" else None

    cond = wait_until(tolerant_now, "DisruptionTolerant=True at two replicas", timeout=90)
    assert cond["reason"] == "ReplicasKeptDuringDrain" and "at most 1 of 2" in cond["message"], cond
    wait_ready(kube, "solo", namespace)
    wait_until(lambda: _disruptions_allowed(policy, "solo", namespace, 2), "the PDB to count both replicas")
    cordon()
    first, second = _serving_pods(core, "solo", namespace)
    assert _evict(core, first, namespace) == 201
    assert _evict(core, second, namespace) == 429  # the budget keeps one replica serving
    kept = core.read_namespaced_pod(second, namespace)
    assert kept.metadata.deletion_timestamp is None
    assert any(c.type == "Ready" and c.status == "True" for c in kept.status.conditions or [])
