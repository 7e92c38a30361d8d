"""Replicas on a lost node (NodeLost): which pods, which node, since when, what happens next; from the Node's
Ready condition and the node lifecycle controller's taints, as kube-controller-manager writes them."""

from __future__ import annotations

from typing import Any

import pytest

from pagoda.operator.handlers import build_registry
from pagoda.operator.kube.cache import ObjectCache
from pagoda.operator.kube.client import KubeError
from pagoda.operator.kube.workqueue import WorkQueue
from pagoda.operator.main import refresh_nodes
from pagoda.operator.status.nodes import (
    NOT_READY_TAINT,
    UNREACHABLE_TAINT,
    health,
    lost_node_issue,
    lost_replicas,
    node_loss,
    slim_node,
    toleration_seconds,
)
from pagoda.operator.status.report import Observed, compute_status
from tests.unit.test_status_conditions import SELECTOR, deployment, owner, pending_pod

STOPPED = "2026-12-05T10:00:00Z"
TAINTED = "2026-12-05T10:00:04Z"
# What the DefaultTolerationSeconds admission plugin adds to every pod that sets neither toleration.
DEFAULT_TOLERATIONS = [
    {"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": NOT_READY_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
]


def node(
    name: str = "gpu-1",
    ready: str = "True",
    taints: list[dict[str, Any]] | None = None,
    heartbeat: str = "2026-12-05T09:59:50Z",
    version: str = "10",
) -> dict[str, Any]:
    """A Node as the API server returns it; `ready` as the kubelet or the node lifecycle controller set it."""
    reasons = {
        "True": ("KubeletReady", "kubelet is posting ready status"),
        "Unknown": ("NodeStatusUnknown", "Kubelet stopped posting node status."),
        "False": ("KubeletNotReady", "container runtime is down"),
    }
    reason, message = reasons[ready]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": version},
        "spec": {"taints": taints or []},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": heartbeat},
                {
                    "type": "Ready",
                    "status": ready,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": heartbeat,
                    "lastTransitionTime": STOPPED,
                },
            ]
        },
    }


def taint(
    key: str = UNREACHABLE_TAINT, effect: str = "NoExecute", added: str | None = TAINTED
) -> dict[str, Any]:
    return {"key": key, "effect": effect, **({"timeAdded": added} if added else {})}


def lost(ready: str = "Unknown", taints: list[dict[str, Any]] | None = None, name: str = "gpu-1") -> Any:
    return slim_node(node(name, ready, [taint()] if taints is None else taints))


