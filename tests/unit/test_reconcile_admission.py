"""Pure: a Deployment's ReplicaFailure (the API server refusing pods) as QuotaExceeded or AdmissionRejected.

The quota, LimitRange and Pod Security messages are the Deployment conditions recorded on the local control
plane (Kubernetes v1.36.3); the webhook one has the API server's `admission webhook ... denied` form.
"""

from __future__ import annotations

from typing import Any

from pagoda.operator.status.admission import replica_failure_issue

QUOTA = (
    'pods "qd-557c56cb76-zvghq" is forbidden: exceeded quota: gpu, requested: requests.nvidia.com/gpu=1, '
    "used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2"
)
LIMIT_RANGE = (
    'pods "lrd-7dbbffbd59-mqbcn" is forbidden: '
    "maximum nvidia.com/gpu usage per Container is 1, but limit is 2"
)
POD_SECURITY = (
    'pods "psd-9d7c79f99-wg7lv" is forbidden: violates PodSecurity "restricted:latest": host namespaces '
    '(hostNetwork=true), hostPort (container "runtime" uses hostPort 8000)'
)
WEBHOOK = 'admission webhook "gpu-policy.example.com" denied the request: GPU pods need a team label'
FAILED_QUOTA = (
    'pods "llm-6d-abc" is forbidden: failed quota: compute: must specify limits.cpu for: runtime; '
    "limits.memory for: runtime"
)
SERVICE_ACCOUNT = (
    'pods "llm-6d-abc" is forbidden: error looking up service account prod/default: serviceaccount '
    '"default" not found'
)


def failure(message: str, reason: str = "FailedCreate") -> dict[str, Any]:
    return {"type": "ReplicaFailure", "status": "True", "reason": reason, "message": message}


def test_quota_names_the_quota_and_the_fields_without_the_pod_name() -> None:
    issue = replica_failure_issue(failure(QUOTA), {"replicas": 3})
    assert issue.reason == "QuotaExceeded"
    assert issue.message == (
        "the API server refuses to create the pods: ResourceQuota gpu is used up (requested: "
        "requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2); "
        "raise the quota (`kubectl describe resourcequota gpu`), or lower spec.replicas or "
        "spec.resources.gpu.count"
    )
    autoscaled = replica_failure_issue(failure(QUOTA), {"autoscaling": {"maxReplicas": 4}})
    assert "lower spec.autoscaling.maxReplicas" in autoscaled.message
    # Another pod name (a later streak) gives the same status: nothing to write.
    assert replica_failure_issue(failure(QUOTA.replace("zvghq", "k2j9x")), {"replicas": 3}) == issue


def test_admission_refusals() -> None:
    issue = replica_failure_issue(failure(LIMIT_RANGE))
    assert issue.reason == "AdmissionRejected"
    assert "a LimitRange of the namespace refuses them (maximum nvidia.com/gpu usage per Container is 1" in (
        issue.message
    )
    assert "change spec.resources" in issue.message and "lrd-7dbbffbd59" not in issue.message
    issue = replica_failure_issue(failure(POD_SECURITY))
    assert issue.reason == "AdmissionRejected"
    assert "Pod Security level restricted:latest (host namespaces (hostNetwork=true)" in issue.message
    assert "pod-security.kubernetes.io/enforce" in issue.message
    issue = replica_failure_issue(failure(WEBHOOK))
    assert issue.reason == "AdmissionRejected"
    assert (
        "admission webhook gpu-policy.example.com denied them (GPU pods need a team label)" in issue.message
    )
    issue = replica_failure_issue(failure(FAILED_QUOTA))
    assert issue.reason == "AdmissionRejected"
    assert "ResourceQuota compute requires" in issue.message
    assert "set spec.resources.cpu and spec.resources.memory" in issue.message
    issue = replica_failure_issue(failure(SERVICE_ACCOUNT))
    assert issue.reason == "AdmissionRejected"
    assert issue.message.startswith(
        "the API server refuses to create the pods: error looking up service account"
    )


def test_unknown_failures_keep_the_deployments_reason_and_message() -> None:
    issue = replica_failure_issue(failure("Internal error occurred: etcdserver: request timed out"))
    assert (issue.reason, issue.message) == (
        "FailedCreate",
        "Internal error occurred: etcdserver: request timed out",
    )
    assert replica_failure_issue({"status": "True"}).reason == "ReplicaFailure"
