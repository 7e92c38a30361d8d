"""A GPUBudget against the real API server (docs/budget.md; reconcile/gpubudget.py): two services share a
pool of 3 GPUs; the high-priority one's demand makes the low one hand a replica over, and the high one's
limit rises only once the low one's pod is gone. KEDA does not run here: each service's HPA
(keda-hpa-<name>, labelled as KEDA labels it) is made by the test, its desiredReplicas written through the
status subresource as KEDA's HPA would have it, and its target is a Deployment that does not exist, so that
the HPA controller changes only its conditions; a fake of KEDA (KedaStandIn) copies each ScaledObject's
maxReplicaCount to its HPA's maxReplicas, the one act of KEDA's the hand-over waits for. The Deployments'
replicas are scaled by the test as the HPA would scale them; their pods are never bound to a node (each one
still holds its GPU: Pending pods are counted)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from harness import OperatorProcess, wait_until
from isvc import create as create_service
from isvc import get
from kubernetes import client

from e2e.lab.samples import gpu_budget
from pagoda.operator.api import GROUP, VERSION
from pagoda.operator.api.budget import BUDGET_PLURAL
from pagoda.operator.kube.client import Kube
from pagoda.operator.resources.meta import MANAGED_BY, OWNER_LABEL

UNBOUND = {"nodeSelector": {"pagoda.dev/test-node": "none"}}
GPUS = 3


def create(kube: client.CustomObjectsApi, name: str, namespace: str, budget: str, priority: int) -> None:
    autoscaling = {
        "minReplicas": 1,
        "maxReplicas": 4,
        "metricsSource": "External",
        # the window a member's demand is held over before it falls (operator/status/gpubudget.py `remember`)
        "cooldownPeriod": 10,
        "budget": {"name": budget, "priority": priority},
    }
    create_service(kube, name, namespace, scheduling=UNBOUND, autoscaling=autoscaling, replicas=None)


def demand(cluster_api: Any, namespace: str, name: str, replicas: int) -> None:
    """KEDA's HPA of `name` asks for `replicas` (created on the first call)."""
    api = client.AutoscalingV2Api(cluster_api)
    hpa = f"keda-hpa-{name}"
    try:
        api.read_namespaced_horizontal_pod_autoscaler(hpa, namespace)
    except client.ApiException as exc:
        assert exc.status == 404, exc
        body = {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {
                "name": hpa,
                "labels": {OWNER_LABEL: name, "app.kubernetes.io/managed-by": MANAGED_BY},
            },
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"{name}-absent"},
                "minReplicas": 1,
                "maxReplicas": 1,  # KedaStandIn gives it the ScaledObject's maxReplicaCount
            },
        }
        api.create_namespaced_horizontal_pod_autoscaler(namespace, body)
    api.patch_namespaced_horizontal_pod_autoscaler_status(
        hpa, namespace, {"status": {"currentReplicas": 1, "desiredReplicas": replicas}}
    )


class KedaStandIn(threading.Thread):
    """A fake of KEDA (which does not run in tier 2) for its one act the budget's hand-over depends on: every
    0.2 s, each ScaledObject's maxReplicaCount in `namespace` copied to its HPA's spec.maxReplicas, as KEDA's
    reconcile of the ScaledObject does. Until it has, the member's autoscaler may still scale up to the old
    maximum, so the GPUs it hands over are not free (operator/status/gpubudget.py `hand_over`)."""

    def __init__(self, cluster_api: Any, namespace: str) -> None:
        super().__init__(daemon=True)
        self.objects = client.CustomObjectsApi(cluster_api)
        self.hpas = client.AutoscalingV2Api(cluster_api)
        self.namespace = namespace
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.2):
            scaled = self.objects.list_namespaced_custom_object(
                "keda.sh", "v1alpha1", self.namespace, "scaledobjects"
            )
            for obj in scaled["items"]:
                name, limit = obj["metadata"]["name"], obj["spec"].get("maxReplicaCount")
                try:
                    hpa = self.hpas.read_namespaced_horizontal_pod_autoscaler(
                        f"keda-hpa-{name}", self.namespace
                    )
                except client.ApiException as exc:
                    if exc.status == 404:
                        continue
                    raise
                if limit is not None and hpa.spec.max_replicas != limit:
                    self.hpas.patch_namespaced_horizontal_pod_autoscaler(
                        f"keda-hpa-{name}", self.namespace, {"spec": {"maxReplicas": limit}}
                    )

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=10)


@pytest.fixture
def keda(cluster_api: Any, namespace: str) -> Iterator[KedaStandIn]:
    standin = KedaStandIn(cluster_api, namespace)
    standin.start()
    yield standin
    standin.stop()


