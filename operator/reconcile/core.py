"""One level-based reconcile pass of one InferenceService.

read the owner and parse its spec (once) -> build the desired children -> check the Secrets they reference ->
server-side apply the children that differ (with owner references) -> delete children no longer wanted ->
observe (`observe`: what the status needs, the Ready pods asked at once) -> compute the status (pure,
status.compute_status) -> write it if it changed (`write_status`). Nothing here depends on memory from
earlier passes but the cache's.

What a pass reads from the API server: with the operator's watch-fed cache, the owner, its children and its
pods come from the cache, and the only reads are metadata-only GETs of the Secrets the pod template
references that the cache has not seen exist since the last resync (see `check_secrets`), and a GET of the
ConfigMap of spec.engine.chatTemplate.configMap whose template the cache has not held since the last resync
(see chattemplate.py): none for a running service between resyncs. Without a cache (e.g. from a test) a pass
gets the owner, lists each child kind, lists the pods once (by the owner label), gets each referenced
Secret's metadata and the chat template's ConfigMap. Writes happen only for a difference (compare.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from pagoda.operator import metrics
from pagoda.operator.api import API_VERSION, KIND, PLURAL, InferenceServiceSpec
from pagoda.operator.kube.adapters import AdapterReport, AdapterSync, failure_events
from pagoda.operator.kube.cache import ObjectCache
from pagoda.operator.kube.capacity import CapacityReader
from pagoda.operator.kube.client import Kube, KubeError
from pagoda.operator.kube.workqueue import Outcome
from pagoda.operator.reconcile import events, restarts
from pagoda.operator.reconcile.chattemplate import read_chat_template
from pagoda.operator.reconcile.compare import matches, stale_fields
from pagoda.operator.reconcile.problems import (
    apply_problem,
    invalid_spec,
    missing_secrets,
    secret_names,
    secret_not_found,
)
from pagoda.operator.reconcile.profile import profile_status
from pagoda.operator.resources import (
    CHILD_KINDS,
    DEFAULT_RUNTIME_IMAGE,
    PROFILE_REQUEST_ANNOTATION,
    RestartStamps,
    desired_children,
    selector_string,
    service_url,
)
from pagoda.operator.resources.meta import OWNER_LABEL, REPLICAS_HANDOVER_MANAGER
from pagoda.operator.status.pods import POD_KIND, next_startup_deadline
from pagoda.operator.status.profile import PROFILE_KIND, slo_concurrency, tuned_engine
from pagoda.operator.status.report import (
    Observed,
    Problem,
    compute_status,
    degraded_now,
    first_report_wait,
    status_changed,
    status_patch,
)
from pagoda.operator.status.scaling import HPA_KIND, hpa_name, scale_event
from pagoda.operator.status.scalingmetrics import metrics_event
from pagoda.operator.status.slo import slo_event
from pagoda.operator.status.startup import typical_seconds
from pagoda.operator.status.times import parse_time, rfc3339_now

log = logging.getLogger("pagoda.operator.reconcile")
PLURALS = {kind: (api_version, plural) for api_version, kind, plural in CHILD_KINDS}
RETRY_AFTER_S = 30.0

Obj = dict[str, Any]
ChildKey = tuple[str, str]  # (kind, name)


class OwnerGone(Exception):
    """The InferenceService or its namespace went away during the pass: there is nothing left to do."""


@dataclass
class Pass:
    """One pass over one InferenceService: its live children and pods, the problems met, the writes made."""

    kube: Kube
    cache: ObjectCache | None
    owner: Obj
    namespace: str
    name: str
    now: Callable[[], str]
    live: dict[ChildKey, Obj]
    pods: list[Obj]
    problems: list[Problem]
    hpa: Obj | None = None  # the HPA KEDA made from our ScaledObject (watched, not ours to apply)
    capacity: CapacityReader | None = None
    adapters: AdapterReport | None = None  # spec.lora's adapters in the Ready pods (kube/adapters.py)
    restart: restarts.RestartPlan | None = None  # the restart schedule after this pass's writes
    node_cache: bool = False  # spec.model.cache.scope Node: status.modelCache reports the nodes' caches
    writes: int = 0
    changes: list[tuple[str, str, str]] = field(default_factory=list)  # (verb, kind, name) of children
    requeue: list[float] = field(default_factory=list)  # seconds after which to look again

    def wrote(self, verb: str, kind: str, child: str) -> None:
        """Count a write to a child and log it; `record_changes` names it in the pass's Event."""
        self.writes += 1
        self.changes.append((verb, kind, child))
        log.info("%s %s name=%s namespace=%s", verb, kind, child, self.namespace)

    def record_changes(self) -> None:
        """One Event on the owner naming every child this pass created, updated or deleted
        (docs/operator.md#events)."""
        if self.changes:
            reason, message = events.changes_event(self.changes)
            self.event("Normal", reason, message)
            self.changes = []

    def event(self, type_: str, reason: str, message: str) -> None:
        events.record(self.kube, self.owner, type_=type_, reason=reason, message=message, now=self.now())