def pod(
    name: str,
    node_name: str | None = "gpu-1",
    ready: bool = False,
    deleting: str | None = None,
    tolerations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A runtime pod as the cache holds it; the node lifecycle controller turns Ready False on a lost node."""
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if deleting:
        meta["deletionTimestamp"] = deleting
    spec: dict[str, Any] = {"tolerations": DEFAULT_TOLERATIONS if tolerations is None else tolerations}
    if node_name:
        spec["nodeName"] = node_name
    status = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [
            {"name": "runtime", "ready": ready, "restartCount": 0, "state": {"running": {}}}
        ],
    }
    return {"metadata": meta, "spec": spec, "status": status}


def issue(pods: list[dict[str, Any]], nodes: dict[str, Any] | None) -> Any:
    return lost_node_issue(lost_replicas(pods, nodes))


def test_a_node_that_stopped_reporting_names_the_pod_the_node_when_and_what_comes_next() -> None:
    found = issue(
        [pod("llm-a"), pod("llm-b", "gpu-2", ready=True)], {"gpu-1": lost(), "gpu-2": lost("True", [])}
    )
    assert found is not None and found.reason == "NodeLost"
    assert found.message == (
        f"pod llm-a on node gpu-1, which stopped reporting at {STOPPED} (Ready Unknown: NodeStatusUnknown, "
        "Kubelet stopped posting node status.): it serves no requests; the taint-eviction controller evicts "
        f"it at 2026-12-05T10:05:04Z ({UNREACHABLE_TAINT} tolerated for 300 s) and the Deployment starts a "
        "replacement on another node; if the node is gone for good, delete it (`kubectl delete node gpu-1`) "
        "to replace it now"
    )


def test_a_node_that_reports_not_ready_counts_with_its_own_taint() -> None:
    found = issue([pod("llm-a")], {"gpu-1": lost("False", [taint(NOT_READY_TAINT)])})
    assert found is not None
    assert "which reports itself not ready at" in found.message
    assert "Ready False: KubeletNotReady, container runtime is down" in found.message
    assert f"({NOT_READY_TAINT} tolerated for 300 s)" in found.message


def test_the_condition_before_the_taint_says_the_eviction_comes_after_the_toleration() -> None:
    found = issue([pod("llm-a")], {"gpu-1": lost("Unknown", [])})
    assert found is not None
    assert f"taints the node {UNREACHABLE_TAINT}, evicts it 300 s later" in found.message


def test_the_taint_before_the_condition_is_a_lost_node_too() -> None:
    found = issue([pod("llm-a", ready=True)], {"gpu-1": lost("True", [taint()])})
    assert found is not None
    assert f"which was tainted {UNREACHABLE_TAINT} at {TAINTED} (its Ready condition True)" in found.message


def test_only_a_noexecute_lifecycle_taint_loses_a_ready_node() -> None:
    nodes = {
        "gpu-1": lost("True", [taint(NOT_READY_TAINT, "NoSchedule"), {"key": "other", "effect": "NoExecute"}])
    }
    assert issue([pod("llm-a", ready=True)], nodes) is None


def test_a_pod_terminating_on_a_lost_node_says_how_to_let_it_go() -> None:
    found = issue([pod("llm-a", deleting="2026-12-05T10:05:04Z")], {"gpu-1": lost()})
    assert found is not None
    message = found.message
    assert "pod llm-a on node gpu-1, which stopped reporting" in message
    assert "was deleted but stays Terminating until the node reports again" in message
    assert "`kubectl delete node gpu-1`" in message
    assert "`kubectl delete pod llm-a -n ns --force --grace-period=0`" in message


def test_pods_on_two_lost_nodes_are_grouped_by_node_in_name_order() -> None:
    pods = [pod("llm-c", "gpu-2"), pod("llm-b"), pod("llm-a")]
    found = issue(pods, {"gpu-1": lost(), "gpu-2": lost(name="gpu-2")})
    assert found is not None
    first, second = found.message.split("; the")[0], found.message.split("; pod ")[1]
    assert first.startswith("pods llm-a, llm-b on node gpu-1, which stopped reporting")
    assert "they serve no requests" in found.message and "evicts them at" in found.message
    assert second.startswith("llm-c on node gpu-2")


def test_a_pod_not_yet_on_a_node_is_on_no_lost_node() -> None:
    assert lost_replicas([pod("llm-a", node_name=None)], {}) == []


def test_a_deleted_node_loses_its_pods_that_are_not_ready() -> None:
    found = issue([pod("llm-a"), pod("llm-b", "gpu-2")], {"gpu-2": lost("True", [])})
    assert found is not None
    assert found.message == (
        "pod llm-a was on node gpu-1, which no longer exists (its Node object was deleted): the pod garbage "
        "collector deletes it and the Deployment replaces it on another node"
    )
    # A Ready pod on a node the watch has not delivered yet is not counted.
    assert issue([pod("llm-a", ready=True)], {}) is None


def test_nothing_is_lost_when_the_nodes_are_not_known_or_ready_again() -> None:
    assert issue([pod("llm-a")], None) is None
    assert issue([pod("llm-a")], {"gpu-1": lost("True", [])}) is None


@pytest.mark.parametrize(
    ("tolerations", "seconds"),
    [
        ([], 0),  # none matches: evicted at once
        (DEFAULT_TOLERATIONS, 300),
        ([{"operator": "Exists"}], None),  # tolerates every taint, forever
        ([{"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"}], 0),
        (
            [
                {"key": UNREACHABLE_TAINT, "operator": "Exists", "tolerationSeconds": 600},
                {
                    "key": UNREACHABLE_TAINT,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 60,
                },
                {"key": UNREACHABLE_TAINT, "operator": "Exists"},
            ],
            60,
        ),
        ([{"key": UNREACHABLE_TAINT, "operator": "Exists", "tolerationSeconds": -5}], 0),
    ],
)
def test_toleration_seconds_as_the_taint_eviction_controller_counts(
    tolerations: list[dict[str, Any]], seconds: int | None
) -> None:
    assert toleration_seconds(pod("p", tolerations=tolerations), UNREACHABLE_TAINT) == seconds


def test_a_pod_that_tolerates_the_taint_forever_is_never_evicted() -> None:
    found = issue([pod("llm-a", tolerations=[{"operator": "Exists"}])], {"gpu-1": lost()})
    assert found is not None
    assert "nothing evicts it and the Deployment starts no replacement" in found.message


def test_a_heartbeat_changes_nothing_the_status_reads() -> None:
    before, after = (
        node(heartbeat="2026-12-05T09:00:00Z"),
        node(heartbeat="2026-12-05T09:05:00Z", version="11"),
    )
    assert health(slim_node(before)) == health(slim_node(after))
    assert health(slim_node(node(ready="Unknown"))) != health(slim_node(before))


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"metadata": None, "spec": None, "status": None},
        {
            "metadata": {"name": "n"},
            "spec": {"taints": ["x", None]},
            "status": {"conditions": ["Ready", None]},
        },
        {
            "metadata": {"name": "n"},
            "spec": {
                "taints": [{"key": UNREACHABLE_TAINT, "effect": "NoExecute", "timeAdded": "not a time"}]
            },
        },
    ],
)
def test_odd_nodes_and_pods_never_raise(bad: dict[str, Any]) -> None:
    slim = slim_node(bad)
    node_loss("n", slim)
    odd_pod = {"metadata": None, "spec": {"nodeName": "n", "tolerations": ["x"]}, "status": None}
    found = issue([odd_pod, pod("llm-a", "n")], {"n": slim})
    assert found is None or found.reason == "NodeLost"


def test_the_status_says_node_lost_while_the_other_replica_serves_and_clears_when_the_node_returns() -> None:
    pods = [pod("llm-a"), pod("llm-b", "gpu-2", ready=True)]
    nodes = {"gpu-1": lost(), "gpu-2": lost("True", [])}
    dep = deployment(replicas=2, ready=1, available=1)
    status = compute_status(owner(), Observed(dep, pods=pods, nodes=nodes), selector=SELECTOR, now=TAINTED)
    by_type = {c["type"]: c for c in status["conditions"]}
    assert (by_type["Ready"]["status"], by_type["Ready"]["reason"]) == ("False", "NodeLost")
    assert (by_type["Degraded"]["status"], by_type["Degraded"]["reason"]) == ("True", "NodeLost")
    assert by_type["Degraded"]["message"].startswith("pod llm-a on node gpu-1, which stopped reporting")
    assert (status["readyReplicas"], status["readySummary"]) == (1, "1/2")
    # The node reports again: nothing is lost; the pod is not Ready until its kubelet says so.
    back = {"gpu-1": lost("True", []), "gpu-2": lost("True", [])}
    again = compute_status(
        owner(status=status), Observed(dep, pods=pods, nodes=back), selector=SELECTOR, now=TAINTED
    )
    by_type = {c["type"]: c for c in again["conditions"]}
    assert by_type["Ready"]["reason"] == "ReplicasNotReady"
    assert (by_type["Degraded"]["status"], by_type["Degraded"]["reason"]) == ("False", "Reconciled")


def test_what_else_blocks_replicas_follows_and_a_lost_pod_is_not_judged_by_its_stale_statuses() -> None:
    loading = pod("llm-a")
    loading["spec"]["containers"] = [
        {"name": "runtime", "startupProbe": {"periodSeconds": 10, "failureThreshold": 3}}
    ]
    loading["status"]["containerStatuses"][0].update(started=False, state={"running": {"startedAt": STOPPED}})
    replacement = pending_pod("llm-c")
    dep = deployment(replicas=2, ready=1, available=1)
    status = compute_status(
        owner(),
        Observed(dep, pods=[loading, replacement], nodes={"gpu-1": lost()}),
        selector=SELECTOR,
        now="2026-12-05T11:00:00Z",  # long past llm-a's startup budget: its last statuses are not news
    )
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "NodeLost"
    assert "StartupTimeout" not in degraded["message"]
    assert ". Also InsufficientGPU: pod llm-c cannot be scheduled" in degraded["message"]


def test_the_cache_queues_a_pass_only_when_a_nodes_health_changes() -> None:
    cache = ObjectCache("InferenceService")
    assert cache.nodes_of([pod("llm-a")]) is None  # not listed yet: not known
    cache.replace_nodes([node("gpu-1"), node("gpu-2")])
    labels = {"pagoda.dev/inferenceservice": "m"}
    running = {**pod("llm-a"), "kind": "Pod"}
    running["metadata"] = {**running["metadata"], "labels": labels, "resourceVersion": "5"}
    cache.observe(running, api_version="v1")
    assert cache.owners_on_node("gpu-1") == [("ns", "m")] and cache.owners_on_node("gpu-2") == []
    assert cache.nodes_of([running]) == {"gpu-1": slim_node(node("gpu-1"))}
    assert not cache.observe_node(node("gpu-1", heartbeat="2026-12-05T10:00:00Z", version="11"))
    assert cache.observe_node(node("gpu-1", "Unknown", [taint()], version="12"))
    assert not cache.observe_node(node("gpu-1", version="9"))  # an older event arriving late
    assert cache.observe_node(node("gpu-1", "Unknown", [taint()], version="13"), deleted=True)
    assert cache.nodes_of([running]) == {}
    cache.forget_nodes()
    assert cache.nodes_of([running]) is None


class ForbiddenNodes:
    """A Kube whose Node list RBAC forbids (a role of the user's own without the chart's rule)."""

    def list_pages(self, api_version: str, plural: str, namespace: str | None, *_: Any) -> Any:
        assert (api_version, plural, namespace) == ("v1", "nodes", None)
        raise KubeError(403, "Forbidden", 'nodes is forbidden: cannot list resource "nodes"')
        yield  # a generator, as the real one


def test_nodes_the_operator_may_not_list_report_no_node_lost_and_start_no_watch() -> None:
    cache = ObjectCache("InferenceService")
    cache.replace_nodes([node("gpu-1")])
    refresh_nodes(ForbiddenNodes(), cache)  # type: ignore[arg-type]
    assert not cache.nodes_known() and cache.nodes_of([pod("llm-a")]) is None
    registry = build_registry(WorkQueue(), cache, None, watch_nodes=False)
    assert "nodes" not in {handler.id for handler in registry._watching.get_all_handlers()}
    registry = build_registry(WorkQueue(), cache, None)
    assert "nodes" in {handler.id for handler in registry._watching.get_all_handlers()}