def scale(cluster_api: Any, namespace: str, name: str, replicas: int) -> None:
    """The Deployment's replicas, as the HPA would set them."""
    client.AppsV1Api(cluster_api).patch_namespaced_deployment_scale(
        name, namespace, {"spec": {"replicas": replicas}}
    )


def max_replicas(raw: Kube, namespace: str, name: str) -> int | None:
    scaled = raw.get("keda.sh/v1alpha1", "scaledobjects", namespace, name)
    return None if scaled is None else int(scaled["spec"]["maxReplicaCount"])


def share(kube: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    return dict(((get(kube, name, namespace) or {}).get("status") or {}).get("budget") or {})


def pods(raw: Kube, namespace: str, name: str) -> int:
    listed = raw.list("v1", "pods", namespace, f"{OWNER_LABEL}={name}")
    return len([p for p in listed if not p["metadata"].get("deletionTimestamp")])


@pytest.fixture
def pool(kube: client.CustomObjectsApi, namespace: str) -> Iterator[str]:
    """A GPUBudget of GPUS that admits only this test's namespace."""
    name = f"pool-{namespace[-6:]}"
    kube.create_cluster_custom_object(GROUP, VERSION, BUDGET_PLURAL, gpu_budget(name, GPUS, namespace))
    yield name
    kube.delete_cluster_custom_object(GROUP, VERSION, BUDGET_PLURAL, name)


def quiet_pair(kube: client.CustomObjectsApi, cluster_api: Any, raw: Kube, namespace: str, pool: str) -> None:
    """chat (priority 100) asking for 1 and batch (0) asking for 2 in `pool`, quiet: batch gets the 2 it asks
    for (3 GPUs: 1 guaranteed each, the third to batch), and its HPA scales it out: 2 pods hold 2 GPUs."""
    create(kube, "chat", namespace, pool, 100)
    create(kube, "batch", namespace, pool, 0)
    demand(cluster_api, namespace, "chat", 1)
    demand(cluster_api, namespace, "batch", 2)
    wait_until(lambda: max_replicas(raw, namespace, "batch") == 2, "batch's maxReplicaCount 2", 60)
    assert max_replicas(raw, namespace, "chat") == 1
    scale(cluster_api, namespace, "batch", 2)
    wait_until(lambda: pods(raw, namespace, "batch") == 2, "batch's 2 pods", 60)


def test_a_busy_high_priority_service_takes_a_replica_the_low_one_hands_over_first(
    operator: OperatorProcess,
    kube: client.CustomObjectsApi,
    cluster_api: Any,
    raw: Kube,
    namespace: str,
    pool: str,
    keda: KedaStandIn,
) -> None:
    quiet_pair(kube, cluster_api, raw, namespace, pool)

    # Load on chat: the budget gives it 2, batch 1. batch's limit drops at once; chat's waits for the GPU.
    demand(cluster_api, namespace, "chat", 3)
    wait_until(lambda: max_replicas(raw, namespace, "batch") == 1, "batch handing a replica over", 60)
    held = wait_until(
        lambda: (s := share(kube, namespace, "chat")).get("allocated") == 2 and s, "chat's share", 60
    )
    assert (
        held["limit"] == 1
        and "1 of its allocated replicas wait for another member's drain" in held["message"]
    ), held
    assert max_replicas(raw, namespace, "chat") == 1  # batch's second pod still holds its GPU
    # batch's status says why, written by its own pass (a moment after its ScaledObject, when the pass holds
    # the status for the Deployment controller's report).
    full = f"budget {pool} is full (3 of 3 GPUs): {namespace}/chat (priority 100)"
    wait_until(
        lambda: share(kube, namespace, "batch").get("message", "").startswith(full), "batch's reason", 60
    )
    events = client.CoreV1Api(cluster_api).list_namespaced_event(
        namespace, field_selector="reason=BudgetScaledIn"
    )
    assert any(
        e.involved_object.name == "batch" and "maxReplicaCount 2 -> 1" in e.message for e in events.items
    )

    # batch's HPA scales it in (its drain): the GPU is free, chat's limit rises to 2.
    scale(cluster_api, namespace, "batch", 1)
    wait_until(lambda: max_replicas(raw, namespace, "chat") == 2, "chat's maxReplicaCount 2", 60)
    status = wait_until(
        lambda: (
            (b := kube.get_cluster_custom_object(GROUP, VERSION, BUDGET_PLURAL, pool).get("status"))
            and b.get("gpusHeld") == 2
            and b
        ),
        "the budget's status",
        60,
    )
    assert [(m["service"], m["allocated"], m["limit"]) for m in status["members"]] == [
        (f"{namespace}/chat", 2, 2),
        (f"{namespace}/batch", 1, 1),
    ]
    assert status["gpusAllocated"] == 3 and status["problems"] == []

    # chat's load stops: batch gets its second replica back once chat's demand has stayed low for chat's
    # cooldownPeriod (10 s), not before.
    demand(cluster_api, namespace, "chat", 1)
    stopped = time.monotonic()
    wait_until(lambda: max_replicas(raw, namespace, "batch") == 2, "batch's replica back", 60)
    assert time.monotonic() - stopped >= 10


def test_an_operator_killed_before_and_mid_hand_over_scales_in_nothing_and_finishes_it(
    operator: OperatorProcess,
    kube: client.CustomObjectsApi,
    cluster_api: Any,
    raw: Kube,
    namespace: str,
    pool: str,
    keda: KedaStandIn,
) -> None:
    """A crashed operator (SIGKILL) forgets nothing the budget needs: its successor lists the budgets before
    its first pass and reads demand and pods from the API server. Killed while batch holds the 2 replicas it
    was given, the new process leaves batch's limit at 2 (a restart scales nothing in); killed while batch
    still holds the GPU chat waits for, the new one keeps chat's limit at 1; killed again, batch's pod gone
    while no operator ran, the next one raises chat's limit. Sampled all along, each new process watched
    through one periodic resync: chat's limit is never 2 while batch holds 2 pods, batch's never drops below
    what it was given, and the limits never promise more than the 3 GPUs."""
    quiet_pair(kube, cluster_api, raw, namespace, pool)
    samples: list[tuple[int | None, int | None, int]] = []  # (chat's limit, batch's limit, batch's pods)

    def sample() -> tuple[int | None, int | None, int]:
        now = (
            max_replicas(raw, namespace, "chat"),
            max_replicas(raw, namespace, "batch"),
            pods(raw, namespace, "batch"),
        )
        samples.append(now)
        return now

    def restart(what: str) -> tuple[int | None, int | None, int]:
        """A new operator process, sampled until its first periodic resync has passed."""
        operator.kill()
        operator.start()
        wait_until(lambda: sample() and operator.resyncs() >= 1, f"{what}: a resync of the new operator", 60)
        return sample()

    try:
        assert restart("quiet") == (1, 2, 2), samples[-5:]
        assert all(batch == 2 for _, batch, _ in samples), samples

        demand(cluster_api, namespace, "chat", 3)
        wait_until(lambda: max_replicas(raw, namespace, "batch") == 1, "batch handing a replica over", 60)
        assert restart("mid hand-over") == (1, 1, 2), samples[-5:]

        operator.kill()
        scale(cluster_api, namespace, "batch", 1)  # its drain ends while no operator runs
        wait_until(lambda: pods(raw, namespace, "batch") == 1, "batch's second pod gone", 60)
        operator.start()
        wait_until(lambda: sample()[0] == 2, "chat's maxReplicaCount 2 from the third operator", 60)
    finally:
        if operator.proc is None:
            operator.start()
    assert all(not (chat == 2 and held == 2) for chat, _, held in samples), samples
    assert all((chat or 0) + (batch or 0) <= GPUS for chat, batch, _ in samples), samples
    assert max_replicas(raw, namespace, "batch") == 1


def test_a_priority_above_the_budgets_grant_is_refused_with_the_field(
    operator: OperatorProcess,
    kube: client.CustomObjectsApi,
    cluster_api: Any,
    raw: Kube,
    namespace: str,
    keda: KedaStandIn,
) -> None:
    """spec.priorityLimits through the real API server's schema: a team granted 10 that claims 100 holds its
    guarantee and is told why; the budget lists it under refused."""
    name = f"grants-{namespace[-6:]}"
    body = gpu_budget(name, GPUS, namespace)
    body["spec"]["priorityLimits"] = [{"namespaceSelector": {}, "maxPriority": 10}]
    kube.create_cluster_custom_object(GROUP, VERSION, BUDGET_PLURAL, body)
    try:
        create(kube, "greedy", namespace, name, 100)
        demand(cluster_api, namespace, "greedy", 3)
        reason = (
            f"spec.autoscaling.budget.priority 100 is above 10, the most GPUBudget {name} allows namespace "
            f"{namespace} (its spec.priorityLimits)"
        )
        held = wait_until(
            lambda: (s := share(kube, namespace, "greedy")).get("message", "").startswith(reason) and s,
            "greedy's refusal",
            60,
        )
        assert held["admitted"] is False and held["limit"] == 1, held
        assert max_replicas(raw, namespace, "greedy") == 1
        refused = wait_until(
            lambda: (
                kube.get_cluster_custom_object(GROUP, VERSION, BUDGET_PLURAL, name).get("status") or {}
            ).get("refused"),
            "the budget's refused list",
            60,
        )
        assert refused == [f"{namespace}/greedy: {reason}"], refused
    finally:
        kube.delete_cluster_custom_object(GROUP, VERSION, BUDGET_PLURAL, name)