def owner_reference(owner: Obj) -> Obj:
    meta = owner["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def with_owner(manifest: Obj, owner: Obj) -> Obj:
    metadata = {**manifest["metadata"], "ownerReferences": [owner_reference(owner)]}
    return {**manifest, "metadata": metadata}


def controlled_by(obj: Obj, uid: str) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid and ref.get("controller") for ref in refs)


def child_key(manifest: Obj) -> ChildKey:
    return manifest["kind"], manifest["metadata"]["name"]


def reconcile(
    kube: Kube,
    namespace: str,
    name: str,
    now: Callable[[], str] = rfc3339_now,
    cache: ObjectCache | None = None,
    default_image: str = DEFAULT_RUNTIME_IMAGE,
    capacity: CapacityReader | None = None,
    adapters: AdapterSync | None = None,
    management_key: str | None = None,
    trusted_namespaces: tuple[str, ...] = (),
    picker_cluster_role: str | None = None,
) -> Outcome:
    """One pass, counted in the operator's metrics. What it reads: see the module's docstring.
    `management_key`: the operator's public key for the pods (resources/management.py);
    `trusted_namespaces`: those the pods' NetworkPolicy admits (resources/networkpolicy.py);
    `picker_cluster_role`: the ClusterRole spec.routing's endpoint picker is bound to (resources/routing.py).
    Raises NotLeader, before reading anything, when this replica may have lost the leader Lease (and at
    any write of the pass, should it be lost meanwhile: kube.py)."""
    kube.check_leader(f"reconcile name={name} namespace={namespace}")
    started = time.monotonic()
    try:
        outcome = _reconcile(
            kube,
            namespace,
            name,
            now,
            cache,
            default_image,
            capacity,
            adapters,
            management_key,
            trusted_namespaces,
            picker_cluster_role,
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
    default_image: str,
    capacity: CapacityReader | None = None,
    adapters: AdapterSync | None = None,
    management_key: str | None = None,
    trusted_namespaces: tuple[str, ...] = (),
    picker_cluster_role: str | None = None,
) -> Outcome:
    owner = cache.owner(namespace, name) if cache else kube.get(API_VERSION, PLURAL, namespace, name)
    if owner is None or owner["metadata"].get("deletionTimestamp"):
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
    desired = (
        desired_state(
            owner,
            spec,
            namespace,
            name,
            default_image,
            restart,
            chat_template,
            management_key,
            trusted_namespaces,
            picker_cluster_role,
        )
        if spec is not None
        else None
    )
    hpa = live.pop((HPA_KIND[1], hpa_name(name)), None)
    if desired is not None and spec is not None:
        start_at_min_replicas(desired, spec, live.get(("Deployment", name)))
    p = Pass(kube, cache, owner, namespace, name, now, live, pods, problems, hpa, capacity)
    try:
        if desired is not None:
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
        write_status(p, status)
    except OwnerGone:
        return Outcome("gone", writes=p.writes)
    requeue = [RETRY_AFTER_S] if any(problem.retry for problem in p.problems) else []
    requeue += p.requeue  # a first status held back for the Deployment controller's first report
    next_ask = capacity.next_ask(p.pods) if capacity is not None else None
    if next_ask is not None:  # a Ready pod has not told its capacity yet
        requeue.append(next_ask)
    if p.adapters is not None and p.adapters.requeue_after is not None:  # an adapter is not Ready yet
        requeue.append(p.adapters.requeue_after)
    current = parse_time(now())
    loading = next_startup_deadline(p.pods, current) if current is not None else None
    if loading is not None:  # a replica still loading: look again when its startup budget runs out
        requeue.append(loading)
    next_restart = p.restart.requeue_after() if p.restart is not None else None
    if next_restart is not None:  # the next scheduled restart, or another look at a postponed one
        requeue.append(next_restart)
    return Outcome(
        result="error" if p.problems else ("applied" if p.writes else "unchanged"),
        requeue_after=min(requeue) if requeue else None,
        writes=p.writes,
        problems=p.problems,
    )


