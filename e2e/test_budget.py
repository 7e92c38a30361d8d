"""A GPUBudget end to end on real components (docs/budget.md): two tiny services share a budget of 3 of the
real node's 4 GPUs. batch (priority 0) under load scales to 2; load on chat (priority 100) makes the budget
hand batch's second GPU to chat: batch's maxReplicaCount drops, its HPA scales it in through the runtime's
drain, and only once that pod is gone does chat's limit rise and KEDA start chat's second replica. When chat's
load stops, chat scales in and batch gets its replica back. Both loads run through the Services' ClusterIPs
from clients that never retry, and no request fails; sampled every second from the API server, the two
services' pods (Pending and terminating ones included) never hold more than the budget's 3 GPUs."""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml

from e2e.lab.chartenv import ChartOperator
from e2e.lab.cluster import Cluster
from e2e.lab.observability import Load
from e2e.lab.processes import WaitTimeout, wait_until
from e2e.lab.realpods import Holding, get_json, isvc, service_url, wait_condition
from e2e.lab.samples import gpu_budget, tiny_sample
from e2e.lab.stack import Stack

pytestmark = pytest.mark.e2e

GPUS = 3
SERVICES = {"batch": 0, "chat": 100}  # name -> priority
TARGET_IN_FLIGHT = 4
CLIENTS = 8  # two replicas' worth at the target


def budgeted_sample(namespace: str, name: str, budget: str) -> dict[str, Any]:
    sample = tiny_sample(namespace, name, real_pods=True)
    sample["spec"].pop("replicas")
    sample["spec"]["runtime"]["startupTimeoutSeconds"] = 900  # engines start beside busy ones on two cores
    sample["spec"]["monitoring"] = {"serviceMonitor": {"enabled": True, "interval": "2s"}}
    sample["spec"]["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 2,
        "metric": "InFlight",
        "targetInFlight": TARGET_IN_FLIGHT,
        "pollingInterval": 5,
        "cooldownPeriod": 30,
        "budget": {"name": budget, "priority": SERVICES[name]},
    }
    return sample


def ready(cluster: Cluster, namespace: str, name: str) -> int:
    deployment = get_json(cluster, "deployment", name, "-n", namespace)
    return int((deployment.get("status") or {}).get("readyReplicas") or 0)


@pytest.mark.timeout(1800)
def test_a_busy_high_priority_service_takes_a_gpu_the_low_one_hands_over_through_its_drain(
    stack: Stack, operator: ChartOperator, namespace: str
) -> None:
    cluster = stack.cluster
    budget = f"team-{namespace[-6:]}"
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(gpu_budget(budget, GPUS, namespace)))
    holding = Holding(cluster, namespace, SERVICES)
    loads: dict[str, Load] = {}
    try:
        for name in SERVICES:
            cluster.kubectl(
                "apply", "-f", "-", input=yaml.safe_dump(budgeted_sample(namespace, name, budget))
            )
        for name in SERVICES:
            wait_condition(cluster, namespace, name, "Ready", timeout=600)
        urls = {name: service_url(cluster, namespace, name) for name in SERVICES}
        loads = {
            name: Load(urls[name], "tiny", clients=CLIENTS, max_tokens=32, max_seconds=1500)
            for name in SERVICES
        }
        holding.start()

        # batch's load: the budget lets it have 2 (1 guaranteed each, the third GPU to the one that asks).
        loads["batch"].start()
        wait_until(lambda: ready(cluster, namespace, "batch") == 2, "batch at 2 Ready replicas", 600, 2)
        assert holding.last("chat")[1] == 1

        # chat's load: the budget gives chat 2, batch 1. batch hands its second GPU over through its drain.
        loads["chat"].start()
        marks = {"chat's load": time.monotonic()}
        wait_until(lambda: holding.last("batch")[1] == 1, "batch's maxReplicaCount 1", 180, 1)
        marks["batch's limit 1"] = time.monotonic()
        wait_until(lambda: holding.last("chat")[1] == 2, "chat's maxReplicaCount 2", 300, 1)
        marks["chat's limit 2"] = time.monotonic()
        wait_until(lambda: ready(cluster, namespace, "chat") == 2, "chat at 2 Ready replicas", 600, 2)
        marks["chat's 2nd Ready"] = time.monotonic()
        assert ready(cluster, namespace, "batch") == 1

        def batch_says_why() -> dict[str, Any] | None:  # its next pass after its HPA's next look at the load
            share: dict[str, Any] = isvc(cluster, namespace, "batch")["status"].get("budget") or {}
            said = share.get("allocated") == 1 and f"{namespace}/chat (priority 100)" in share.get(
                "message", ""
            )
            return share if said else None

        try:
            wait_until(batch_says_why, "batch's status.budget to name chat", 90, 2)
        except WaitTimeout:
            raise AssertionError(isvc(cluster, namespace, "batch")["status"].get("budget")) from None
        events = get_json(cluster, "events", "-n", namespace, "--field-selector", "reason=BudgetScaledIn")
        assert any(e["involvedObject"]["name"] == "batch" for e in events["items"]), events["items"]

        # chat's load stops: it scales in after its cooldown, and batch gets its replica back.
        loads["chat"].stop()
        marks["chat's load stops"] = time.monotonic()
        wait_until(lambda: ready(cluster, namespace, "batch") == 2, "batch back at 2 Ready replicas", 600, 2)
        marks["batch's 2nd Ready again"] = time.monotonic()
        loads["batch"].stop()
    finally:
        for load in loads.values():
            load.stop()
        holding.stop()
        cluster.kubectl("delete", "gpubudget", budget, "--ignore-not-found")

    for name, load in loads.items():
        assert load.failures == [], (name, load.failures[:10])
        assert load.completed > 20, (name, load.completed)
    held = [sum(count for count, _ in sample.values()) for sample in holding.samples]
    over = [i for i, total in enumerate(held) if total > GPUS]
    # On failure: each service's (GPU-holding pods, maxReplicaCount) and (demand, allocated) from 5 s before
    # the first second over.
    assert held, "no sample of the pods"
    around = slice(max(0, over[0] - 5), over[0] + 3) if over else slice(0)
    assert not over, (max(held), over[:10], holding.samples[around], holding.shares[around])
    # The hand-over happened in that order: batch's limit dropped before chat's rose, and chat's rose only
    # once batch held one GPU.
    limits = [(s["batch"][1], s["chat"][1], s["batch"][0]) for s in holding.samples]
    raised = next(i for i, (_, chat, _) in enumerate(limits) if chat == 2)
    assert limits[raised][0] == 1 and limits[raised][2] <= 1, limits[raised - 3 : raised + 1]
    start = marks["chat's load"]
    times = ", ".join(f"{what} +{at - start:.0f} s" for what, at in marks.items())
    print(
        f"\nbudget hand-over: completed batch={loads['batch'].completed} chat={loads['chat'].completed}, "
        f"failed 0; most GPUs held at once {max(held)} of {GPUS}; {times}"
    )
