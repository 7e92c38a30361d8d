"""Node loss: one of the two kwok GPU nodes stops heartbeating, as a node whose kubelet died does, and the
real node lifecycle controller (kube-controller-manager, default --node-monitor-grace-period of 50 s) marks
it Unknown, taints it unreachable and turns its pods' Ready condition False. The status names the lost pod
and node (Degraded and Ready reason NodeLost) while the replica on the other node serves and is counted;
when the node heartbeats again the reason clears.

How a kwok node stops: kwok runs with node leases (--node-lease-duration-seconds, e2e/lab/cluster.py) and
manages only the nodes whose Lease it holds (several kwok instances share a cluster that way). The test takes
the node's Lease as another holder that never renews it: kwok stops renewing the Lease and stops writing the
node's and its pods' status, exactly what kube-controller-manager sees of a dead kubelet. Handing the Lease
back expired makes kwok take it again at its next try and report the node Ready.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from harness import OperatorProcess, wait_until
from isvc import condition, create, get, wait_ready
from kubernetes import client

from e2e.lab.cluster import GPU_NODES, Cluster
from pagoda.operator.resources.meta import OWNER_LABEL
from pagoda.operator.status.nodes import UNREACHABLE_TAINT

LEASE_NAMESPACE = "kube-node-lease"
DEAD_KUBELET = "pagoda-test-dead-kubelet"  # the Lease holder that never renews
TOUCH_ANNOTATION = "pagoda.dev/test-node-loss"
# kube-controller-manager's --node-monitor-grace-period (50 s by default, not set by the harness) plus its
# --node-monitor-period (5 s), with room for a loaded machine.
LOSS_TIMEOUT_S = 150


def _renewed(coord: client.CoordinationV1Api, node: str) -> tuple[str | None, datetime | None]:
    spec = coord.read_namespaced_lease(node, LEASE_NAMESPACE).spec
    return spec.holder_identity, spec.renew_time


def _replace_lease(coord: client.CoordinationV1Api, node: str, holder: str, duration: int) -> None:
    """Sets the Lease's holder and duration, leaving its renewTime: kube-controller-manager sees no renewal.
    Retries a conflict with kwok's own renewal."""

    def replaced() -> bool:
        lease = coord.read_namespaced_lease(node, LEASE_NAMESPACE)
        lease.spec.holder_identity, lease.spec.lease_duration_seconds = holder, duration
        try:
            coord.replace_namespaced_lease(node, LEASE_NAMESPACE, lease)
        except client.ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    wait_until(replaced, f"the Lease of {node} to be {holder}'s for {duration} s", timeout=30)


def _node_ready(core: client.CoreV1Api, node: str) -> str | None:
    conditions = core.read_node(node).status.conditions or []
    return next((c.status for c in conditions if c.type == "Ready"), None)


def _unreachable(core: client.CoreV1Api, node: str) -> bool:
    return any(t.key == UNREACHABLE_TAINT for t in core.read_node(node).spec.taints or [])


class Kubelet:
    """Stops and restarts the heartbeat of one kwok node (see the module's docstring)."""

    def __init__(self, cluster: Cluster, api: Any, node: str) -> None:
        self.cluster, self.node = cluster, node
        self.core, self.coord = client.CoreV1Api(api), client.CoordinationV1Api(api)
        self.stopped = False

    def stop(self) -> float:
        """Stops the heartbeat right after kwok renewed the Lease; returns when (time.monotonic()).

        kwok schedules each node's next status heartbeat 10 to 20 min ahead, from the node as it last
        handled it, and plays it even for a node it no longer manages: a node changed just before (this
        annotation) pushes that heartbeat past the test. kwok renews the Lease every 10 s; waiting for a
        renewal after the change lets kwok handle the change first."""
        stamp = datetime.now(UTC).isoformat()
        self.cluster.kubectl("annotate", "node", self.node, f"{TOUCH_ANNOTATION}={stamp}", "--overwrite")
        _, before = _renewed(self.coord, self.node)
        wait_until(lambda: _renewed(self.coord, self.node)[1] != before, f"kwok to renew {self.node}'s Lease")
        _replace_lease(self.coord, self.node, DEAD_KUBELET, 3600)
        self.stopped = True
        return time.monotonic()

    def restart(self) -> None:
        """Hands the Lease back expired: kwok takes it within 10 s and reports the node Ready again."""
        _replace_lease(self.coord, self.node, DEAD_KUBELET, 1)
        wait_until(
            lambda: _renewed(self.coord, self.node)[0] != DEAD_KUBELET,
            f"kwok to take {self.node}'s Lease back",
        )
        self.stopped = False

    def wait_healthy(self, timeout: float = 90) -> None:
        wait_until(
            lambda: _node_ready(self.core, self.node) == "True" and not _unreachable(self.core, self.node),
            f"{self.node} Ready and untainted",
            timeout=timeout,
        )


