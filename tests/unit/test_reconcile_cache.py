"""The watch-fed object cache: newest version wins, deletions, full-list replacement."""

from __future__ import annotations

import threading
from typing import Any

from pagoda.operator.kube.cache import ObjectCache
from pagoda.operator.kube.client import Kube

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
    replaced = cache.owner("ns", "m")
    assert replaced is not None and replaced["metadata"]["resourceVersion"] == "8"
    assert cache.owner("ns", "gone") is None
    cache.replace("apps/v1", "Deployment", [])
    assert cache.children("ns", "m") == {}
    cache.observe(obj("InferenceService", "m", "9"), deleted=True)
    assert cache.owner("ns", "m") is None


def test_list_owners_get_their_kind_and_pods_keep_only_what_status_needs() -> None:
    cache = ObjectCache("InferenceService")
    owner = obj("InferenceService", "m", "3")
    del owner["kind"], owner["apiVersion"]
    cache.replace("pagoda.dev/v1alpha1", "InferenceService", [owner])
    cached = cache.owner("ns", "m")
    assert cached is not None and (cached["apiVersion"], cached["kind"]) == (
        "pagoda.dev/v1alpha1",
        "InferenceService",
    )
    pod = obj("Pod", "m-abc", "4", spec={"containers": [{"name": "runtime"}]}, status={"phase": "Running"})
    pod["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    cache.observe(pod)
    cached_pod = cache.children("ns", "m")[("Pod", "m-abc")]
    assert "spec" not in cached_pod and "managedFields" not in cached_pod["metadata"]
    assert cached_pod["status"] == {"phase": "Running"} and cached_pod["metadata"]["name"] == "m-abc"
    # Of the spec, only what the startup budget needs (StartupTimeout).
    probe = {"httpGet": {"path": "/readyz"}, "periodSeconds": 10, "failureThreshold": 180}
    spec = {
        "containers": [{"name": "runtime", "image": "x", "args": ["a"] * 50, "startupProbe": probe}],
        "terminationGracePeriodSeconds": 140,
        "volumes": [{"name": "v", "emptyDir": {}}],
    }
    cache.observe(obj("Pod", "m-def", "5", spec=spec))
    assert cache.children("ns", "m")[("Pod", "m-def")]["spec"] == {
        "containers": [{"name": "runtime", "startupProbe": probe}],
        "terminationGracePeriodSeconds": 140,
    }


def test_replace_keeps_a_newer_cached_copy_and_drops_the_missed() -> None:
    cache = ObjectCache("InferenceService")
    cache.observe(obj("Deployment", "m", "12", spec={"replicas": 3}))  # a watch event newer than the list
    cache.observe(obj("Deployment", "gone", "5"))
    cache.observe(obj("Service", "m", "6"))
    cache.replace("apps/v1", "Deployment", [obj("Deployment", "m", "11", spec={"replicas": 2})])
    children = cache.children("ns", "m")
    assert set(children) == {("Deployment", "m"), ("Service", "m")}
    assert children[("Deployment", "m")]["spec"] == {"replicas": 3}


def test_readers_never_see_a_listed_object_missing_during_replace() -> None:
    """A resync replaces the cache while workers read it: an object in both the old and the new list must
    be visible at every moment (the old code cleared, then re-added item by item outside the lock)."""
    cache = ObjectCache("InferenceService")
    owners = [obj("InferenceService", f"m{i}", "1") for i in range(2000)]
    children = []
    for i in range(2000):
        child = obj("Deployment", f"m{i}", "1")
        child["metadata"]["labels"] = {"pagoda.dev/inferenceservice": f"m{i}"}
        children.append(child)
    cache.replace("pagoda.dev/v1alpha1", "InferenceService", owners)
    cache.replace("apps/v1", "Deployment", children)
    stop = threading.Event()
    misses: list[str] = []

    def read() -> None:
        while not stop.is_set():
            if cache.owner("ns", "m1999") is None:
                misses.append("owner")
            if ("Deployment", "m1999") not in cache.children("ns", "m1999"):
                misses.append("child")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(20):
            cache.replace("pagoda.dev/v1alpha1", "InferenceService", owners)
            cache.replace("apps/v1", "Deployment", children)
    finally:
        stop.set()
        reader.join()
    assert not misses, f"{len(misses)} reads saw a listed object missing ({sorted(set(misses))})"


def test_secrets_seen_are_remembered_until_the_resync_forgets_them() -> None:
    cache = ObjectCache("InferenceService")
    assert not cache.secret_seen("ns", "hf-token")
    cache.saw_secret("ns", "hf-token")
    assert cache.secret_seen("ns", "hf-token") and not cache.secret_seen("other", "hf-token")
    cache.forget_secrets()
    assert not cache.secret_seen("ns", "hf-token")


def test_a_resync_reads_pods_a_page_at_a_time_and_keeps_them_slim() -> None:
    """`Kube.list_pages` follows the API server's continue tokens; the cache slims each pod as it comes, so
    a resync never holds the whole list of full pods."""
    pods = [
        {
            "metadata": {"name": f"m-{i}", "namespace": "ns", "resourceVersion": "5", "labels": LABELS},
            "spec": {"containers": [{"name": "runtime", "image": "x" * 100}]},
            "status": {"phase": "Running"},
        }
        for i in range(5)
    ]
    calls: list[list[tuple[str, str]]] = []

    def call(method: str, path: str, *, query: list[tuple[str, str]], **_: Any) -> dict[str, Any]:
        calls.append(query)
        start = int(dict(query).get("continue", "0"))
        page = pods[start : start + 2]
        more = {"continue": str(start + 2)} if start + 2 < len(pods) else {}
        return {"metadata": more, "items": page}

    kube = Kube(None)  # type: ignore[arg-type]
    kube._call = call  # type: ignore[method-assign]
    cache = ObjectCache("InferenceService")
    cache.replace("v1", "Pod", kube.list_pages("v1", "pods", "ns", "a=b", page=2))
    assert [dict(q).get("continue") for q in calls] == [None, "2", "4"]
    assert all(("limit", "2") in q and ("labelSelector", "a=b") in q for q in calls)
    children = cache.children("ns", "m")
    assert sorted(name for _, name in children) == [f"m-{i}" for i in range(5)]
    assert all("spec" not in pod for pod in children.values())  # slim: no containers kept


def test_a_resync_keeps_the_cached_copy_of_an_unchanged_object() -> None:
    cache = ObjectCache("InferenceService")
    cache.observe(obj("Deployment", "m", "10", spec={"replicas": 2}))
    cached = cache.children("ns", "m")[("Deployment", "m")]
    cache.replace("apps/v1", "Deployment", [obj("Deployment", "m", "10", spec={"replicas": 2})])
    assert cache.children("ns", "m")[("Deployment", "m")] is cached  # one copy, not two
    cache.replace("apps/v1", "Deployment", [obj("Deployment", "m", "11", spec={"replicas": 3})])
    assert cache.children("ns", "m")[("Deployment", "m")]["spec"] == {"replicas": 3}
