"""What the operator last saw of InferenceServices, their children and their pods, so a pass reads nothing.

Fed by the watch events kopf delivers (before the owner's key is queued) and by the responses to our own
writes; primed with one list per kind before the workers start, and refreshed by every periodic resync.
Like controller-runtime's cache: a stale entry costs at most a redundant pass or a no-op write, never a
wrong result, because every change also produces an event that queues the owner again.

Secrets are not watched (that would mean reading every Secret in the cluster): the cache only remembers
which referenced Secrets a pass has seen exist, until the next resync forgets them. Nor are the ConfigMaps
of spec.engine.chatTemplate.configMap: the cache remembers the template a pass read from one (once it
compiled), until the next resync forgets it (reconcile/chattemplate.py).

Nodes are watched, all of them (a pod's node is any node), and kept slim (nodes.py: the Ready condition
and the node lifecycle taints), for the replicas on a lost node (NodeLost); `nodes_known` is False when
the operator may not list them, and then nothing is reported lost.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from pagoda.operator.resources.meta import OWNER_LABEL
from pagoda.operator.status.nodes import health, slim_node

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)
ChildKey = tuple[str, str]  # (kind, name)


def _version(obj: Obj) -> int | None:
    try:
        return int(obj.get("metadata", {}).get("resourceVersion", ""))
    except ValueError:
        return None


def _newer(new: Obj, old: Obj | None) -> bool:
    """Whether `new` may replace `old`. etcd's resourceVersions increase; if either is not a number,
    the later arrival wins."""
    if old is None:
        return True
    new_version, old_version = _version(new), _version(old)
    if new_version is None or old_version is None:
        return True
    return new_version >= old_version


def _pick(listed: Obj, cached: Obj | None) -> Obj:
    return listed if cached is None or _newer(listed, cached) else cached


def _slim_pod(pod: Obj) -> Obj:
    """What the status needs of a Pod (its name, labels, creation time for status.startup, status, and of its
    spec the startup probes and the grace period, for the startup budget, the node, for status.modelCache
    and NodeLost, and the NoExecute tolerations, for when a pod on a lost node is evicted): pods are many,
    their specs large."""
    meta = pod.get("metadata") or {}
    keep = (
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "labels",
        "creationTimestamp",
        "deletionTimestamp",
        "ownerReferences",
    )
    spec = pod.get("spec") or {}
    slim = {"metadata": {k: meta[k] for k in keep if k in meta}, "status": pod.get("status") or {}}
    probes = [
        {"name": c.get("name"), "startupProbe": c["startupProbe"]}
        for c in spec.get("containers") or []
        if c.get("startupProbe")
    ]
    kept: Obj = {"containers": probes} if probes else {}
    if probes and "terminationGracePeriodSeconds" in spec:
        kept["terminationGracePeriodSeconds"] = spec["terminationGracePeriodSeconds"]
    if spec.get("nodeName"):  # status.modelCache is per node; a lost node's pods are named (NodeLost)
        kept["nodeName"] = spec["nodeName"]
    tolerations = [  # when the taint-eviction controller deletes a pod on a lost node
        t
        for t in spec.get("tolerations") or []
        if isinstance(t, dict) and t.get("effect") in (None, "", "NoExecute")
    ]
    if tolerations:
        kept["tolerations"] = tolerations
    if kept:
        slim["spec"] = kept
    return slim


class ObjectCache:
    def __init__(self, owner_kind: str) -> None:
        self.owner_kind = owner_kind
        self._lock = threading.Lock()
        self._owners: dict[Key, Obj] = {}
        self._children: dict[Key, dict[ChildKey, Obj]] = {}
        self._secrets: set[Key] = set()  # Secrets seen to exist
        self._chat_templates: dict[tuple[str, str, str], str] = {}  # (namespace, ConfigMap, key) -> template
        self._nodes: dict[str, Obj] = {}  # name -> slim Node (nodes.py)
        self._nodes_known = False  # the Nodes were listed (the operator may read them)

    def observe(
        self, obj: Obj, *, api_version: str | None = None, kind: str | None = None, deleted: bool = False
    ) -> None:
        """Record an object seen in a watch event, a list or a write response (list items lack their
        apiVersion and kind: pass them)."""
        entry = self._entry(obj, api_version, kind)
        if entry is None:
            return
        owner_key, child_key, value = entry
        with self._lock:
            if child_key is None:
                if deleted:
                    self._owners.pop(owner_key, None)
                elif _newer(value, self._owners.get(owner_key)):
                    self._owners[owner_key] = value
                return
            bucket = self._children.setdefault(owner_key, {})
            if deleted:
                bucket.pop(child_key, None)
            elif _newer(value, bucket.get(child_key)):
                bucket[child_key] = value

    def _entry(
        self, obj: Obj, api_version: str | None, kind: str | None
    ) -> tuple[Key, ChildKey | None, Obj] | None:
        """Where `obj` goes: (owner key, None, obj) for an owner, (owner key, child key, obj with its
        apiVersion and kind) for a labelled child; None for anything else."""
        meta = obj.get("metadata") or {}
        kind = obj.get("kind") or kind
        api_version = obj.get("apiVersion") or api_version
        namespace, name = meta.get("namespace"), meta.get("name")
        if not kind or not namespace or not name:
            return None
        if kind == self.owner_kind:  # list items lack apiVersion and kind; Events about the owner need them
            return (namespace, name), None, {**obj, "apiVersion": api_version, "kind": kind}
        owner = (meta.get("labels") or {}).get(OWNER_LABEL)
        if not owner:
            return None
        value = _slim_pod(obj) if kind == "Pod" else obj
        return (namespace, owner), (kind, name), {**value, "apiVersion": api_version, "kind": kind}

    def replace(self, api_version: str, kind: str, items: Iterable[Obj]) -> None:
        """Make the cache hold exactly `items` of `kind` (a fresh full list): drops what was missed.

        The new state is swapped in under the lock in one step, so a reader never sees an object that is
        in both the old and the new state missing. A cached copy newer than the listed one is kept, and so is
        one of the same version (the same object): a resync of an unchanged cluster then holds no second
        copy of it while `items` are read."""
        fresh: dict[Key, dict[ChildKey, Obj]] = {}
        owners: dict[Key, Obj] = {}
        for item in items:
            entry = self._entry(item, api_version, kind)
            if entry is None:
                continue
            owner_key, child_key, value = entry
            with self._lock:
                cached = (
                    self._owners.get(owner_key)
                    if child_key is None
                    else self._children.get(owner_key, {}).get(child_key)
                )
            if cached is not None and _version(cached) is not None and _version(cached) == _version(value):
                value = cached
            if child_key is None:
                owners[owner_key] = value
            else:
                fresh.setdefault(owner_key, {})[child_key] = value
        with self._lock:
            if kind == self.owner_kind:
                self._owners = {key: _pick(value, self._owners.get(key)) for key, value in owners.items()}
                return
            children: dict[Key, dict[ChildKey, Obj]] = {}
            for owner_key in self._children.keys() | fresh.keys():
                old = self._children.get(owner_key, {})
                bucket = {key: obj for key, obj in old.items() if key[0] != kind}
                for key, value in fresh.get(owner_key, {}).items():
                    bucket[key] = _pick(value, old.get(key))
                if bucket:
                    children[owner_key] = bucket
            self._children = children

    def forget_child(self, namespace: str, owner: str, kind: str, name: str) -> None:
        with self._lock:
            self._children.get((namespace, owner), {}).pop((kind, name), None)

    def owner(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return self._owners.get((namespace, name))

    def owners(self) -> list[Obj]:
        """Every owner seen (e.g. a GPUBudget's members, reconcile/gpubudget.py)."""
        with self._lock:
            return list(self._owners.values())

    def children(self, namespace: str, owner: str) -> dict[ChildKey, Obj]:
        with self._lock:
            return dict(self._children.get((namespace, owner), {}))

    def all_of_kind(self, kind: str, named_as_owner: bool = True) -> list[tuple[Key, Obj]]:
        """Every owner's children of `kind`, with the owner's key: e.g. each service's Deployment (the one
        named as its owner), for the fleet's rollout budget (reconcile/rollouts.py), or each service's Jobs
        (`named_as_owner` False), for the profile budget (reconcile/profile.py)."""
        with self._lock:
            return [
                (owner, child)
                for owner, children in self._children.items()
                for (child_kind, child_name), child in children.items()
                if child_kind == kind and (child_name == owner[1] or not named_as_owner)
            ]

    def saw_secret(self, namespace: str, name: str) -> None:
        with self._lock:
            self._secrets.add((namespace, name))

    def secret_seen(self, namespace: str, name: str) -> bool:
        with self._lock:
            return (namespace, name) in self._secrets

    def forget_secrets(self) -> None:
        """Called at each resync: every Secret is looked up again once."""
        with self._lock:
            self._secrets.clear()

    def saw_chat_template(self, namespace: str, config_map: str, key: str, template: str) -> None:
        with self._lock:
            self._chat_templates[(namespace, config_map, key)] = template

    def chat_template(self, namespace: str, config_map: str, key: str) -> str | None:
        with self._lock:
            return self._chat_templates.get((namespace, config_map, key))

    def forget_chat_templates(self) -> None:
        """Called at each resync: every chat template's ConfigMap is read again once, so an edit reaches the
        pods within a resync."""
        with self._lock:
            self._chat_templates.clear()

    def observe_node(self, node: Obj, *, deleted: bool = False) -> bool:
        """Record a Node seen in a watch event; True when its readiness or lifecycle taints (or its
        existence) changed, so the services with pods on it need a pass. A heartbeat changes nothing."""
        name = (node.get("metadata") or {}).get("name")
        if not isinstance(name, str) or not name:
            return False
        slim = slim_node(node)
        with self._lock:
            old = self._nodes.get(name)
            if deleted:
                self._nodes.pop(name, None)
            elif _newer(slim, old):
                self._nodes[name] = slim
            return health(old) != health(self._nodes.get(name))

    def replace_nodes(self, items: Iterable[Obj]) -> None:
        """Hold exactly the listed Nodes (a fresh full list; a cached copy newer than the listed one is
        kept), and mark them known."""
        fresh: dict[str, Obj] = {}
        for item in items:
            name = (item.get("metadata") or {}).get("name")
            if isinstance(name, str) and name:
                fresh[name] = slim_node(item)
        with self._lock:
            self._nodes = {name: _pick(slim, self._nodes.get(name)) for name, slim in fresh.items()}
            self._nodes_known = True

    def forget_nodes(self) -> None:
        """The Nodes could not be listed (RBAC): hold none, and report no node lost."""
        with self._lock:
            self._nodes = {}
            self._nodes_known = False

    def nodes_known(self) -> bool:
        with self._lock:
            return self._nodes_known

    def nodes_of(self, pods: Iterable[Obj]) -> dict[str, Obj] | None:
        """The Nodes `pods` run on, by name (a node the cache does not hold is left out: it does not exist);
        None when the Nodes are not known."""
        names = {(pod.get("spec") or {}).get("nodeName") for pod in pods}
        with self._lock:
            if not self._nodes_known:
                return None
            return {
                name: self._nodes[name] for name in names if isinstance(name, str) and name in self._nodes
            }

    def owners_on_node(self, node: str) -> list[Key]:
        """The InferenceServices with a pod on `node`."""
        with self._lock:
            return [
                owner
                for owner, bucket in self._children.items()
                if any(
                    key[0] == "Pod" and (child.get("spec") or {}).get("nodeName") == node
                    for key, child in bucket.items()
                )
            ]
