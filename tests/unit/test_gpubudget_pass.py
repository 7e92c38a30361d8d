"""A GPUBudget applied by the members' passes (operator/reconcile/gpubudget.py through core.reconcile): each
member's ScaledObject maxReplicaCount, its status.budget and Events, the budget's status, the members woken,
and the services a budget refuses. The API server is a recording stand-in (as in test_rollouts.py); tier 2
(tests/integration/test_operator_budget.py) runs the same against the real one."""

from __future__ import annotations

from typing import Any

from pagoda.operator.kube.cache import ObjectCache
from pagoda.operator.reconcile import core
from pagoda.operator.reconcile.gpubudget import GPUBudgets, selects
from pagoda.operator.resources.meta import MANAGED_BY
from tests.unit.test_rollouts import Kube as RecordingKube

Obj = dict[str, Any]
NOW = "2026-12-06T12:00:00Z"


def service(
    name: str, priority: int, budget: str = "pool", namespace: str = "ns", product: str | None = None
) -> Obj:
    gpu: Obj = {"count": 1}
    if product:
        gpu["product"] = product
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {
            "model": {"uri": "hf://pagoda-test/tiny-llama"},
            "resources": {"gpu": gpu},
            "autoscaling": {
                "minReplicas": 1,
                "maxReplicas": 4,
                "metricsSource": "External",
                "budget": {"name": budget, "priority": priority},
            },
        },
        "status": {},
    }


def gpu_budget(gpus: int, selector: Obj | None = None, product: str | None = None) -> Obj:
    spec: Obj = {"gpus": gpus, "namespaceSelector": {} if selector is None else selector}
    if product:
        spec["product"] = product
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "GPUBudget",
        "metadata": {"name": "pool"},
        "spec": spec,
    }


def hpa(name: str, desired: int, namespace: str = "ns", max_replicas: int = 4, version: int = 5) -> Obj:
    """KEDA's HPA of `name` as the controller writes it when its metric (in flight per replica, target 1, one
    replica now) asks for `desired` replicas: desiredReplicas capped at `max_replicas` (the maxReplicaCount
    KEDA last copied to it from the ScaledObject), ScalingLimited/TooManyReplicas past the cap."""
    metric = {"name": "s0-prometheus"}
    limited = desired > max_replicas
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {
            "name": f"keda-hpa-{name}",
            "namespace": namespace,
            "uid": f"hpa-{name}",
            "resourceVersion": str(version),
            "labels": {"pagoda.dev/inferenceservice": name, "app.kubernetes.io/managed-by": MANAGED_BY},
        },
        "spec": {
            "maxReplicas": max_replicas,
            "minReplicas": 1,
            "metrics": [
                {
                    "type": "External",
                    "external": {"metric": metric, "target": {"type": "AverageValue", "averageValue": "1"}},
                }
            ],
        },
        "status": {
            "currentReplicas": 1,
            "desiredReplicas": min(desired, max_replicas),
            "currentMetrics": [
                {
                    "type": "External",
                    "external": {"metric": metric, "current": {"averageValue": str(desired)}},
                }
            ],
            "conditions": [
                {
                    "type": "ScalingLimited",
                    "status": str(limited),
                    "reason": "TooManyReplicas" if limited else "DesiredWithinRange",
                }
            ],
        },
    }


