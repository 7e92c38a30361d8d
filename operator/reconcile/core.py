"""One level-based reconcile pass of one InferenceService.

validate spec -> build desired children -> server-side apply the ones that differ (with owner references)
-> delete children no longer wanted -> read state back (children and pods) -> compute status -> write it if
it changed. Nothing here depends on memory from earlier passes: with the operator's watch-fed cache the pass
reads nothing from the API server; without one it gets the owner, lists each child kind and lists the pods
once (by the owner label).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from pagoda.operator import metrics
from pagoda.operator.api import API_VERSION, KIND, PLURAL, InferenceServiceSpec
from pagoda.operator.reconcile import events
from pagoda.operator.reconcile.cache import ObjectCache
from pagoda.operator.reconcile.compare import matches
from pagoda.operator.reconcile.kube import Kube, KubeError
from pagoda.operator.reconcile.pods import POD_KIND
from pagoda.operator.reconcile.problems import apply_problem, invalid_spec, missing_secrets
from pagoda.operator.reconcile.status import Problem, compute_status, degraded_now, status_changed
from pagoda.operator.resources import (
    CHILD_KINDS,
    DEFAULT_RUNTIME_IMAGE,
    desired_children,
    selector_string,
    service_url,
)

log = logging.getLogger("pagoda.operator.reconcile")
OWNER_LABEL = "pagoda.dev/inferenceservice"
PLURALS = {kind: (api_version, plural) for api_version, kind, plural in CHILD_KINDS}

Obj = dict[str, Any]


@dataclass
class Outcome:
    result: str  # applied | unchanged | error | gone
    requeue_after: float | None = None
    writes: int = 0
    problems: list[Problem] = field(default_factory=list)


def rfc3339_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def reconcile(
    kube: Kube,
    namespace: str,
    name: str,
    now: Callable[[], str] = rfc3339_now,
    cache: ObjectCache | None = None,
    default_image: str = DEFAULT_RUNTIME_IMAGE,
) -> Outcome:
    """One pass. With a `cache` (the operator's watch-fed view) it reads nothing from the API server;
    without one it reads the owner and lists its children."""
    started = time.monotonic()
    try:
        outcome = _reconcile(kube, namespace, name, now, cache, default_image)
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
) -> Outcome:
    owner = cache.owner(namespace, name) if cache else kube.get(API_VERSION, PLURAL, namespace, name)
    if owner is None or owner["metadata"].get("deletionTimestamp"):
        return Outcome("gone")
    uid = owner["metadata"]["uid"]
    problems: list[Problem] = []
    writes = 0
    desired: list[Obj] | None = None
    try:
        spec = InferenceServiceSpec.model_validate(owner.get("spec") or {})
        desired = [with_owner(m, owner) for m in desired_children(name, namespace, spec, default_image)]
    except ValidationError as exc:
        problems.append(invalid_spec(exc))
    except (ValueError, TypeError, KeyError) as exc:  # a spec the builders cannot turn into objects
        problems.append(Problem("BuildFailed", f"Could not build the child objects: {exc!r}", retry=False))

    if cache:
        live = cache.children(namespace, name)
        pods = [live.pop(key) for key in [k for k in live if k[0] == POD_KIND[1]]]
    else:
        live, pods = _list_children(kube, namespace, name), _list_pods(kube, namespace, name)
    if desired is not None:
        problems.extend(missing_secrets(kube, namespace, desired))
        for manifest in desired:
            key = (manifest["kind"], manifest["metadata"]["name"])
            current = live.get(key)
            if current is not None and matches(manifest, current):
                continue
            api_version, plural = PLURALS[manifest["kind"]]
            try:
                live[key] = kube.apply(manifest, plural)
                if cache:
                    cache.observe(live[key])
            except KubeError as exc:
                if namespace_terminating(exc):
                    return Outcome("gone")
                problems.append(apply_problem(manifest, exc))
                continue
            writes += 1
            verb = "Created" if current is None else "Updated"
            log.info("%s %s name=%s namespace=%s", verb, manifest["kind"], name, namespace)
            events.record(
                kube, owner, type_="Normal", reason=verb, message=f"{verb} {key[0]} {key[1]}", now=now()
            )
        wanted = {(m["kind"], m["metadata"]["name"]) for m in desired}
        for key, obj in list(live.items()):
            if key in wanted or not controlled_by(obj, uid):
                continue
            api_version, plural = PLURALS[key[0]]
            kube.delete(api_version, key[0], plural, namespace, key[1], obj["metadata"]["uid"])
            del live[key]
            if cache:
                cache.forget_child(namespace, name, key[0], key[1])
            writes += 1
            log.info("Deleted %s name=%s namespace=%s", key[0], key[1], namespace)
            events.record(
                kube, owner, type_="Normal", reason="Deleted", message=f"Deleted {key[0]} {key[1]}", now=now()
            )

    deployment = live.get(("Deployment", name))
    status = compute_status(
        owner,
        deployment,
        problems,
        selector=selector_string(name),
        url=_url(owner, desired, name, namespace),
        now=now(),
        pods=pods,
    )
    if status_changed(owner.get("status"), status):
        was_degraded = degraded_now(owner.get("status") or {})
        try:
            written = kube.patch_status(API_VERSION, KIND, PLURAL, namespace, name, status)
        except KubeError as exc:
            if exc.status == 404:  # deleted during the pass
                if cache:
                    cache.observe(owner, deleted=True)
                return Outcome("gone", writes=writes)
            raise
        if cache:
            cache.observe(written)
        writes += 1
        log.info("Updated status name=%s namespace=%s summary=%s", name, namespace, _summary(status))
        degraded = degraded_now(status)
        if degraded is not None and (was_degraded is None or was_degraded.reason != degraded.reason):
            events.record(
                kube, owner, type_="Warning", reason=degraded.reason, message=degraded.message, now=now()
            )
    retry = [p for p in problems if p.retry]
    return Outcome(
        result="error" if problems else ("applied" if writes else "unchanged"),
        requeue_after=30.0 if retry else None,
        writes=writes,
        problems=problems,
    )


def namespace_terminating(exc: KubeError) -> bool:
    """The namespace is being deleted: its objects (ours included) are going away, nothing to do."""
    return exc.status == 403 and "being terminated" in exc.message


def _list_children(kube: Kube, namespace: str, name: str) -> dict[tuple[str, str], Obj]:
    """Every object of a child kind labelled as belonging to `name`; kinds whose API is absent are skipped."""
    found: dict[tuple[str, str], Obj] = {}
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


def _list_pods(kube: Kube, namespace: str, name: str) -> list[Obj]:
    api_version, _kind, plural = POD_KIND
    return kube.list(api_version, plural, namespace, f"{OWNER_LABEL}={name}")


def _url(owner: Obj, desired: list[Obj] | None, name: str, namespace: str) -> str | None:
    if desired is None:  # invalid spec: keep reporting the URL of what still runs
        url = (owner.get("status") or {}).get("url")
        return str(url) if url else None
    for manifest in desired or []:
        if manifest["kind"] == "Service":
            ports = manifest.get("spec", {}).get("ports") or []
            if ports:
                return service_url(name, namespace, int(ports[0]["port"]))
    return None


def _summary(status: Obj) -> str:
    return ",".join(f"{c['type']}={c['status']}" for c in status.get("conditions", []))
