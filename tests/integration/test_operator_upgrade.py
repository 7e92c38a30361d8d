"""An operator upgrade against a real API server, controller manager and kwok's nodes: what it restarts.

- The operator restarts with a new default runtime image (as a new release's chart sets it): four running
  services must each roll to it, but never more than --max-concurrent-rollouts (1, the chart's default) at
  once, sampled every second from the Deployments as the Deployment controller reports them; the others
  wait with the condition RolloutQueued, their pods untouched. (operator/reconcile/rollouts.py)
- A profile Job that an earlier operator made (its name not this operator's digest, no annotation) is kept
  through the upgrade while the spec it measured stands: no new Job, the old one annotated in place by a
  server-side apply of its own spec, which the API server accepts. (operator/reconcile/profile.py)

The session's operator is stopped for each test and started again as it was after it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from harness import OperatorProcess, wait_until
from isvc import condition, create, create_ready, get
from kubernetes import client

from pagoda.operator.kube.client import Kube
from pagoda.operator.reconcile.rollouts import FLEET_ROLLOUT_ANNOTATION, rolling
from pagoda.operator.resources.meta import OWNER_LABEL
from pagoda.operator.resources.profile import PROFILE_INPUTS_ANNOTATION

NEXT_IMAGE = "registry.local/pagoda-runtime:next"
SERVICES = ["a", "b", "c", "d"]
UNBOUND = {"nodeSelector": {"pagoda.dev/test-node": "none"}}  # pods never bound: no kwok stage ends them
SLO = {"ttftMs": 500, "interTokenMs": 50, "profile": {"streams": [1, 2], "stepSeconds": 5}}


@pytest.fixture
def upgraded(operator: OperatorProcess) -> Iterator[OperatorProcess]:
    """The session's operator, to be restarted by the test with other flags; as it was afterwards."""
    image = operator.runtime_image
    try:
        yield operator
    finally:
        operator.stop()
        operator.runtime_image = image
        operator.start()


def deployments(raw: Kube, namespace: str) -> dict[str, dict[str, Any]]:
    found = raw.list("apps/v1", "deployments", namespace, OWNER_LABEL)
    return {d["metadata"]["name"]: d for d in found}


def image(deployment: dict[str, Any]) -> str:
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


def test_an_upgrade_rolls_one_service_at_a_time(
    upgraded: OperatorProcess, kube: client.CustomObjectsApi, raw: Kube, namespace: str
) -> None:
    for name in SERVICES:
        create_ready(kube, name, namespace, replicas=2)
    before = deployments(raw, namespace)
    assert all(image(d) != NEXT_IMAGE for d in before.values())

    upgraded.stop()
    upgraded.runtime_image = NEXT_IMAGE
    upgraded.start()
    most, queued_seen, samples = 0, set(), 0
    deadline = time.monotonic() + 240
    while True:
        now = deployments(raw, namespace)
        moving = [n for n, d in now.items() if rolling(d)]
        most = max(most, len(moving))
        assert len(moving) <= 1, {n: now[n]["status"] for n in moving}
        for name in SERVICES:
            if condition(get(kube, name, namespace), "RolloutQueued").get("status") == "True":
                queued_seen.add(name)
        samples += 1
        if all(image(d) == NEXT_IMAGE and not rolling(d) for d in now.values()):
            break
        assert time.monotonic() < deadline, {n: (image(d), d.get("status")) for n, d in now.items()}
        time.sleep(1)
    print(f"\n{samples} samples: at most {most} rolling; queued at some point: {sorted(queued_seen)}")
    assert most == 1
    assert len(queued_seen) >= 2  # at least the last two in line waited, and said so
    after = deployments(raw, namespace)
    assert all(FLEET_ROLLOUT_ANNOTATION in d["metadata"]["annotations"] for d in after.values())
    wait_until(
        lambda: all(
            "RolloutQueued"
            not in {c["type"] for c in (get(kube, n, namespace) or {})["status"]["conditions"]}
            for n in SERVICES
        ),
        "no service queued any more",
        30,
    )


def test_an_earlier_operators_profile_job_is_kept_through_the_upgrade(
    upgraded: OperatorProcess, kube: client.CustomObjectsApi, cluster_api: Any, raw: Kube, namespace: str
) -> None:
    create(kube, "slo", namespace, replicas=1, slo=SLO, scheduling=UNBOUND)
    jobs = lambda: raw.list("batch/v1", "jobs", namespace, f"{OWNER_LABEL}=slo")  # noqa: E731
    [job] = wait_until(jobs, "the profile Job", 60)
    wait_until(
        lambda: (get(kube, "slo", namespace) or {}).get("status", {}).get("podTemplateInputs"),
        "the status's podTemplateInputs",
        60,
    )
    upgraded.stop()
    # What an operator before digests leaves: its Job under another name, without the annotation, and a
    # status without podTemplateInputs (written for this generation).
    batch = client.BatchV1Api(cluster_api)
    spec = job["spec"]
    uid_labels = (
        "controller-uid",
        "batch.kubernetes.io/controller-uid",
        "job-name",
        "batch.kubernetes.io/job-name",
    )
    spec.pop("selector", None)
    for key in uid_labels:
        spec["template"]["metadata"]["labels"].pop(key, None)
    old_name = "slo-profile-f00dfeed00"
    meta = {k: job["metadata"][k] for k in ("labels", "ownerReferences")}
    batch.create_namespaced_job(
        namespace,
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {**meta, "name": old_name}, "spec": spec},
    )
    batch.delete_namespaced_job(job["metadata"]["name"], namespace, propagation_policy="Background")
    wait_until(lambda: [j["metadata"]["name"] for j in jobs()] == [old_name], "only the earlier Job", 30)
    custom = client.CustomObjectsApi(cluster_api)
    custom.patch_namespaced_custom_object_status(  # a merge patch: null removes the field
        "pagoda.dev",
        "v1alpha1",
        namespace,
        "inferenceservices",
        "slo",
        {"status": {"podTemplateInputs": None}},
    )
    assert "podTemplateInputs" not in get(kube, "slo", namespace)["status"]
    upgraded.start()
    kept = wait_until(
        lambda: [j for j in jobs() if PROFILE_INPUTS_ANNOTATION in (j["metadata"].get("annotations") or {})],
        "the earlier Job annotated",
        60,
    )
    assert [j["metadata"]["name"] for j in kept] == [old_name]
    time.sleep(6)  # more passes (resync every 5 s): still the one Job
    assert [j["metadata"]["name"] for j in jobs()] == [old_name]
    assert get(kube, "slo", namespace)["status"]["profile"]["job"] == old_name