def pods(cache: ObjectCache, name: str, count: int, namespace: str = "ns") -> None:
    """`count` Running pods of `name` (holding a GPU each); earlier ones beyond `count` are gone."""
    for (kind, pod), _ in list(cache.children(namespace, name).items()):
        if kind == "Pod":
            cache.forget_child(namespace, name, "Pod", pod)
    for i in range(count):
        cache.observe(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{name}-{i}",
                    "namespace": namespace,
                    "uid": f"{name}-pod-{i}",
                    "resourceVersion": str(10 + i),
                    "labels": {
                        "pagoda.dev/inferenceservice": name,
                        "app.kubernetes.io/managed-by": MANAGED_BY,
                    },
                },
                "status": {"phase": "Running"},
            },
            api_version="v1",
            kind="Pod",
        )


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Kube(RecordingKube):
    """test_rollouts' recording API server, with namespaces (and their labels), Events and GPUBudget status
    writes."""

    def __init__(self, cache: ObjectCache, labels: dict[str, dict[str, str]] | None = None) -> None:
        super().__init__({})
        self.clock = Clock()  # the operator's clock (fleet() gives it to GPUBudgets)
        self.cache = cache
        self.labels = labels or {}
        self.budget_statuses: list[Obj] = []
        self.budget = gpu_budget(0)  # the GPUBudget as the API server holds it (fleet() sets it)
        self.events: list[Obj] = []

    def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> Obj | None:
        assert plural == "namespaces", plural
        return {"metadata": {"name": name, "labels": self.labels.get(name, {})}}

    def create(self, manifest: Obj, plural: str) -> Obj:
        if manifest.get("kind") == "Event":
            self.events.append(manifest)
        return manifest

    def patch_status(
        self, api_version: str, kind: str, plural: str, ns: str | None, name: str, status: Obj
    ) -> Obj:
        if kind == "GPUBudget":
            self.budget_statuses.append(status)
            return {**self.budget, "status": status}
        owner = self.cache.owner(ns or "", name)
        assert owner is not None
        return {**owner, "status": status}

    def max_replicas(self, name: str) -> int:
        [last] = [m for m in self.applied if m["kind"] == "ScaledObject" and m["metadata"]["name"] == name][
            -1:
        ]
        return int(last["spec"]["maxReplicaCount"])


def run(kube: Kube, cache: ObjectCache, budgets: GPUBudgets, name: str, namespace: str = "ns") -> Obj:
    """One pass of `name`; its status.budget."""
    core.reconcile(kube, namespace, name, now=lambda: NOW, cache=cache, budgets=budgets)  # type: ignore[arg-type]
    return dict((cache.owner(namespace, name) or {}).get("status", {}).get("budget") or {})


def fleet(gpus: int = 4) -> tuple[ObjectCache, GPUBudgets, list[tuple[str, str]], Kube]:
    cache = ObjectCache("InferenceService")
    for obj in (service("chat", 100), service("batch", 0)):
        cache.observe(obj)
    woken: list[tuple[str, str]] = []
    kube = Kube(cache)
    budgets = GPUBudgets(wake=woken.append, clock=kube.clock)
    budgets.observe(gpu_budget(gpus))
    kube.budget = gpu_budget(gpus)
    return cache, budgets, woken, kube


def test_a_busy_high_priority_member_takes_gpus_only_after_the_lower_one_drains() -> None:
    cache, budgets, woken, kube = fleet()
    cache.observe(hpa("batch", 3, max_replicas=3))
    pods(cache, "batch", 3)
    cache.observe(hpa("chat", 1, max_replicas=1))
    pods(cache, "chat", 1)
    # Quiet: batch gets the 3 it asks for, chat its 1.
    assert run(kube, cache, budgets, "batch")["limit"] == 3
    assert kube.max_replicas("batch") == 3
    assert ("ns", "chat") in woken  # its ScaledObject does not carry its limit yet
    assert run(kube, cache, budgets, "chat") == {
        "name": "pool",
        "admitted": True,
        "demand": 1,
        "allocated": 1,
        "limit": 1,
    }
    # Load on chat: it asks for 3. The budget gives it 3, batch 1; batch's limit drops at once, chat's
    # rises only into free GPUs (none yet: batch's 3 pods still hold them).
    cache.observe(hpa("chat", 3, max_replicas=1, version=6))
    chat = run(kube, cache, budgets, "chat")
    assert (chat["allocated"], chat["limit"]) == (3, 1), chat
    assert chat["message"] == (
        "2 of its allocated replicas wait for another member's drain to free their GPUs (maxReplicaCount 1 "
        "until then)"
    )
    batch = run(kube, cache, budgets, "batch")
    assert (batch["allocated"], batch["limit"]) == (1, 1) and kube.max_replicas("batch") == 1
    assert batch["message"] == (
        "budget pool is full (4 of 4 GPUs): ns/chat (priority 100) holds 3; this service gets 1 of the 3 "
        "replicas it asks for"
    )
    [event] = [e for e in kube.events if e["reason"] == "BudgetScaledIn"]
    assert event["involvedObject"]["name"] == "batch" and "maxReplicaCount 3 -> 1" in event["message"]
    # batch's pods are gone, but KEDA has not yet given its HPA the lower maxReplicas: batch could still
    # scale back up into them, so chat's limit waits.
    pods(cache, "batch", 1)
    assert run(kube, cache, budgets, "chat")["limit"] == 1
    # KEDA applies batch's maxReplicaCount 1 to its HPA: the GPUs are free, chat's limit rises to 3.
    cache.observe(hpa("batch", 3, max_replicas=1, version=7))
    assert run(kube, cache, budgets, "chat")["limit"] == 3 and kube.max_replicas("chat") == 3
    assert any(e["reason"] == "BudgetScaledOut" for e in kube.events)
    status = kube.budget_statuses[-1]
    assert [(m["service"], m["allocated"], m["limit"]) for m in status["members"]] == [
        ("ns/chat", 3, 3),
        ("ns/batch", 1, 1),
    ]
    assert status["gpusAllocated"] == 4 and status["problems"] == []
    # chat's load stops: batch gets its replicas back once chat's demand has stayed low for chat's scale-down
    # window (its cooldownPeriod, 300 s by default), as chat's own HPA scales in.
    cache.observe(hpa("chat", 1, max_replicas=3, version=8))
    assert run(kube, cache, budgets, "batch")["allocated"] == 1
    kube.clock.advance(299)
    assert run(kube, cache, budgets, "batch")["allocated"] == 1
    kube.clock.advance(2)
    assert run(kube, cache, budgets, "batch")["allocated"] == 3


