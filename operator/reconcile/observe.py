"""What one pass reads of the cluster: the owner, its live children and pods (`read_owner`,
`read_children`), the Secrets its pods need (`check_secrets`), and, once the children are applied, all the
status is computed from (`observe`): the HPA, the Nodes, what the Ready pods report, the profile Job's result.

With the watch-fed cache the owner, its children, pods and Nodes come from the cache; without one (e.g. from
a test) each is read from the API server. The calls either way are in each function's docstring.
"""

from __future__ import annotations

from typing import Any

from pagoda.operator.api import API_VERSION, PLURAL
from pagoda.operator.kube.cache import ObjectCache
from pagoda.operator.kube.client import Kube, KubeError
from pagoda.operator.reconcile.problems import missing_secrets, secret_names, secret_not_found
from pagoda.operator.reconcile.profile import profile_message, profile_status
from pagoda.operator.reconcile.rollouts import rollout_message
from pagoda.operator.reconcile.state import ChildKey, Pass, child_key
from pagoda.operator.resources import CHILD_KINDS, service_url
from pagoda.operator.resources.meta import OWNER_LABEL
from pagoda.operator.status.pods import POD_KIND
from pagoda.operator.status.profile import PROFILE_KIND, queued_profile
from pagoda.operator.status.report import Observed
from pagoda.operator.status.scaling import HPA_KIND

Obj = dict[str, Any]


def read_owner(kube: Kube, cache: ObjectCache | None, namespace: str, name: str) -> Obj | None:
    """The InferenceService: the cache's copy, or a GET without a cache; None when there is none."""
    return cache.owner(namespace, name) if cache else kube.get(API_VERSION, PLURAL, namespace, name)


def read_children(
    kube: Kube, cache: ObjectCache | None, namespace: str, name: str
) -> tuple[dict[ChildKey, Obj], list[Obj]]:
    """The owner's live children by (kind, name) (with the HPA KEDA made, labelled like our ScaledObject),
    and its pods. Without a cache: a list of each child kind, of the HPAs, and of the pods, by the owner
    label."""
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
        previous = (p.owner.get("status") or {}).get("profile")
        if p.profile_wait is not None:  # a new profile waits for the fleet's profile budget
            waiting, turn = p.profile_wait
            profile = queued_profile(waiting, previous, profile_message(turn))
        else:
            job = next((p.live.get(child_key(m)) for m in desired if m["kind"] == PROFILE_KIND), None)
            profile = profile_status(p.kube, p.namespace, job, previous)
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
        rollout_queued=rollout_message(p.rollout) if p.rollout is not None else None,
        template_inputs=p.template_inputs,
        nodes=p.cache.nodes_of(p.pods) if p.cache else None,
        kept=frozenset(kept),
    )


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