def parse_spec(owner: Obj) -> tuple[InferenceServiceSpec | None, list[Problem]]:
    """The owner's spec, validated; None and the reason (InvalidSpec) when it does not validate."""
    try:
        return InferenceServiceSpec.model_validate(owner.get("spec") or {}), []
    except ValidationError as exc:
        return None, [invalid_spec(exc)]


def desired_state(
    owner: Obj,
    spec: InferenceServiceSpec,
    namespace: str,
    name: str,
    default_image: str,
    restart: restarts.RestartPlan | None = None,
    chat_template: str | None = None,
    management_key: str | None = None,
    trusted_namespaces: tuple[str, ...] = (),
    picker_cluster_role: str | None = None,
) -> list[Obj]:
    """The children the spec asks for, with owner references. Anything a builder raises is a bug (the spec
    was validated), and propagates: the work queue logs it with its traceback and retries with back-off.
    `chat_template`: the template read from spec.engine.chatTemplate.configMap (chattemplate.py);
    `management_key`: the operator's public key for the pods (resources/management.py);
    `trusted_namespaces`: those the pods' NetworkPolicy admits (resources/networkpolicy.py);
    `picker_cluster_role`: the endpoint picker's ClusterRole (resources/routing.py)."""
    stamps = RestartStamps(restart.restarted_at, restart.since) if restart else RestartStamps()
    status = owner.get("status") or {}
    children = desired_children(
        name,
        namespace,
        spec,
        default_image,
        stamps,
        chat_template,
        management_key,
        trusted_namespaces,
        typical_start=typical_seconds(status.get("startup")),
        profile_request=(owner["metadata"].get("annotations") or {}).get(PROFILE_REQUEST_ANNOTATION),
        slo_concurrency=slo_concurrency(status.get("profile")),
        engine_choice=tuned_engine(status.get("profile")),
        picker_cluster_role=picker_cluster_role,
    )
    return [with_owner(manifest, owner) for manifest in children]


def read_children(
    kube: Kube, cache: ObjectCache | None, namespace: str, name: str
) -> tuple[dict[ChildKey, Obj], list[Obj]]:
    """The owner's live children by (kind, name) (with the HPA KEDA made, labelled like our ScaledObject),
    and its pods."""
    if cache:
        live = cache.children(namespace, name)
        pods = [live.pop(key) for key in [k for k in live if k[0] == POD_KIND[1]]]
        return live, pods
    live = _list_children(kube, namespace, name)
    api_version, kind, plural = HPA_KIND
    for hpa in _list_labelled(kube, api_version, plural, namespace, name):
        live[(kind, hpa["metadata"]["name"])] = hpa
    api_version, _kind, plural = POD_KIND
    return live, _list_labelled(kube, api_version, plural, namespace, name)


def change_children(p: Pass, desired: list[Obj]) -> None:
    """Apply the children that differ, delete those no longer wanted, and record one Event naming them
    (also when the pass fails half-way: what was changed before the failure is named)."""
    try:
        apply_children(p, desired)
        prune_children(p, desired)
    except OwnerGone:
        raise  # its namespace is going away: nothing to tell
    except Exception:
        p.record_changes()
        raise
    p.record_changes()


def apply_children(p: Pass, desired: list[Obj]) -> None:
    """Server-side apply each desired child that differs from its live copy. A child the API server refuses
    becomes a Problem and the others are still applied."""
    for manifest in desired:
        key = child_key(manifest)
        current = p.live.get(key)
        if current is not None and matches(manifest, current):
            continue
        try:
            hand_over_replicas(p, manifest, current)
            p.live[key] = p.kube.apply(manifest, PLURALS[key[0]][1])
        except KubeError as exc:
            if namespace_terminating(exc):
                raise OwnerGone from exc
            p.problems.append(apply_problem(manifest, exc))
            continue
        if p.cache:
            p.cache.observe(p.live[key])
        p.wrote("Created" if current is None else "Updated", *key)


