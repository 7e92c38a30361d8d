"""The watch-fed object cache: newest version wins, deletions, full-list replacement."""

from __future__ import annotations

from typing import Any

from pagoda.operator.reconcile.cache import ObjectCache

LABELS = {"pagoda.dev/inferenceservice": "m"}


def obj(kind: str, name: str, version: str, **extra: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": "ns", "resourceVersion": version, "labels": LABELS}
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": meta, **extra}


def test_children_grouped_by_owner_label_and_newest_wins() -> None:
    cache = ObjectCache("InferenceService")
    cache.observe(obj("Deployment", "m", "10", spec={"replicas": 2}))
    cache.observe(obj("Deployment", "m", "9", spec={"replicas": 1}))  # an older event arriving late
    assert cache.children("ns", "m")[("Deployment", "m")]["spec"] == {"replicas": 2}
    cache.observe(obj("Deployment", "m", "11", spec={"replicas": 3}))
    assert cache.children("ns", "m")[("Deployment", "m")]["spec"] == {"replicas": 3}
    cache.observe({"metadata": {"name": "other", "namespace": "ns", "labels": {}}}, kind="Service")
    assert list(cache.children("ns", "m")) == [("Deployment", "m")]


def test_list_items_get_their_kind_and_deletions_drop() -> None:
    cache = ObjectCache("InferenceService")
    item = obj("Service", "m", "5")
    del item["kind"], item["apiVersion"]
    cache.observe(item, api_version="v1", kind="Service")
    child = cache.children("ns", "m")[("Service", "m")]
    assert (child["apiVersion"], child["kind"]) == ("v1", "Service")
    cache.observe(obj("Service", "m", "6"), deleted=True)
    assert cache.children("ns", "m") == {}


def test_owner_tracking_and_replace() -> None:
    cache = ObjectCache("InferenceService")
    cache.observe(obj("InferenceService", "m", "3"))
    cache.observe(obj("InferenceService", "gone", "4"))
    cache.observe(obj("Deployment", "m", "7"))
    assert cache.owner("ns", "m") is not None
    cache.replace("pagoda.dev/v1alpha1", "InferenceService", [obj("InferenceService", "m", "8")])
    assert cache.owners() == [("ns", "m")]
    cache.replace("apps/v1", "Deployment", [])
    assert cache.children("ns", "m") == {}
    cache.observe(obj("InferenceService", "m", "9"), deleted=True)
    assert cache.owner("ns", "m") is None