def busy_chat() -> tuple[ObjectCache, GPUBudgets, Kube]:
    """A budget of 3: chat asks for 2 and holds them, batch asks for 2 and holds the 1 left."""
    cache, budgets, _, kube = fleet(gpus=3)
    cache.observe(hpa("batch", 2, max_replicas=1))
    pods(cache, "batch", 1)
    cache.observe(hpa("chat", 2, max_replicas=2))
    pods(cache, "chat", 2)
    return cache, budgets, kube


def test_a_busy_members_demand_dipping_for_a_moment_moves_no_gpu() -> None:
    """The flap e2e/test_budget.py caught in a clean-clone run (docs/budget.md): chat, busy at its limit,
    read as asking for 1 replica whenever its metric dipped for a poll, so batch's limit went 1 -> 2 -> 1
    five times in 90 s, and a replica batch started there held a GPU chat was given. Its demand now falls
    only once it has stayed low for chat's scale-down window."""
    cache, budgets, kube = busy_chat()
    assert run(kube, cache, budgets, "chat")["limit"] == 2
    assert run(kube, cache, budgets, "batch")["limit"] == 1
    before = len(kube.applied)
    for second in range(0, 90, 15):  # a poll every 15 s, each other one low
        kube.clock.advance(15)
        cache.observe(hpa("chat", 1 if second % 30 else 2, max_replicas=2, version=6 + second))
        chat, batch = run(kube, cache, budgets, "chat"), run(kube, cache, budgets, "batch")
        assert (chat["demand"], chat["allocated"]) == (2, 2), (second, chat)
        assert (batch["allocated"], batch["limit"]) == (1, 1), (second, batch)
    applied = [m for m in kube.applied[before:] if m["kind"] == "ScaledObject"]
    assert {m["metadata"]["name"]: m["spec"]["maxReplicaCount"] for m in applied} in ({}, {"batch": 1}), (
        applied
    )


def test_a_restarted_operator_holds_the_demand_the_last_one_reported() -> None:
    """The readings are in the operator's memory; a new process starts from each member's
    status.budget.demand, so a dip it reads first does not hand chat's GPU over either."""
    cache, budgets, kube = busy_chat()
    assert run(kube, cache, budgets, "chat")["demand"] == 2
    restarted = GPUBudgets(clock=kube.clock)
    restarted.observe(gpu_budget(3))
    cache.observe(hpa("chat", 1, max_replicas=2, version=6))  # the first thing the new process reads: a dip
    assert run(kube, cache, restarted, "batch")["allocated"] == 1
    assert run(kube, cache, restarted, "chat")["demand"] == 2
    kube.clock.advance(301)  # chat's demand stayed low for its cooldownPeriod (300 s)
    assert run(kube, cache, restarted, "batch")["allocated"] == 2


