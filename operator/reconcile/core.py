"""One level-based reconcile pass of one InferenceService.

read the owner and parse its spec (once) -> build the desired children (desired.py) -> check the Secrets
they reference -> server-side apply the children that differ (with owner references) and delete those no
longer wanted, naming them in one Event (apply.py) -> observe what the status needs (observe.py: the Ready
pods asked at once) -> compute the status (pure, status/report.py) -> write it if it changed
(`write_status`, status/changes.py), with the Events the change is worth (events.py). Nothing here depends
on memory from earlier passes but the cache's.

What a pass reads from the API server: with the operator's watch-fed cache, the owner, its children and its
pods come from the cache, and the only reads are metadata-only GETs of the Secrets the pod template
references that the cache has not seen exist since the last resync (observe.py `check_secrets`), and a GET
of the ConfigMap of spec.engine.chatTemplate.configMap whose template the cache has not held since the last
resync (see chattemplate.py): none for a running service between resyncs. Without a cache (e.g. from a
test) a pass gets the owner, lists each child kind, lists the pods once (by the owner label), gets each
referenced Secret's metadata and the chat template's ConfigMap. Writes happen only for a difference
(compare.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from pagoda.operator import metrics
from pagoda.operator.api import API_VERSION, KIND, PLURAL, InferenceServiceSpec
from pagoda.operator.kube.adapters import AdapterSync
from pagoda.operator.kube.cache import ObjectCache
from pagoda.operator.kube.capacity import CapacityReader
from pagoda.operator.kube.client import Kube, KubeError
from pagoda.operator.kube.workqueue import Outcome
from pagoda.operator.reconcile import events, restarts
from pagoda.operator.reconcile.apply import change_children
from pagoda.operator.reconcile.budget import FleetBudget
from pagoda.operator.reconcile.chattemplate import read_chat_template
from pagoda.operator.reconcile.desired import child_inputs, owned_children, start_at_min_replicas
from pagoda.operator.reconcile.gpubudget import GPUBudgets, Share
from pagoda.operator.reconcile.observe import check_secrets, observe, read_children, read_owner
from pagoda.operator.reconcile.problems import invalid_spec
from pagoda.operator.reconcile.profile import ProfileBudget, budget_profile, keep_measured_job
from pagoda.operator.reconcile.rollouts import QUEUED_RECHECK_S, FleetRollouts, budget_template, inputs_hash
from pagoda.operator.reconcile.state import OwnerGone, Pass
from pagoda.operator.resources import DEFAULT_SETTINGS, OperatorSettings, selector_string
from pagoda.operator.status.changes import first_report_wait, status_changed, status_patch
from pagoda.operator.status.pods import next_startup_deadline
from pagoda.operator.status.profile import PROFILE_KIND
from pagoda.operator.status.report import Problem, compute_status
from pagoda.operator.status.scaling import HPA_KIND, hpa_name
from pagoda.operator.status.times import parse_time, rfc3339_now

log = logging.getLogger("pagoda.operator.reconcile")
RETRY_AFTER_S = 30.0

Obj = dict[str, Any]


def reconcile(
    kube: Kube,
    namespace: str,
    name: str,
    now: Callable[[], str] = rfc3339_now,
    cache: ObjectCache | None = None,
    capacity: CapacityReader | None = None,
    adapters: AdapterSync | None = None,
    settings: OperatorSettings = DEFAULT_SETTINGS,
    rollouts: FleetRollouts | None = None,
    profiles: ProfileBudget | None = None,
    budgets: GPUBudgets | None = None,
) -> Outcome:
    """One pass, counted in the operator's metrics. What it reads: see the module's docstring.
    `settings`: the runtime image, management key, trusted namespaces and picker ClusterRole the children
    are built with (resources/inputs.py); `rollouts`: the fleet's rollout budget (rollouts.py; without one,
    as in a pass run alone, a template change of the operator's applies at once); `profiles`: the fleet's
    budget of profile Jobs at once (profile.py; without one a new Job is created at once); `budgets`: the
    GPUBudgets seen (gpubudget.py; without them, or without a cache, spec.autoscaling.budget bounds nothing).
    Raises NotLeader,
    before reading anything, when this replica may have lost the leader Lease (and at any write of the pass,
    should it be lost meanwhile: kube.py)."""
    kube.check_leader(f"reconcile name={name} namespace={namespace}")
    started = time.monotonic()
    try:
        outcome = _reconcile(
            kube, namespace, name, now, cache, capacity, adapters, settings, rollouts, profiles, budgets
        )
    except Exception:
        metrics.RECONCILES.labels(result="error").inc()
        metrics.RECONCILE_ERRORS.labels(reason="Exception").inc()
        raise
    finally:
        metrics.RECONCILE_DURATION.observe(time.monotonic() - started)
    if outcome.result != "gone":
        metrics.RECONCILES.labels(result=outcome.result).inc()
    for problem in outcome.problems:
        metrics.RECONCILE_ERRORS.labels(reason=problem.reason).inc()
    return outcome


def _reconcile(
    kube: Kube,
    namespace: str,
    name: str,
    now: Callable[[], str],
    cache: ObjectCache | None,
    capacity: CapacityReader | None,
    adapters: AdapterSync | None,
    settings: OperatorSettings,
    rollouts: FleetRollouts | None,
    profiles: ProfileBudget | None,
    budgets: GPUBudgets | None,
) -> Outcome:
    owner = read_owner(kube, cache, namespace, name)
    if owner is None or owner["metadata"].get("deletionTimestamp"):
        leave_budgets((namespace, name), rollouts, profiles)
        return Outcome("gone")
    spec, problems = parse_spec(owner)  # the one reading of the spec in a pass
    chat_template, refused = (
        read_chat_template(kube, cache, namespace, name, spec) if spec is not None else (None, None)
    )
    if refused is not None:  # a template the pods must not get: refused like an invalid spec, nothing applied
        spec, problems = None, [refused]
    live, pods = read_children(kube, cache, namespace, name)
    schedule = spec.restart_schedule if spec is not None else None
    restart = restarts.plan(schedule, live.get(("Deployment", name)), now())
    share = budgets.share(kube, cache, owner, spec) if budgets and cache and spec is not None else None
    inputs = (
        child_inputs(owner, settings, restart, chat_template, share.limit if share else None)
        if spec is not None
        else None
    )
    desired = owned_children(owner, spec, inputs) if spec is not None and inputs is not None else None
    hpa = live.pop((HPA_KIND[1], hpa_name(name)), None)
    if desired is not None and spec is not None:
        start_at_min_replicas(desired, spec, live.get(("Deployment", name)))
    p = Pass(kube, cache, owner, namespace, name, now, live, pods, problems, hpa, capacity)
    try:
        if desired is not None and inputs is not None:
            p.template_inputs = inputs_hash(owner.get("spec") or {}, inputs)
            p.rollout = budget_template(
                desired,
                live.get(("Deployment", name)),
                owner,
                p.template_inputs,
                rollouts,
                lambda: cache.all_of_kind("Deployment") if cache is not None else [],
                now(),
            )
            if p.rollout is not None:  # held: look again for a free slot
                p.requeue.append(QUEUED_RECHECK_S)
            keep_measured_job(desired, live, owner)
            p.profile_wait = budget_profile(
                desired,
                live,
                owner,
                profiles,
                lambda: cache.all_of_kind(PROFILE_KIND, named_as_owner=False) if cache is not None else [],
            )
            if p.profile_wait is not None:  # held: look again for a free slot
                p.requeue.append(QUEUED_RECHECK_S)
            check_secrets(p, desired)
            change_children(p, desired)
            restarted = restarts.announcement(restart, p.live.get(("Deployment", name)))
            if restarted is not None:
                log.info("Started scheduled restart name=%s namespace=%s", name, namespace)
                p.event("Normal", "ScheduledRestart", restarted)
            p.adapters = adapters.sync(spec, p.pods) if spec is not None and adapters else None
        # The restart schedule as it stands after this pass's writes: its status, and when to look again
        # (an invalid spec applies nothing, so it restarts nothing: its last restart status is kept).
        if spec is not None:
            p.restart = restarts.plan(schedule, p.live.get(("Deployment", name)), now())
            p.node_cache = spec.model.node_cache
        status = compute_status(p.owner, observe(p, desired), selector=selector_string(name), now=p.now())
        if share is not None:
            status["budget"] = share.status
            budget_event(p, share)
        write_status(p, status)
    except OwnerGone:  # e.g. its namespace is terminating: a slot granted in this pass would never be used
        leave_budgets((namespace, name), rollouts, profiles)
        return Outcome("gone", writes=p.writes)
    return Outcome(
        result="error" if p.problems else ("applied" if p.writes else "unchanged"),
        requeue_after=requeue_after(p),
        writes=p.writes,
        problems=p.problems,
    )


def budget_event(p: Pass, share: Share) -> None:
    """An Event when the GPUBudget changes this service's maxReplicaCount (a hand-over, a grant)."""
    before = (p.owner.get("status") or {}).get("budget") or {}
    now = share.status
    if before.get("limit") in (None, now["limit"]):
        return
    reason = "BudgetScaledIn" if now["limit"] < before["limit"] else "BudgetScaledOut"
    why = now.get("message") or "it gets every replica it asks for"
    p.event(
        "Normal",
        reason,
        f"budget {now['name']}: maxReplicaCount {before['limit']} -> {now['limit']} (asks {now['demand']}, "
        f"allocated {now['allocated']}): {why}",
    )


