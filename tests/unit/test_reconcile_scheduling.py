"""Pure: the scheduler's verdict on a Pending pod as a Degraded reason naming the field to change.

The messages are kube-scheduler's own (v1.36.3, recorded on the local control plane with kwok GPU nodes and
the tainted real-pods node), plus the older taint format (before 1.33) that names the taint.
"""

from __future__ import annotations

from typing import Any

import pytest

from pagoda.operator.status.scheduling import scheduling_issue, unschedulable_issue, verdict_summary

TAIL = (
    ". no new claims to deallocate, preemption: 0/3 nodes are available: 3 Preemption is not helpful for "
    "scheduling."
)
GPU = "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 Insufficient nvidia.com/gpu" + TAIL
SELECTOR = (
    "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 node(s) didn't match Pod's node "
    "affinity/selector" + TAIL
)
TAINT = "0/3 nodes are available: 3 node(s) had untolerated taint(s)" + TAIL
OLD_TAINT = (
    "0/4 nodes are available: 1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }, "
    "3 node(s) had untolerated taint {dedicated: llm}. preemption: 0/4 nodes are available: 4 Preemption "
    "is not helpful for scheduling."
)
CPU = "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 Insufficient cpu" + TAIL
MISSING_CLAIM = '0/3 nodes are available: persistentvolumeclaim "models" not found. not found'
UNBOUND = "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims. not found"
CORDONED = "0/3 nodes are available: 3 node(s) were unschedulable" + TAIL
SPEC: dict[str, Any] = {
    "model": {"uri": "pvc://models/llama-3-8b", "cache": {"pvc": "hf-cache"}},
    "resources": {"gpu": {"count": 16}},
}


def pending(
    name: str, message: str, *, reason: str = "Unschedulable", deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "prod"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    cond = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
    return {"metadata": meta, "status": {"phase": "Pending", "conditions": [cond]}}


def test_not_enough_gpus_names_the_count_field() -> None:
    issue = scheduling_issue("llm-x", "prod", GPU, SPEC)
    assert issue.reason == "InsufficientGPU"
    assert issue.message == (
        "pod llm-x cannot be scheduled: no node has 16 free nvidia.com/gpu for one replica (0/3 nodes are "
        "available: 1 node(s) had untolerated taint(s), 2 Insufficient nvidia.com/gpu); lower "
        "spec.resources.gpu.count (with spec.engine.tensorParallelSize), free GPUs or add GPU nodes"
    )
    # A resource name no device plugin advertises shows up the same way: the message says to check it.
    other = "0/2 nodes are available: 2 Insufficient amd.com/gpu. preemption: 0/2 nodes are available."
    spec = {"resources": {"gpu": {"count": 2, "resourceName": "amd.com/gpu"}}}
    issue = scheduling_issue("p", "ns", other, spec)
    assert (
        issue.reason == "InsufficientGPU" and "spec.resources.gpu.resourceName amd.com/gpu" in issue.message
    )


def test_no_node_with_the_product_names_the_product_and_selector_fields() -> None:
    spec = {
        "resources": {"gpu": {"count": 1, "product": "NVIDIA-B200"}},
        "scheduling": {"nodeSelector": {"a": "b"}},
    }
    issue = scheduling_issue("p", "ns", SELECTOR, spec)
    assert issue.reason == "NoMatchingNode"
    assert "no node matches the node selector a=b,nvidia.com/gpu.product=NVIDIA-B200" in issue.message
    assert (
        "set spec.resources.gpu.product" in issue.message and "spec.scheduling.nodeSelector" in issue.message
    )
    assert "spec.scheduling.affinity" in issue.message
    assert "the pod's node affinity" in scheduling_issue("p", "ns", SELECTOR, {}).message


def test_taints_name_the_tolerations_field() -> None:
    for message in (TAINT, OLD_TAINT):
        issue = scheduling_issue("p", "ns", message, {})
        assert issue.reason == "UntoleratedTaint", message
        assert "add a toleration to spec.scheduling.tolerations" in issue.message
    assert "{dedicated: llm}" in scheduling_issue("p", "ns", OLD_TAINT, {}).message


def test_missing_claim_names_the_model_uri_or_the_cache() -> None:
    issue = scheduling_issue("p", "prod", MISSING_CLAIM, SPEC)
    assert issue.reason == "VolumeClaimNotFound"
    assert issue.message == (
        "pod p cannot be scheduled: PersistentVolumeClaim models (the model source, spec.model.uri "
        "pvc://models/llama-3-8b) does not exist in namespace prod; create it, or fix spec.model.uri"
    )
    cache = '0/3 nodes are available: persistentvolumeclaim "hf-cache" not found. not found'
    issue = scheduling_issue("p", "prod", cache, SPEC)
    assert issue.reason == "VolumeClaimNotFound"
    assert "(the model cache, spec.model.cache.pvc)" in issue.message
    assert issue.message.endswith("or fix spec.model.cache.pvc")


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (UNBOUND, "VolumeClaimNotBound"),
        (CPU, "InsufficientResources"),
        ("0/3 nodes are available: 3 Too many pods. preemption: x", "InsufficientResources"),
        (CORDONED, "Unschedulable"),
        ("", "Unschedulable"),
    ],
)
def test_other_verdicts(message: str, reason: str) -> None:
    issue = scheduling_issue("p", "ns", message, {})
    assert issue.reason == reason
    assert "preemption" not in issue.message


