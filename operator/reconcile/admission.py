"""Pure functions: why the API server refuses an InferenceService's pods, for the Degraded condition.

When the ReplicaSet controller cannot create a pod it sets the ReplicaSet's `ReplicaFailure` condition
(reason `FailedCreate`) to the API server's error, once per failing streak, and the Deployment controller
copies it into the Deployment's own `ReplicaFailure` condition, which the operator already reads, e.g.
`pods "llm-557c56cb76-zvghq" is forbidden: exceeded quota: gpu, requested: requests.nvidia.com/gpu=1, used:
requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2`. A ResourceQuota becomes `QuotaExceeded`; a
LimitRange, Pod Security admission, an admission webhook or any other refusal becomes `AdmissionRejected`;
the message drops the generated pod name (it means nothing to a person) and adds what to change. No I/O.
"""

from __future__ import annotations

import re
from typing import Any

from pagoda.operator.reconcile.pods import PodIssue

Obj = dict[str, Any]
_FORBIDDEN = re.compile(r'^pods? "[^"]*" is forbidden: ', re.IGNORECASE)
_QUOTA = re.compile(r"exceeded quota: ([^,]+), (.*)", re.DOTALL)
_FAILED_QUOTA = re.compile(r"failed quota: ([^:]+): (.*)", re.DOTALL)
_WEBHOOK = re.compile(r'admission webhook "([^"]+)" denied the request: (.*)', re.DOTALL)
_POD_SECURITY = re.compile(r'violates PodSecurity "([^"]+)": (.*)', re.DOTALL)
_LIMIT_RANGE = re.compile(r"(maximum|minimum) \S+ usage per (Container|Pod) is|must be less than or equal to")
MAX_DETAIL_CHARS = 2000
WHERE = "the API server refuses to create the pods"


def replica_failure_issue(condition: Obj, spec: Obj | None = None) -> PodIssue:
    """A Deployment's `ReplicaFailure` condition (status True) as a reason a person can act on; an error
    this does not recognise keeps the Deployment's reason (`FailedCreate`) and message."""
    message = " ".join(str(condition.get("message") or "").split())
    detail = _FORBIDDEN.sub("", message)
    scale = _scale_field(spec or {})
    quota = _QUOTA.search(detail)
    if quota is not None:
        name = quota.group(1).strip()
        return PodIssue(
            "QuotaExceeded",
            f"{WHERE}: ResourceQuota {name} is used up ({_clip(quota.group(2))}); raise the quota "
            f"(`kubectl describe resourcequota {name}`), or lower {scale} or spec.resources.gpu.count",
        )
    failed = _FAILED_QUOTA.search(detail)
    if failed is not None:
        name = failed.group(1).strip()
        return PodIssue(
            "AdmissionRejected",
            f"{WHERE}: ResourceQuota {name} requires requests or limits the pods do not set "
            f"({_clip(failed.group(2))}); set spec.resources.cpu and spec.resources.memory",
        )
    webhook = _WEBHOOK.search(detail)
    if webhook is not None:
        return PodIssue(
            "AdmissionRejected",
            f"{WHERE}: admission webhook {webhook.group(1)} denied them ({_clip(webhook.group(2))}); change "
            "what it names, or ask the webhook's owners",
        )
    security = _POD_SECURITY.search(detail)
    if security is not None:
        return PodIssue(
            "AdmissionRejected",
            f"{WHERE}: they violate the namespace's Pod Security level {security.group(1)} "
            f"({_clip(security.group(2))}); change the namespace's pod-security.kubernetes.io/enforce label",
        )
    if _LIMIT_RANGE.search(detail):
        return PodIssue(
            "AdmissionRejected",
            f"{WHERE}: a LimitRange of the namespace refuses them ({_clip(detail)}); change "
            "spec.resources to fit it, or the LimitRange (`kubectl describe limitrange`)",
        )
    if detail != message or "forbidden" in message.lower():
        return PodIssue("AdmissionRejected", f"{WHERE}: {_clip(detail)}; change what the message names")
    return PodIssue(str(condition.get("reason") or "ReplicaFailure"), message)


def _scale_field(spec: Obj) -> str:
    return "spec.autoscaling.maxReplicas" if spec.get("autoscaling") else "spec.replicas"


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 3] + "..."
