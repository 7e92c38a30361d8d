"""status.profile read from the cluster: the capacity profile Job's result, from its pod's termination
message; and which profile Job a pass keeps (`keep_measured_job`).

`pagoda-runtime profile` writes its result, one compact JSON object, to the container's termination message;
the kubelet keeps it in the pod's status (at most 4 KiB). A pass reads it when the Job has finished and the
status does not yet name that Job as finished: one list of the Job's pods, once per profile. What the result
means for the status is status/profile.py's.
"""

from __future__ import annotations

from typing import Any

from pagoda.operator.kube.client import Kube
from pagoda.operator.reconcile.rollouts import applied_before_the_hash
from pagoda.operator.resources.meta import CONTAINER_NAME
from pagoda.operator.resources.profile import PROFILE_INPUTS_ANNOTATION
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


def keep_measured_job(desired: list[Obj], live: dict[tuple[str, str], Obj], owner: Obj) -> None:
    """Keeps the live profile Job that measured what the desired one would (in `desired`, in its place), so
    that no new profile runs: one whose PROFILE_INPUTS_ANNOTATION is the desired Job's digest (a Job of an
    earlier operator version with the same inputs, named by the same digest or not), or one of an operator
    before the annotation (0.1.0, whose Job names digested its whole pod template) while the spec is the one
    that operator applied (`owner`'s status has no podTemplateInputs and observedGeneration is its
    generation). The kept Job is applied as it runs, with the annotation: a metadata change only (a Job's
    template cannot change)."""
    index = next((i for i, m in enumerate(desired) if m["kind"] == "Job"), None)
    if index is None:
        return
    want = desired[index]
    if ("Job", want["metadata"]["name"]) in live:
        return
    digest = want["metadata"]["annotations"][PROFILE_INPUTS_ANNOTATION]
    before_digests = applied_before_the_hash(owner)
    for (kind, _), job in sorted(live.items()):
        if kind != "Job":
            continue
        has = ((job.get("metadata") or {}).get("annotations") or {}).get(PROFILE_INPUTS_ANNOTATION)
        if has == digest or (has is None and before_digests):
            meta = {
                **want["metadata"],
                "name": job["metadata"]["name"],
                "annotations": {**want["metadata"]["annotations"]},
            }
            desired[index] = {
                "apiVersion": want["apiVersion"],
                "kind": "Job",
                "metadata": meta,
                "spec": job["spec"],
            }
            return
