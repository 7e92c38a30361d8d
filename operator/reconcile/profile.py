"""status.profile read from the cluster: the capacity profile Job's result, from its pod's termination
message.

`pagoda-runtime profile` writes its result, one compact JSON object, to the container's termination message;
the kubelet keeps it in the pod's status (at most 4 KiB). A pass reads it when the Job has finished and the
status does not yet name that Job as finished: one list of the Job's pods, once per profile. What the result
means for the status is status/profile.py's.
"""

from __future__ import annotations

from typing import Any

from pagoda.operator.kube.client import Kube
from pagoda.operator.resources.meta import CONTAINER_NAME
from pagoda.operator.status import profile

Obj = dict[str, Any]
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


def profile_status(kube: Kube, namespace: str, job: Obj | None, previous: Obj | None) -> Obj | None:
    """status.profile for the current profile Job (status/profile.py), its result read from the cluster."""
    return profile.profile_status(job, previous, lambda name: termination_message(kube, namespace, name))


def termination_message(kube: Kube, namespace: str, job: str) -> str | None:
    """The runtime container's termination message in the Job's pod (the newest that has one)."""
    pods = kube.list("v1", "pods", namespace, f"{JOB_NAME_LABEL}={job}")
    pods.sort(key=lambda pod: pod["metadata"].get("creationTimestamp") or "", reverse=True)
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") != CONTAINER_NAME:
                continue
            terminated = (status.get("state") or {}).get("terminated") or {}
            if terminated.get("message"):
                return str(terminated["message"]).strip()
    return None
