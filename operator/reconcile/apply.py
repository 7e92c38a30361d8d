"""How one pass brings the live children to the desired ones: server-side apply each child that differs
(compare.py), hand a Deployment's spec.replicas over to the autoscaler first when autoscaling is turned on,
delete the children we control that are no longer wanted, and name every change in one Event."""

from __future__ import annotations

import logging
from typing import Any

from pagoda.operator.kube.client import KubeError
from pagoda.operator.reconcile.compare import matches, stale_fields
from pagoda.operator.reconcile.problems import apply_problem
from pagoda.operator.reconcile.state import OwnerGone, Pass, child_key
from pagoda.operator.resources import CHILD_KINDS
from pagoda.operator.resources.meta import REPLICAS_HANDOVER_MANAGER

log = logging.getLogger("pagoda.operator.reconcile")
PLURALS = {kind: (api_version, plural) for api_version, kind, plural in CHILD_KINDS}

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
