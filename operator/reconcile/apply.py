"""How one pass brings the live children to the desired ones: server-side apply each child that differs
(compare.py), hand a Deployment's spec.replicas over to the autoscaler first when autoscaling is turned on,
delete the children we control that are no longer wanted, and name every change in one Event.

The children that differ are applied in waves (`waves`): the writes of one wave go to the API server at
once, each wave after the one before it. A new service's first pass writes five children; one after another
that is five round trips, and with many services created at once the passes wait on them (the operator
benchmark, docs/benchmarks.md). The waves keep the one order that matters: what a pod needs (its
ConfigMaps, its ServiceAccount and Role, the NetworkPolicies that guard it) exists before the Deployment or
Job that makes it, and a ScaledObject comes after the Deployment it scales.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pagoda.operator.kube.client import KubeError
from pagoda.operator.reconcile.compare import matches, stale_fields
from pagoda.operator.reconcile.problems import apply_problem
from pagoda.operator.reconcile.state import OwnerGone, Pass, child_key
from pagoda.operator.resources import CHILD_KINDS
from pagoda.operator.resources.meta import REPLICAS_HANDOVER_MANAGER

log = logging.getLogger("pagoda.operator.reconcile")
PLURALS = {kind: (api_version, plural) for api_version, kind, plural in CHILD_KINDS}
# A child of these kinds starts a new wave: pods are made only once everything listed before them exists,
# and the autoscaler's target exists before the autoscaler.
WAVE_STARTS = frozenset({"Deployment", "Job", "ScaledObject"})
# Threads that send the writes of a wave with more than one write, shared by every pass: at most this many
# such writes in flight at once (the API client's connection pool is sized for them: main.py).
WRITERS = 16
_writers = ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="apply")

Obj = dict[str, Any]


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


def waves(desired: list[Obj]) -> list[list[Obj]]:
    """`desired`, in its order, cut before each child of a WAVE_STARTS kind (pure)."""
    cut: list[list[Obj]] = []
    for manifest in desired:
        if not cut or manifest["kind"] in WAVE_STARTS:
            cut.append([])
        cut[-1].append(manifest)
    return cut


def apply_children(p: Pass, desired: list[Obj]) -> None:
    """Server-side apply each desired child that differs from its live copy, a wave at a time. A child the
    API server refuses becomes a Problem and the others are still applied. What each write did is recorded
    in `desired`'s order whatever order the answers came in, so the pass's Event reads the same every time."""
    for wave in waves(desired):
        stale = [m for m in wave if (c := p.live.get(child_key(m))) is None or not matches(m, c)]
        if len(stale) > 1:
            results = list(_writers.map(lambda m: _apply_one(p, m), stale))
        else:
            results = [_apply_one(p, m) for m in stale]
        failure: Exception | None = None
        for manifest, result in zip(stale, results, strict=True):
            if isinstance(result, KubeError):
                if namespace_terminating(result):
                    raise OwnerGone from result
                p.problems.append(apply_problem(manifest, result))
            elif isinstance(result, Exception):  # the API server unreachable, the Lease lost: the pass fails
                failure = failure or result
            else:
                _record(p, manifest, result)
        if failure is not None:  # after recording what did land, so that the pass's Event names it
            raise failure


def _apply_one(p: Pass, manifest: Obj) -> Obj | Exception:
    """One child's write (with its replicas hand-over): what the API server answered, or what went wrong."""
    current = p.live.get(child_key(manifest))
    try:
        hand_over_replicas(p, manifest, current)
        return p.kube.apply(manifest, PLURALS[manifest["kind"]][1])
    except Exception as exc:  # noqa: BLE001 - handed back to the pass's thread, which decides
        return exc


def _record(p: Pass, manifest: Obj, result: Obj) -> None:
    key = child_key(manifest)
    current = p.live.get(key)
    p.live[key] = result
    if p.cache:
        p.cache.observe(result)
    p.wrote("Created" if current is None else "Updated", *key)


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


def controlled_by(obj: Obj, uid: str) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid and ref.get("controller") for ref in refs)


def namespace_terminating(exc: KubeError) -> bool:
    """The namespace is being deleted: its objects (ours included) are going away, nothing to do."""
    return exc.status == 403 and "being terminated" in exc.message