def test_a_metric_within_the_hpas_tolerance_asks_for_no_more_replicas() -> None:
    """At its cap, chat's metric 5% over its target: the HPA would not scale for it (its 10% tolerance), so
    neither does the budget (it read 2 replicas for 1.05 x 1 before, and flapped with the metric)."""
    cache, budgets, _, kube = fleet(gpus=3)
    near = hpa("chat", 2, max_replicas=1)
    near["status"]["currentMetrics"][0]["external"]["current"]["averageValue"] = "1.05"
    cache.observe(near)
    assert run(kube, cache, budgets, "chat")["demand"] == 1
    over = hpa("chat", 2, max_replicas=1, version=6)
    over["status"]["currentMetrics"][0]["external"]["current"]["averageValue"] = "1.2"
    cache.observe(over)
    assert run(kube, cache, budgets, "chat")["demand"] == 2


def test_a_gpu_promised_to_a_members_autoscaler_is_not_free_until_it_takes_the_lower_limit() -> None:
    """The race the bench found (docs/benchmarks.md, bench-budget): batch, given a second replica it had not
    started yet (its ScaledObject and HPA at 2, one pod), hands it over when chat's load comes. Its pod count
    says a GPU is free, but its HPA may still start that replica until KEDA gives it maxReplicas 1, so chat's
    limit must not rise before: with it, 4 pods held 3 GPUs at once."""
    cache, budgets, _, kube = fleet(gpus=3)
    cache.observe(hpa("batch", 2, max_replicas=2))
    pods(cache, "batch", 1)
    cache.observe(hpa("chat", 1, max_replicas=1))
    pods(cache, "chat", 1)
    assert run(kube, cache, budgets, "batch")["limit"] == 2  # applied: batch's ScaledObject at 2
    cache.observe(hpa("chat", 2, max_replicas=1, version=6))  # chat's load
    assert run(kube, cache, budgets, "chat")["limit"] == 1
    assert run(kube, cache, budgets, "batch")["limit"] == 1  # its ScaledObject lowered; its HPA not yet
    assert run(kube, cache, budgets, "chat")["limit"] == 1
    cache.observe(hpa("batch", 2, max_replicas=1, version=7))  # KEDA applied it: nothing can start now
    assert run(kube, cache, budgets, "chat")["limit"] == 2


def test_a_demand_the_limit_holds_back_is_read_from_the_hpas_metrics() -> None:
    """The HPA caps desiredReplicas at maxReplicaCount: while ScalingLimited/TooManyReplicas, what its
    metrics ask for counts (here 2 replicas at 10 in flight each over a target of 4: 5)."""
    cache, budgets, _, kube = fleet(gpus=8)
    capped = hpa("chat", 2)
    capped["spec"]["metrics"] = [
        {
            "type": "External",
            "external": {
                "metric": {"name": "s0-prometheus"},
                "target": {"type": "AverageValue", "averageValue": "4"},
            },
        }
    ]
    capped["status"] = {
        "currentReplicas": 2,
        "desiredReplicas": 2,
        "currentMetrics": [
            {
                "type": "External",
                "external": {"metric": {"name": "s0-prometheus"}, "current": {"averageValue": "10"}},
            }
        ],
        "conditions": [{"type": "ScalingLimited", "status": "True", "reason": "TooManyReplicas"}],
    }
    cache.observe(capped)
    assert run(kube, cache, budgets, "chat")["demand"] == 4  # 5, up to its maxReplicas


def test_a_service_the_budget_does_not_admit_holds_its_guarantee_and_says_why() -> None:
    cache, budgets, _, _ = fleet()
    budgets.observe(gpu_budget(4, selector={"matchLabels": {"team": "search"}}))
    kube = Kube(cache, labels={"ns": {"team": "ads"}})
    kube.budget = gpu_budget(4, selector={"matchLabels": {"team": "search"}})
    cache.observe(hpa("chat", 3))
    status = run(kube, cache, budgets, "chat")
    assert status["admitted"] is False and status["limit"] == 1 and kube.max_replicas("chat") == 1
    assert "does not admit namespace ns (its spec.namespaceSelector)" in status["message"]
    assert kube.budget_statuses[-1]["refused"][0].startswith("ns/batch: GPUBudget pool does not admit")


