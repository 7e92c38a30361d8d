"""What the operator last saw of InferenceServices and their children, so a reconcile pass reads nothing.

Fed by the watch events kopf delivers (before the owner's key is queued) and by the responses to our own
writes; primed with one list per kind before the workers start, and refreshed by every periodic resync.
Like controller-runtime's cache: a stale entry costs at most a redundant pass or a no-op write, never a
wrong result, because every change also produces an event that queues the owner again.
"""

from __future__ import annotations

import threading
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)
ChildKey = tuple[str, str]  # (kind, name)
OWNER_LABEL = "pagoda.dev/inferenceservice"


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


class ObjectCache:
    def __init__(self, owner_kind: str) -> None:
        self.owner_kind = owner_kind
        self._lock = threading.Lock()
        self._owners: dict[Key, Obj] = {}
        self._children: dict[Key, dict[ChildKey, Obj]] = {}

    def observe(
        self, obj: Obj, *, api_version: str | None = None, kind: str | None = None, deleted: bool = False
    ) -> None:
        """Record an object seen in a watch event, a list or a write response (list items lack their
        apiVersion and kind: pass them)."""
        meta = obj.get("metadata") or {}
        kind = obj.get("kind") or kind
        api_version = obj.get("apiVersion") or api_version
        namespace, name = meta.get("namespace"), meta.get("name")
        if not kind or not namespace or not name:
            return
        with self._lock:
            if kind == self.owner_kind:
                key = (namespace, name)
                if deleted:
                    self._owners.pop(key, None)
                elif _newer(obj, self._owners.get(key)):
                    self._owners[key] = obj
                return
            owner = (meta.get("labels") or {}).get(OWNER_LABEL)
            if not owner:
                return
            bucket = self._children.setdefault((namespace, owner), {})
            child = (kind, name)
            if deleted:
                bucket.pop(child, None)
            elif _newer(obj, bucket.get(child)):
                bucket[child] = {**obj, "apiVersion": api_version, "kind": kind}

    def replace(self, api_version: str, kind: str, items: list[Obj]) -> None:
        """Make the cache hold exactly `items` of `kind` (a fresh full list): drops what was missed."""
        with self._lock:
            if kind == self.owner_kind:
                self._owners.clear()
            else:
                for bucket in self._children.values():
                    for child in [c for c in bucket if c[0] == kind]:
                        del bucket[child]
        for item in items:
            self.observe(item, api_version=api_version, kind=kind)

    def forget_child(self, namespace: str, owner: str, kind: str, name: str) -> None:
        with self._lock:
            self._children.get((namespace, owner), {}).pop((kind, name), None)

    def owner(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return self._owners.get((namespace, name))

    def children(self, namespace: str, owner: str) -> dict[ChildKey, Obj]:
        with self._lock:
            return dict(self._children.get((namespace, owner), {}))

    def owners(self) -> list[Key]:
        with self._lock:
            return list(self._owners)