@pytest.fixture
def kubelet(cluster: Cluster, cluster_api: Any) -> Iterator[Kubelet]:
    """The heartbeat of the second kwok GPU node; restored (the node Ready, untainted) after the test, so
    the session's other tests find both nodes as they were."""
    handle = Kubelet(cluster, cluster_api, GPU_NODES[1])
    try:
        yield handle
    finally:
        if handle.stopped or _renewed(handle.coord, handle.node)[0] == DEAD_KUBELET:
            handle.restart()
        handle.wait_healthy()
        cluster.kubectl("annotate", "node", handle.node, f"{TOUCH_ANNOTATION}-", check=False)


def _pods(core: client.CoreV1Api, name: str, namespace: str) -> dict[str, Any]:
    """The service's pods by node."""
    pods = core.list_namespaced_pod(namespace, label_selector=f"{OWNER_LABEL}={name}").items
    return {p.spec.node_name: p for p in pods if p.metadata.deletion_timestamp is None}


def _pod_ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def test_replicas_on_a_node_that_stops_heartbeating_are_named_and_the_rest_keep_serving(
    operator: OperatorProcess,
    cluster: Cluster,
    kube: client.CustomObjectsApi,
    cluster_api: Any,
    namespace: str,
    kubelet: Kubelet,
) -> None:
    core = client.CoreV1Api(cluster_api)
    create(kube, "spread", namespace, replicas=2, resources={"gpu": {"count": 8}})  # one replica per node
    wait_ready(kube, "spread", namespace, timeout=120)
    pods = _pods(core, "spread", namespace)
    assert sorted(pods) == sorted(GPU_NODES), pods
    lost, kept = pods[kubelet.node].metadata.name, pods[GPU_NODES[0]].metadata.name

    stopped = kubelet.stop()

    def node_lost() -> dict[str, Any] | None:
        """Degraded NodeLost, and Ready too once the Deployment counts the lost replica out (the node's
        Unknown and the pod's Ready False reach the operator as separate events)."""
        obj = get(kube, "spread", namespace)
        degraded, ready = condition(obj, "Degraded"), condition(obj, "Ready")
        lost_now = (degraded.get("status"), degraded.get("reason")) == ("True", "NodeLost")
        return obj if lost_now and ready.get("reason") == "NodeLost" else None

    obj = wait_until(node_lost, "Degraded=True and Ready=False, reason NodeLost", timeout=LOSS_TIMEOUT_S)
    reported = time.monotonic() - stopped
    # What the real node lifecycle controller did: the node Unknown and tainted, the lost pod not Ready.
    assert _node_ready(core, kubelet.node) == "Unknown"
    assert not _pod_ready(core.read_namespaced_pod(lost, namespace))
    message = condition(obj, "Degraded")["message"]
    assert message.startswith(f"pod {lost} on node {kubelet.node}, which stopped reporting at "), message
    assert "(Ready Unknown: NodeStatusUnknown" in message, message
    assert f"`kubectl delete node {kubelet.node}`" in message, message
    assert kept not in message, message
    ready = condition(obj, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NodeLost"), ready
    # The replica on the other node serves and is counted.
    assert _pod_ready(core.read_namespaced_pod(kept, namespace))
    assert (obj["status"]["readyReplicas"], obj["status"]["readySummary"]) == (1, "1/2"), obj["status"]

    wait_until(lambda: _unreachable(core, kubelet.node), f"the {UNREACHABLE_TAINT} taint", timeout=30)
    wait_until(
        lambda: "tolerated for 300 s" in condition(get(kube, "spread", namespace), "Degraded")["message"],
        "the eviction time from the taint",
        timeout=30,
    )

    kubelet.restart()
    restarted = time.monotonic()
    kubelet.wait_healthy()

    def cleared() -> dict[str, Any] | None:
        obj = get(kube, "spread", namespace)
        degraded, ready = condition(obj, "Degraded"), condition(obj, "Ready")
        return obj if "NodeLost" not in (degraded.get("reason"), ready.get("reason")) else None

    obj = wait_until(cleared, "NodeLost to clear", timeout=60)
    cleared_after = time.monotonic() - restarted
    assert (condition(obj, "Degraded")["status"], condition(obj, "Degraded")["reason"]) == (
        "False",
        "Reconciled",
    )
    assert lost not in str(obj["status"]["conditions"])
    # kwok makes only Pending pods Ready; a kubelet that reports again marks its running pods Ready itself.
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    core.patch_namespaced_pod_status(
        lost,
        namespace,
        {"status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}},
    )
    obj = wait_ready(kube, "spread", namespace)
    assert obj["status"]["readySummary"] == "2/2"
    print(f"\nnode_loss reported_after_s={reported:.1f} cleared_after_restart_s={cleared_after:.1f}")