def start_at_min_replicas(desired: list[Obj], spec: InferenceServiceSpec, live: Obj | None) -> None:
    """A new autoscaled Deployment is created at autoscaling.minReplicas. Without spec.replicas the API
    server would default it to 1: a service at minReplicas 0 would start a replica (an engine, a GPU) only
    for KEDA to remove it, one at 3 would start one and wait for the HPA. From the next pass the field is
    the HPA's (`hand_over_replicas`, as when autoscaling is turned on)."""
    if spec.autoscaling is None or live is not None:
        return
    for manifest in desired:
        if manifest["kind"] == "Deployment":
            manifest["spec"] = {"replicas": spec.autoscaling.min_replicas, **manifest["spec"]}


def hand_over_replicas(p: Pass, manifest: Obj, current: Obj | None) -> None:
    """Autoscaling turned on: the Deployment's spec.replicas passes from the operator to KEDA's HPA.

    An apply that leaves out a field its manager alone owns removes the field, and the API server defaults
    spec.replicas to 1: a service at N replicas would drop to one until the HPA scales it up again. So the
    current count is first applied by a second field manager (the handover manager, which asks for nothing
    else), and the field outlives the operator's release of it; the HPA's next scale takes it over. The same
    as Kubernetes' documented transfer of ownership to an HPA."""
    if manifest["kind"] != "Deployment" or current is None:
        return
    replicas = (current.get("spec") or {}).get("replicas")
    if replicas is None or "spec.replicas" not in stale_fields(manifest, current):  # ours, and let go now
        return
    meta = manifest["metadata"]
    handover = {
        "apiVersion": manifest["apiVersion"],
        "kind": manifest["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "spec": {"replicas": replicas},
    }
    p.kube.apply(handover, "deployments", field_manager=REPLICAS_HANDOVER_MANAGER)
    log.info("Handed over replicas=%s name=%s namespace=%s to the autoscaler", replicas, p.name, p.namespace)


def prune_children(p: Pass, desired: list[Obj]) -> None:
    """Delete the children we control that the spec no longer asks for (e.g. the ScaledObject when
    autoscaling is turned off)."""
    wanted = {child_key(manifest) for manifest in desired}
    uid = p.owner["metadata"]["uid"]
    for key, obj in list(p.live.items()):
        if key in wanted or not controlled_by(obj, uid):
            continue
        kind, child = key
        api_version, plural = PLURALS[kind]
        p.kube.delete(api_version, kind, plural, p.namespace, child, obj["metadata"]["uid"])
        del p.live[key]
        if p.cache:
            p.cache.forget_child(p.namespace, p.name, kind, child)
        p.wrote("Deleted", kind, child)


def check_secrets(p: Pass, desired: list[Obj]) -> None:
    """Name the Secrets the pod template references that do not exist (SecretNotFound).

    With a cache, a Secret seen to exist is not looked up again until the next resync forgets it: the pods
    that needed it have it, and a pod that later cannot start for want of it reports that itself
    (CreateContainerConfigError). A missing Secret is looked up on every pass until it appears.
    """
    names = secret_names(desired)
    if p.cache:
        names = [name for name in names if not p.cache.secret_seen(p.namespace, name)]
    missing = missing_secrets(p.kube, p.namespace, names)
    if p.cache:
        for name in names:
            if name not in missing:
                p.cache.saw_secret(p.namespace, name)
    if missing:
        p.problems.append(secret_not_found(p.namespace, missing))


def observe(p: Pass, desired: list[Obj] | None) -> Observed:
    """What the status is computed from: the pass's children, pods and problems, the Nodes the pods run on
    (from the cache's watch: without a cache none is read, and no node is reported lost), what the Ready pods
    report of themselves (capacity, start-up, node cache: the pass's only calls here, to pods not asked
    before; see capacity.py), and a finished capacity profile's result (one list of its pods, once)."""
    kept = set()
    if p.capacity is None:  # not asked in this pass: what was reported stands
        kept.add("capacity")
    capacity = p.capacity.status(p.pods) if p.capacity else None
    model_cache = p.capacity.model_caches(p.pods) if p.capacity and p.node_cache else None
    if p.node_cache and model_cache is None:  # the node's cache outlives the pods that reported on it
        kept.add("modelCache")
    if p.restart is None:  # not planned in this pass (an invalid spec)
        kept.add("restarts")
    if p.adapters is None:  # not synced in this pass (an invalid spec, or no syncer)
        kept.update(("adapters", "adaptersReady"))
    profile = None
    if desired is None:  # an invalid spec: the last profile, and the sizing read from it, stand
        kept.update(("profile", "sizing"))
    else:
        job = next((p.live.get(child_key(m)) for m in desired if m["kind"] == PROFILE_KIND), None)
        profile = profile_status(p.kube, p.namespace, job, (p.owner.get("status") or {}).get("profile"))
    return Observed(
        deployment=p.live.get(("Deployment", p.name)),
        pods=p.pods,
        problems=p.problems,
        url=_url(p.owner, desired, p.name, p.namespace),
        hpa=p.hpa,
        scaled_object=p.live.get(("ScaledObject", p.name)),
        capacity=capacity,
        startups=p.capacity.startups(p.pods) if p.capacity else [],
        model_cache=model_cache,
        restarts=p.restart.status() if p.restart is not None else None,
        adapters=p.adapters.status if p.adapters is not None else {},
        profile=profile,
        nodes=p.cache.nodes_of(p.pods) if p.cache else None,
        kept=frozenset(kept),
    )


def write_status(p: Pass, status: Obj) -> None:
    """Write the status computed for this pass only when it changed, with a Warning Event when the owner
    becomes Degraded or its Degraded reason changes (and Events for scaling, adapter failures and each flip
    of SLOUnmet and of ScalingMetricsUnavailable)."""
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
    was, became = degraded_now(previous), degraded_now(status)
    if became is not None and (was is None or was.reason != became.reason):
        p.event("Warning", became.reason, became.message)
    scaled = scale_event(previous.get("autoscaling"), status.get("autoscaling"))
    if scaled is not None:
        log.info("Scaled name=%s namespace=%s %s", p.name, p.namespace, scaled)
        p.event("Normal", "Scaled", scaled)
    for reason, message in failure_events(previous, status):
        p.event("Warning", reason, message)
    flipped = slo_event(previous, status)
    if flipped is not None:
        type_, reason, message = flipped
        log.info("Changed condition type=SLOUnmet event=%s name=%s namespace=%s", reason, p.name, p.namespace)
        p.event(type_, reason, message)
    blind = metrics_event(previous, status)  # KEDA's fallback holds the replicas, or it ended
    if blind is not None:
        type_, reason, message = blind
        log.info(
            "Changed condition type=ScalingMetricsUnavailable event=%s name=%s namespace=%s",
            reason,
            p.name,
            p.namespace,
        )
        p.event(type_, reason, message)


def namespace_terminating(exc: KubeError) -> bool:
    """The namespace is being deleted: its objects (ours included) are going away, nothing to do."""
    return exc.status == 403 and "being terminated" in exc.message


def _list_children(kube: Kube, namespace: str, name: str) -> dict[ChildKey, Obj]:
    """Every object of a child kind labelled as belonging to `name`; kinds whose API is absent are skipped."""
    found: dict[ChildKey, Obj] = {}
    for api_version, kind, plural in CHILD_KINDS:
        try:
            items = kube.list(api_version, plural, namespace, f"{OWNER_LABEL}={name}")
        except KubeError as exc:
            if exc.status == 404:
                continue
            raise
        for item in items:
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
            found[(kind, item["metadata"]["name"])] = item
    return found


def _list_labelled(kube: Kube, api_version: str, plural: str, namespace: str, name: str) -> list[Obj]:
    return kube.list(api_version, plural, namespace, f"{OWNER_LABEL}={name}")


def _url(owner: Obj, desired: list[Obj] | None, name: str, namespace: str) -> str | None:
    if desired is None:  # invalid spec: keep reporting the URL of what still runs
        url = (owner.get("status") or {}).get("url")
        return str(url) if url else None
    for manifest in desired:
        if manifest["kind"] == "Service" and manifest["metadata"]["name"] == name:
            ports = manifest.get("spec", {}).get("ports") or []
            if ports:
                scheme = "https" if ports[0].get("appProtocol") == "https" else "http"  # spec.runtime.tls
                return service_url(name, namespace, int(ports[0]["port"]), scheme)
    return None


def _summary(status: Obj) -> str:
    return ",".join(f"{c['type']}={c['status']}" for c in status.get("conditions", []))
