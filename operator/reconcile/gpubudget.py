"""GPUBudgets in the operator (docs/budget.md): the budgets its watch has seen, each member's share worked out
in the member's own pass, and the budget's status.

A member's pass (a service whose spec.autoscaling.budget names a budget) reads the whole budget from the
operator's cache: every service naming it, each one's HPA (what its autoscaler asks for: status/gpubudget.py
`demand`, held over the member's scale-down window by `remember` from the readings kept here, in memory: a
restarted operator starts from the demand its member's status.budget last reported) and pods (the GPUs they
hold). It allocates (`allocate`, `hand_over`: pure, status/gpubudget.py) and applies only its own result, as
its ScaledObject's maxReplicaCount (ChildInputs.budget_limit), so that each object keeps one writer. The
others' limits are worked out too: a member whose ScaledObject does not have its limit yet is woken (a pass
queued), which is how one member's load, or another's drained replica, reaches the rest. The budget's status
(every member's share) is written by whichever member's pass sees it change. A GPUBudget's own watch event
wakes its members.

A service that names a budget the budget does not admit (its namespaceSelector, its product), or one that
does not exist, holds its guarantee (minReplicas, at least 1) and says why in status.budget.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from pagoda.operator import metrics
from pagoda.operator.api import API_VERSION, InferenceServiceSpec
from pagoda.operator.api.budget import BUDGET_KIND, BUDGET_PLURAL, GPUBudgetSpec
from pagoda.operator.kube.cache import ObjectCache
from pagoda.operator.kube.client import Kube, KubeError
from pagoda.operator.status import gpubudget
from pagoda.operator.status.gpubudget import Member
from pagoda.operator.status.scaling import HPA_KIND, hpa_name

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Key = tuple[str, str]
NAMESPACE_TTL_S = 30.0  # how long a namespace's labels are trusted for a budget's namespaceSelector
ENDED_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Share:
    """What a member's pass applies and reports: `limit`, its ScaledObject's maxReplicaCount (None: its own
    maxReplicas, nothing bounds it); `status`, its status.budget."""

    limit: int | None
    status: Obj


@dataclass
class _Budget:
    obj: Obj
    series: set[tuple[str, str, str]] = field(default_factory=set)  # the gauge's label sets it wrote


def budget_ref(spec: InferenceServiceSpec | None) -> Any:
    """The service's spec.autoscaling.budget, or None."""
    return spec.autoscaling.budget if spec is not None and spec.autoscaling is not None else None


def guarantee_limit(spec: InferenceServiceSpec) -> int:
    """A refused member's maxReplicaCount: its guarantee, at least 1 (KEDA needs maxReplicaCount >= 1)."""
    assert spec.autoscaling is not None
    return max(spec.autoscaling.min_replicas, 1)