def leave_budgets(key: tuple[str, str], *budgets: FleetBudget | None) -> None:
    """A service found gone waits for nothing and holds nothing: those behind it in the fleet's budgets move
    up at once, not when its grant or its place in the queue times out (budget.py)."""
    for budget in budgets:
        if budget is not None:
            budget.forget(key)
            budget.finished(key)


def parse_spec(owner: Obj) -> tuple[InferenceServiceSpec | None, list[Problem]]:
    """The owner's spec, validated; None and the reason (InvalidSpec) when it does not validate."""
    try:
        return InferenceServiceSpec.model_validate(owner.get("spec") or {}), []
    except ValidationError as exc:
        return None, [invalid_spec(exc)]


def requeue_after(p: Pass) -> float | None:
    """Seconds until the pass should run again though no watch event comes; None: only when one comes."""
    requeue = [RETRY_AFTER_S] if any(problem.retry for problem in p.problems) else []
    requeue += p.requeue  # a first status held back for the Deployment controller's first report
    next_ask = p.capacity.next_ask(p.pods) if p.capacity is not None else None
    if next_ask is not None:  # a Ready pod has not told its capacity yet
        requeue.append(next_ask)
    if p.adapters is not None and p.adapters.requeue_after is not None:  # an adapter is not Ready yet
        requeue.append(p.adapters.requeue_after)
    current = parse_time(p.now())
    loading = next_startup_deadline(p.pods, current) if current is not None else None
    if loading is not None:  # a replica still loading: look again when its startup budget runs out
        requeue.append(loading)
    next_restart = p.restart.requeue_after() if p.restart is not None else None
    if next_restart is not None:  # the next scheduled restart, or another look at a postponed one
        requeue.append(next_restart)
    return min(requeue) if requeue else None