def test_priority_limits_grant_priorities_by_namespace_and_refuse_a_member_above_its_grant() -> None:
    """A team may not claim a priority its budget's owner has not granted its namespace: the highest
    maxPriority of the entries that select it, 0 (the default) where none does."""
    limits = [
        {"namespaceSelector": {}, "maxPriority": 10},
        {"namespaceSelector": {"matchLabels": {"team": "search"}}, "maxPriority": 100},
    ]
    labels = {"search": {"team": "search"}, "ads": {"team": "ads"}}
    for grants, member, priority, admitted in [
        (limits, "search", 100, True),  # its team's grant
        (limits, "ads", 10, True),  # every namespace's
        (limits, "ads", 50, False),
        (limits[1:], "ads", 0, True),  # no grant selects it: the default priority only
        (limits[1:], "ads", 1, False),
        ([], "ads", 1_000_000, True),  # no limits set
    ]:
        cache = ObjectCache("InferenceService")
        cache.observe(service("chat", priority, namespace=member))
        cache.observe(hpa("chat", 3, namespace=member))
        budget = gpu_budget(4)
        budget["spec"]["priorityLimits"] = grants
        budgets = GPUBudgets()
        budgets.observe(budget)
        kube = Kube(cache, labels=labels)
        kube.budget = budget
        status = run(kube, cache, budgets, "chat", namespace=member)
        assert status["admitted"] is admitted, (grants, member, priority, status)
        if admitted:
            assert status["limit"] == 3 and kube.budget_statuses[-1]["refused"] == []
            continue
        ceiling = 10 if len(grants) == 2 else 0
        reason = (
            f"spec.autoscaling.budget.priority {priority} is above {ceiling}, the most GPUBudget pool allows "
            f"namespace {member} (its spec.priorityLimits)"
        )
        assert status["limit"] == 1, status
        assert status["message"] == f"{reason}: it holds only its guarantee, minReplicas", status
        assert kube.budget_statuses[-1]["refused"] == [f"{member}/chat: {reason}"]


def test_a_missing_budget_or_another_product_is_named() -> None:
    cache = ObjectCache("InferenceService")
    cache.observe(service("chat", 1, budget="nowhere"))
    cache.observe(service("h100", 1, product="NVIDIA-H100-80GB-HBM3"))
    budgets = GPUBudgets()
    budgets.observe(gpu_budget(4, product="NVIDIA-A100-SXM4-80GB"))
    kube = Kube(cache)
    missing = run(kube, cache, budgets, "chat")
    assert missing["message"].startswith("GPUBudget nowhere does not exist (spec.autoscaling.budget.name)")
    other = run(kube, cache, budgets, "h100")
    assert other["admitted"] is False
    assert other["message"].startswith(
        "spec.resources.gpu.product NVIDIA-H100-80GB-HBM3 is not GPUBudget pool's product "
        "NVIDIA-A100-SXM4-80GB"
    )


def test_budgets_that_cannot_be_read_bound_nothing_and_say_so() -> None:
    cache, budgets, _, kube = fleet()
    budgets.known = False
    status = run(kube, cache, budgets, "chat")
    assert status["admitted"] is False and kube.max_replicas("chat") == 4
    assert "cannot read GPUBudgets" in status["message"]


def test_a_budget_smaller_than_the_guarantees_is_a_problem_naming_spec_gpus() -> None:
    cache, budgets, _, kube = fleet(gpus=1)
    run(kube, cache, budgets, "chat")
    [problem] = kube.budget_statuses[-1]["problems"]
    assert problem.startswith("spec.gpus: 1 GPUs cannot cover the members' guaranteed replicas")


def test_label_selectors_as_kubernetes_reads_them() -> None:
    labels = {"team": "search", "tier": "prod"}
    assert selects({}, labels) and not selects(None, labels)
    assert selects({"matchLabels": {"team": "search"}}, labels)
    assert not selects({"matchLabels": {"team": "ads"}}, labels)
    expressions = [
        ({"key": "tier", "operator": "In", "values": ["prod", "staging"]}, True),
        ({"key": "tier", "operator": "NotIn", "values": ["prod"]}, False),
        ({"key": "gpu", "operator": "Exists"}, False),
        ({"key": "gpu", "operator": "DoesNotExist"}, True),
    ]
    for requirement, expected in expressions:
        assert selects({"matchExpressions": [requirement]}, labels) is expected, requirement