def selects(selector: Obj | None, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (camelCase, as the API server stores it) against `labels`; None selects
    nothing (a budget admits only the namespaces its owner names), {} everything."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for requirement in selector.get("matchExpressions") or []:
        key, operator, values = requirement["key"], requirement["operator"], requirement.get("values") or []
        present = key in labels
        if operator == "In" and (not present or labels[key] not in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


class GPUBudgets:
    """The budgets seen by the watch (thread-safe). `wake` queues a service's pass (from any thread)."""

    def __init__(
        self, wake: Callable[[Key], None] | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._wake = wake
        self._clock = clock
        self._lock = threading.Lock()
        self._budgets: dict[str, _Budget] = {}
        self._namespaces: dict[str, tuple[float, dict[str, str] | None]] = {}
        self._asked: dict[Key, tuple[gpubudget.Reading, ...]] = {}  # each member's demand readings
        self.known = True  # False: the budgets could not be listed (no CRD, no RBAC); nothing is bounded

    def prime(self, kube: Kube) -> bool:
        """Lists the GPUBudgets before any pass runs, so a restarted operator never caps a member to its
        guarantee for want of having seen its budget yet. False (and nothing is bounded) when they cannot be
        listed: the CRD is not installed, or the operator may not read them."""
        try:
            items = kube.list(API_VERSION, BUDGET_PLURAL, None)
        except KubeError as exc:
            log.warning("Skipped GPUBudgets status=%d: %s", exc.status, exc.message)
            self.known = False
            return False
        for item in items:
            self.observe(item)
        return True

    def observe(self, obj: Obj, deleted: bool = False) -> None:
        """A GPUBudget from the watch (or a status write's answer)."""
        name = obj["metadata"]["name"]
        with self._lock:
            if deleted:
                self._budgets.pop(name, None)
            elif name in self._budgets:
                self._budgets[name].obj = obj
            else:
                self._budgets[name] = _Budget(obj)

    def wake_members(self, cache: ObjectCache, name: str) -> list[Key]:
        """Queue a pass of every service that names budget `name` (its spec, its existence changed)."""
        keys = [key for key, _ in members_named(cache, name)]
        if self._wake is not None:
            for key in keys:
                self._wake(key)
        return keys

    def _labels(self, kube: Kube, namespace: str) -> dict[str, str] | None:
        now = self._clock()
        with self._lock:
            cached = self._namespaces.get(namespace)
        if cached is not None and now - cached[0] < NAMESPACE_TTL_S:
            return cached[1]
        found = kube.get("v1", "namespaces", None, namespace)
        labels = None if found is None else dict((found.get("metadata") or {}).get("labels") or {})
        with self._lock:
            self._namespaces[namespace] = (now, labels)
        return labels

    def share(self, kube: Kube, cache: ObjectCache, owner: Obj, spec: InferenceServiceSpec) -> Share | None:
        """This member's share of its budget (None: the spec names no budget). Wakes the other members whose
        ScaledObject does not carry their limit yet, and writes the budget's status when it changed."""
        ref = budget_ref(spec)
        if ref is None:
            return None
        assert spec.autoscaling is not None
        meta = owner["metadata"]
        key = (meta["namespace"], meta["name"])
        asked = self.demand(cache, key, spec)
        if not self.known:
            unread = (
                "the operator cannot read GPUBudgets (it watches one namespace, or the GPUBudget CRD is not "
                "installed): nothing bounds this service"
            )
            return Share(None, _status(ref.name, False, spec, asked, spec.autoscaling.max_replicas, unread))
        with self._lock:
            entry = self._budgets.get(ref.name)
            budget = entry.obj if entry is not None else None
        if budget is None:
            return _refused(
                ref.name, spec, asked, f"GPUBudget {ref.name} does not exist (spec.autoscaling.budget.name)"
            )
        try:
            pool = GPUBudgetSpec.model_validate(budget.get("spec") or {})
        except ValidationError as exc:
            return _refused(
                ref.name, spec, asked, f"GPUBudget {ref.name} is invalid: {exc.errors()[0]['msg']}"
            )
        members: list[Member] = []
        refused: dict[Key, str] = {}
        named = {k: s for k, s in members_named(cache, ref.name) if k != key}
        named[key] = spec  # its own spec as this pass read it (the cache's copy may be older)
        for other_key, other_spec in sorted(named.items()):
            reason = self._refusal(kube, ref.name, budget, pool, other_key, other_spec)
            if reason is not None:
                refused[other_key] = reason
                continue
            asks = asked if other_key == key else self.demand(cache, other_key, other_spec)
            members.append(member(cache, other_key, other_spec, asks))
        if key in refused:
            self._write_status(kube, ref.name, pool, members, refused)
            return _refused(ref.name, spec, asked, refused[key])
        target = gpubudget.allocate(pool.gpus, members)
        limits = gpubudget.hand_over(pool.gpus, members, target)
        self._wake_behind(cache, key, limits)
        self._write_status(kube, ref.name, pool, members, refused, target, limits)
        me = next(m for m in members if m.key == key)
        why = gpubudget.shortfall(ref.name, pool.gpus, members, target, key)
        if limits[key] < target[key]:
            wait = (
                f"{target[key] - limits[key]} of its allocated replicas wait for another member's drain to "
                f"free their GPUs (maxReplicaCount {limits[key]} until then)"
            )
            why = f"{why}; {wait}" if why else wait
        status = {
            "name": ref.name,
            "admitted": True,
            "demand": min(me.demand, me.ceiling),
            "allocated": target[key],
            "limit": limits[key],
        }
        if why is not None:
            status["message"] = why
        return Share(limits[key], status)

    def demand(self, cache: ObjectCache, key: Key, spec: InferenceServiceSpec) -> int:
        """What service `key`'s autoscaler asks for now, held over its scale-down window (its cooldownPeriod):
        the most it asked for in that window (status/gpubudget.py `remember`)."""
        assert spec.autoscaling is not None
        asked = gpubudget.demand(_hpa(cache, key), spec.autoscaling.min_replicas)
        now = self._clock()
        with self._lock:
            before = self._asked.get(key)
            if before is None:  # a new operator process: the demand the last one reported counts as read now
                reported = (((cache.owner(*key) or {}).get("status") or {}).get("budget") or {}).get("demand")
                before = ((now, reported),) if isinstance(reported, int) else ()
            readings = gpubudget.remember(before, now, asked, spec.autoscaling.cooldown_period)
            self._asked[key] = readings
        return readings[0][1]

    def _refusal(
        self, kube: Kube, name: str, budget: Obj, pool: GPUBudgetSpec, key: Key, spec: InferenceServiceSpec
    ) -> str | None:
        labels = self._labels(kube, key[0])
        selector = (budget.get("spec") or {}).get("namespaceSelector")
        if labels is None or not selects(selector, labels):
            return f"GPUBudget {name} does not admit namespace {key[0]} (its spec.namespaceSelector)"
        assert spec.autoscaling is not None and spec.autoscaling.budget is not None
        priority = spec.autoscaling.budget.priority
        if pool.priority_limits:  # grants: the highest that selects the namespace, else the default (0)
            ceiling = max(
                (
                    limit.max_priority
                    for limit in pool.priority_limits
                    if selects(limit.namespace_selector.model_dump(by_alias=True), labels)
                ),
                default=0,
            )
            if priority > ceiling:
                return (
                    f"spec.autoscaling.budget.priority {priority} is above {ceiling}, the most GPUBudget "
                    f"{name} allows namespace {key[0]} (its spec.priorityLimits)"
                )
        product = spec.resources.gpu.product
        if pool.product is not None and product != pool.product:
            return (
                f"spec.resources.gpu.product {product or '(unset)'} is not GPUBudget {name}'s product "
                f"{pool.product}"
            )
        return None

    def _wake_behind(self, cache: ObjectCache, key: Key, limits: dict[Key, int]) -> None:
        if self._wake is None:
            return
        for other, limit in limits.items():
            if other == key:
                continue
            scaled = cache.children(*other).get(("ScaledObject", other[1]))
            if scaled is None or (scaled.get("spec") or {}).get("maxReplicaCount") != limit:
                self._wake(other)

    def _write_status(
        self,
        kube: Kube,
        name: str,
        pool: GPUBudgetSpec,
        members: list[Member],
        refused: dict[Key, str],
        target: dict[Key, int] | None = None,
        limits: dict[Key, int] | None = None,
    ) -> None:
        target = target if target is not None else gpubudget.allocate(pool.gpus, members)
        limits = limits if limits is not None else gpubudget.hand_over(pool.gpus, members, target)
        ordered = sorted(members, key=lambda m: (-m.priority, m.key))
        status = {
            "gpusAllocated": sum(target[m.key] * m.gpus for m in members),
            "gpusHeld": sum(m.holding * m.gpus for m in members),
            "members": [
                {
                    "service": f"{m.key[0]}/{m.key[1]}",
                    "priority": m.priority,
                    "gpusPerReplica": m.gpus,
                    "demand": min(m.demand, m.ceiling),
                    "allocated": target[m.key],
                    "limit": limits[m.key],
                    "holding": m.holding,
                }
                for m in ordered
            ],
            "refused": [f"{k[0]}/{k[1]}: {why}" for k, why in sorted(refused.items())],
            "problems": gpubudget.problems(pool.gpus, members),
        }
        with self._lock:
            entry = self._budgets.get(name)
            if entry is None:
                return
            self._gauge(name, entry, ordered, target, limits)
            if (entry.obj.get("status") or {}) == status:
                return
            try:  # one writer at a time: a racing pass would write the same
                written = kube.patch_status(API_VERSION, BUDGET_KIND, BUDGET_PLURAL, None, name, status)
            except KubeError as exc:
                log.warning(
                    "Failed to write GPUBudget status name=%s status=%d: %s", name, exc.status, exc.message
                )
                return
            entry.obj = written
        log.info("Updated GPUBudget status name=%s allocated=%d", name, status["gpusAllocated"])

    @staticmethod
    def _gauge(
        name: str, entry: _Budget, members: list[Member], target: dict[Key, int], limits: dict[Key, int]
    ) -> None:
        now: set[tuple[str, str, str]] = set()
        for m in members:
            for measure, value in (
                ("demand", min(m.demand, m.ceiling)),
                ("allocated", target[m.key]),
                ("limit", limits[m.key]),
                ("holding", m.holding),
            ):
                metrics.BUDGET_REPLICAS.labels(name, m.key[0], m.key[1], measure).set(value)
            now.add((name, m.key[0], m.key[1]))
        for gone in entry.series - now:
            for measure in ("demand", "allocated", "limit", "holding"):
                metrics.BUDGET_REPLICAS.remove(*gone, measure)
        entry.series = now


def members_named(cache: ObjectCache, name: str) -> list[tuple[Key, InferenceServiceSpec]]:
    """Every service in the cache whose valid spec names budget `name`, with its spec."""
    found = []
    for owner in cache.owners():
        if owner["metadata"].get("deletionTimestamp"):
            continue
        budget = (((owner.get("spec") or {}).get("autoscaling") or {}).get("budget") or {}).get("name")
        if budget != name:
            continue
        try:
            spec = InferenceServiceSpec.model_validate(owner.get("spec") or {})
        except ValidationError:
            continue
        found.append(((owner["metadata"]["namespace"], owner["metadata"]["name"]), spec))
    return sorted(found, key=lambda item: item[0])


def _hpa(cache: ObjectCache, key: Key) -> Obj | None:
    return cache.children(*key).get((HPA_KIND[1], hpa_name(key[1])))


def member(cache: ObjectCache, key: Key, spec: InferenceServiceSpec, demand: int) -> Member:
    """A member as the allocation reads it, from its spec, its children in the cache and its `demand`
    (GPUBudgets.demand)."""
    assert spec.autoscaling is not None and spec.autoscaling.budget is not None
    children = cache.children(*key)
    pods = [
        child
        for (kind, _), child in children.items()
        if kind == "Pod" and (child.get("status") or {}).get("phase") not in ENDED_PHASES
    ]
    hpa = _hpa(cache, key)
    scaled = children.get(("ScaledObject", key[1]))
    deployment = children.get(("Deployment", key[1]))
    committed = max(
        int(((scaled or {}).get("spec") or {}).get("maxReplicaCount") or 0),
        int(((hpa or {}).get("spec") or {}).get("maxReplicas") or 0),
        int(((deployment or {}).get("spec") or {}).get("replicas") or 0),
    )
    return Member(
        key=key,
        priority=spec.autoscaling.budget.priority,
        gpus=spec.resources.gpu.count,
        guaranteed=spec.autoscaling.min_replicas,
        ceiling=spec.autoscaling.max_replicas,
        demand=demand,
        holding=len(pods),
        committed=committed,
    )


def _refused(name: str, spec: InferenceServiceSpec, asked: int, why: str) -> Share:
    limit = guarantee_limit(spec)
    return Share(
        limit, _status(name, False, spec, asked, limit, f"{why}: it holds only its guarantee, minReplicas")
    )


def _status(name: str, admitted: bool, spec: InferenceServiceSpec, asked: int, limit: int, why: str) -> Obj:
    """status.budget of a service the budget does not bound as a member."""
    assert spec.autoscaling is not None
    return {
        "name": name,
        "admitted": admitted,
        "demand": min(asked, spec.autoscaling.max_replicas),
        "allocated": min(spec.autoscaling.min_replicas, limit),
        "limit": limit,
        "message": why,
    }
