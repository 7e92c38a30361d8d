"""status.profile read from the cluster: the capacity profile Job's result, from its pod's termination
message; and which profile Job a pass keeps (`keep_measured_job`).

`pagoda-runtime profile` writes its result, one compact JSON object, to the container's termination message;
the kubelet keeps it in the pod's status (at most 4 KiB). A pass reads it when the Job has finished and the
status does not yet name that Job as finished: one list of the Job's pods, once per profile. What the result
means for the status is status/profile.py's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from pagoda.operator import metrics
from pagoda.operator.kube.client import Kube
from pagoda.operator.reconcile.budget import FleetBudget, Key, Turn
from pagoda.operator.reconcile.rollouts import applied_before_the_hash
from pagoda.operator.resources.meta import CONTAINER_NAME
from pagoda.operator.resources.profile import PROFILE_INPUTS_ANNOTATION
from pagoda.operator.status import profile
from pagoda.operator.status.profile import PROFILE_KIND, job_outcome

Obj = dict[str, Any]
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
DEFAULT_MAX_CONCURRENT_PROFILES = 2


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


class ProfileBudget(FleetBudget):
    """The budget of profile Jobs running at once (budget.py): busy are the services with a profile Job
    that has not ended (`running_profiles`)."""

    def __init__(
        self,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT_PROFILES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(max_concurrent, "profiles.maxConcurrent", metrics.PROFILES_QUEUED, clock)


def running_profiles(jobs: Iterable[tuple[Key, Obj]]) -> set[Key]:
    """The services with a profile Job that has not ended (each service's Jobs, from the cache)."""
    return {key for key, job in jobs if job_outcome(job)[0] == "Running"}


def profile_message(turn: Turn) -> str:
    """status.profile's message while its Job waits."""
    return (
        f"waits for a slot of the fleet's profile budget, {turn.position} of {turn.queued} in the queue; "
        f"{turn.busy} of {turn.limit} profile Jobs running in the cluster (profiles.maxConcurrent)"
    )


def budget_profile(
    desired: list[Obj],
    live: dict[tuple[str, str], Obj],
    owner: Obj,
    budget: ProfileBudget | None,
    jobs: Callable[[], Iterable[tuple[Key, Obj]]],
) -> tuple[str, Turn] | None:
    """Puts a new profile Job (the one in `desired`, not live: keep_measured_job kept none) under the fleet's
    profile budget: granted, it stays in `desired`; held, it is taken out and its name and Turn returned.
    `jobs`: every service's profile Jobs (for `running_profiles`). Without a budget (a pass run alone, from a
    test) every Job is created at once."""
    meta = owner["metadata"]
    key = (meta["namespace"], meta["name"])
    index = next((i for i, m in enumerate(desired) if m["kind"] == PROFILE_KIND), None)
    job = live.get((PROFILE_KIND, desired[index]["metadata"]["name"])) if index is not None else None
    if budget is None:
        return None
    if index is None or job is not None:  # no profile wanted, or its Job exists: not waiting
        budget.forget(key)
        if job is None or job_outcome(job)[0] != "Running":
            budget.finished(key)
        return None
    turn = budget.ask(key, running_profiles(jobs()))
    if turn.granted:
        return None
    name = desired.pop(index)["metadata"]["name"]
    return name, turn