def test_resources_count_before_selectors_before_taints() -> None:
    # The nodes counted under the later filter got furthest: their cause names the reason.
    both = "0/5 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, 3 Insufficient cpu."
    assert scheduling_issue("p", "ns", both, {}).reason == "InsufficientResources"
    assert scheduling_issue("p", "ns", GPU, {}).reason == "InsufficientGPU"
    assert scheduling_issue("p", "ns", SELECTOR, {}).reason == "NoMatchingNode"


def test_summary_is_the_first_sentence() -> None:
    assert verdict_summary(GPU) == (
        "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 Insufficient nvidia.com/gpu"
    )
    assert (
        verdict_summary(MISSING_CLAIM) == '0/3 nodes are available: persistentvolumeclaim "models" not found'
    )


def test_most_specific_pod_wins_then_by_name_and_others_are_counted() -> None:
    pods = [
        pending("m-c", TAINT),
        pending("m-b", GPU),
        pending("m-a", TAINT),
        pending("m-0", MISSING_CLAIM, deleting=True),
    ]
    issue = unschedulable_issue(pods, SPEC)
    assert issue is not None and issue.reason == "InsufficientGPU"
    assert issue.message.startswith("pod m-b cannot be scheduled")
    assert issue.message.endswith("(2 more pods unschedulable)")
    issue = unschedulable_issue([pending("m-b", TAINT), pending("m-a", TAINT)])
    assert (
        issue is not None
        and issue.message.startswith("pod m-a ")
        and issue.message.endswith("(1 more pod unschedulable)")
    )


def test_scheduled_or_gated_pods_are_no_issue() -> None:
    scheduled = {
        "metadata": {"name": "p"},
        "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]},
    }
    assert unschedulable_issue([scheduled]) is None
    assert unschedulable_issue([pending("p", "", reason="SchedulingGated")]) is None
    assert unschedulable_issue([{"metadata": {"name": "p"}, "status": {}}]) is None
    assert unschedulable_issue([]) is None


def test_the_same_verdict_gives_the_same_message() -> None:
    # The status is written only when it changes: nothing in the message may move between passes.
    first = unschedulable_issue([pending("p", GPU)], SPEC)
    assert first == unschedulable_issue([pending("p", GPU)], SPEC)


def _versioned(pod: dict[str, Any], template: str) -> dict[str, Any]:
    pod["metadata"]["labels"] = {"pod-template-hash": template}
    return pod


def test_a_new_replica_waiting_for_the_gpus_the_old_ones_hold_is_a_blocked_rollout() -> None:
    """maxSurge 1 / maxUnavailable 0 (the defaults) with every GPU allocated: the rollout cannot go on."""
    old = _versioned(
        {
            "metadata": {"name": "m-old"},
            "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]},
        },
        "v1",
    )
    new = _versioned(pending("m-new", GPU), "v2")
    issue = unschedulable_issue([old, new], SPEC)
    assert issue is not None and issue.reason == "RolloutBlocked"
    assert issue.message.startswith("pod m-new of the rollout cannot be scheduled (0/3 nodes are available")
    assert "spec.rollout.maxUnavailable to 1 and spec.rollout.maxSurge to 0" in issue.message
    # Not a rollout: no scheduled pod of another version, or the rollout may take an old replica down first.
    assert unschedulable_issue([_versioned(pending("m-new", GPU), "v2")], SPEC).reason == "InsufficientGPU"  # type: ignore[union-attr]
    rolling_in_place = {**SPEC, "rollout": {"maxSurge": 0, "maxUnavailable": 1}}
    assert unschedulable_issue([old, new], rolling_in_place).reason == "InsufficientGPU"  # type: ignore[union-attr]
