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

from pagoda.operator.status.pods import PodIssue, clip

Obj = dict[str, Any]
_FORBIDDEN = re.compile(r'^pods? "[^"]*" is forbidden: ', re.IGNORECASE)
_QUOTA = re.compile(r"exceeded quota: ([^,]+), (.*)", re.DOTALL)
_FAILED_QUOTA = re.compile(r"failed quota: ([^:]+): (.*)", re.DOTALL)
_WEBHOOK = re.compile(r'admission webhook "([^"]+)" denied the request: (.*)', re.DOTALL)
_POD_SECURITY = re.compile(r'violates PodSecurity "([^"]+)": (.*)', re.DOTALL)
_LIMIT_RANGE = re.compile(r"(maximum|minimum) \S+ usage per (Container|Pod) is|must be less than or equal to")
WHERE = "the API server refuses to create the pods"


# The refusals recognised, most specific first: (pattern with the object's name and the API server's detail
# as groups 1 and 2, reason, what the message says after WHERE: {name}, {detail} and {scale} are filled in).
_RULES: list[tuple[re.Pattern[str], str, str]] = [
    (
        _QUOTA,
        "QuotaExceeded",
        "ResourceQuota {name} is used up ({detail}); raise the quota (`kubectl describe resourcequota "
        "{name}`), or lower {scale} or spec.resources.gpu.count",
    ),
    (
        _FAILED_QUOTA,
        "AdmissionRejected",
        "ResourceQuota {name} requires requests or limits the pods do not set ({detail}); set "
        "spec.resources.cpu and spec.resources.memory",
    ),
    (
        _WEBHOOK,
        "AdmissionRejected",
        "admission webhook {name} denied them ({detail}); change what it names, or ask the webhook's owners",
    ),
    (
        _POD_SECURITY,
        "AdmissionRejected",
        "they violate the namespace's Pod Security level {name} ({detail}); change the namespace's "
        "pod-security.kubernetes.io/enforce label",
    ),
]


def replica_failure_issue(condition: Obj, spec: Obj | None = None) -> PodIssue:
    """A Deployment's `ReplicaFailure` condition (status True) as a reason a person can act on; an error
    this does not recognise keeps the Deployment's reason (`FailedCreate`) and message."""
    message = " ".join(str(condition.get("message") or "").split())
    detail = _FORBIDDEN.sub("", message)
    for pattern, reason, template in _RULES:
        found = pattern.search(detail)
        if found is not None:
            text = template.format(
                name=found.group(1).strip(), detail=clip(found.group(2)), scale=_scale_field(spec or {})
            )
            return PodIssue(reason, f"{WHERE}: {text}")
    if _LIMIT_RANGE.search(detail):
        return PodIssue(
            "AdmissionRejected",
            f"{WHERE}: a LimitRange of the namespace refuses them ({clip(detail)}); change "
            "spec.resources to fit it, or the LimitRange (`kubectl describe limitrange`)",
        )
    if detail != message or "forbidden" in message.lower():
        return PodIssue("AdmissionRejected", f"{WHERE}: {clip(detail)}; change what the message names")
    return PodIssue(str(condition.get("reason") or "ReplicaFailure"), message)


def _scale_field(spec: Obj) -> str:
    return "spec.autoscaling.maxReplicas" if spec.get("autoscaling") else "spec.replicas"