def write_status(p: Pass, status: Obj) -> None:
    """Write the status computed for this pass only when it changed, with the Events the change is worth
    (events.record_status_changes: a Warning when the owner becomes Degraded or its Degraded reason changes,
    and Events for scaling, adapter failures and each flip of SLOUnmet and of ScalingMetricsUnavailable)."""
    previous = p.owner.get("status") or {}
    if not status_changed(previous, status):
        return
    wait = first_report_wait(previous, p.live.get(("Deployment", p.name)), p.problems, p.now())
    if wait is not None:  # the Deployment controller's first report, moments away, queues the next pass
        p.requeue.append(wait)
        return
    patch = status_patch(previous, status)  # with null for what no longer applies, nested keys too
    try:
        written = p.kube.patch_status(API_VERSION, KIND, PLURAL, p.namespace, p.name, patch)
    except KubeError as exc:
        if exc.status == 404:  # deleted during the pass
            if p.cache:
                p.cache.observe(p.owner, deleted=True)
            raise OwnerGone from exc
        raise
    if p.cache:
        p.cache.observe(written)
    p.writes += 1
    log.info("Updated status name=%s namespace=%s summary=%s", p.name, p.namespace, _summary(status))
    events.record_status_changes(p.kube, p.owner, previous, status, p.now)


def _summary(status: Obj) -> str:
    return ",".join(f"{c['type']}={c['status']}" for c in status.get("conditions", []))
