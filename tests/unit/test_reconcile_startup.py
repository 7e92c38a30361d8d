"""Tier 1: status.startup (operator/status/startup.py): a replica's start from its Pod and its runtime's
report, the recent starts and their medians, and what the status model accepts."""

from __future__ import annotations

from typing import Any

from pagoda.contract.payloads import Capacity, ModelCacheReport, StartupRecord
from pagoda.operator.api import InferenceServiceStatus
from pagoda.operator.kube.cache import ObjectCache
from pagoda.operator.kube.capacity import CapacityReader
from pagoda.operator.resources.meta import OWNER_LABEL
from pagoda.operator.status.startup import (
    RECENT_STARTS,
    model_cache_status,
    record,
    startup_status,
    typical_seconds,
)

RUNTIME_PHASES = {
    "imports": 14.21,
    "modelFetch": 2.0,
    "engineSetup": 4.0,
    "weightLoad": 0.5,
    "engineInit": 9.5,
    "apiServer": 1.0,
}


def pod(name: str = "m-1", restarts: int = 0, ready: str = "2026-01-01T00:00:40Z") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {
            "podIP": "10.0.0.9",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"},
                {"type": "Ready", "status": "True", "lastTransitionTime": ready},
            ],
            "containerStatuses": [{"name": "runtime", "restartCount": restarts, "ready": True}],
        },
    }


def startup_json(**changes: Any) -> dict[str, Any]:
    # The process started 4 s after the pod was scheduled; ready 31.2 s later, 3.8 s before the Pod was.
    body = {
        "startedAt": "2026-01-01T00:00:05.000Z",
        "readyAt": "2026-01-01T00:00:36.200Z",
        "seconds": 31.2,
        "modelBytes": 4_000_000,
        "phases": dict(RUNTIME_PHASES),
    }
    return {**body, **changes}


def report(**changes: Any) -> StartupRecord:
    """The runtime's `startup` report as the operator reads it (contract/payloads.py)."""
    return StartupRecord.model_validate(startup_json(**changes))


def test_a_start_is_the_kubelets_phases_around_the_runtimes() -> None:
    start = record(pod(), report())
    assert start == {
        "pod": "m-1",
        "readyAt": "2026-01-01T00:00:40Z",
        "seconds": 40.0,
        "modelBytes": 4_000_000,
        "phases": {
            "scheduling": 1.0,
            "containerStart": 4.0,
            "imports": 14.2,
            "modelFetch": 2.0,
            "engineSetup": 4.0,
            "weightLoad": 0.5,
            "engineInit": 9.5,
            "apiServer": 1.0,
            "readiness": 3.8,
        },
    }
    assert sum(start["phases"].values()) == 40.0  # here exactly; in a cluster about, see the module


def test_only_a_first_start_with_a_sound_report_counts() -> None:
    assert record(pod(restarts=1), report()) is None  # restarted: its creation time is older than this run
    assert record(pod(), report(readyAt="soon")) is None
    # A report that is not one reads as absent: the capacity still counts, no start is recorded.
    answer = {"kvCacheTokens": 4096, "maxModelLen": 2048, "maxConcurrency": 2.0}
    assert Capacity.model_validate({**answer, "startup": startup_json(phases=["imports"])}).startup is None
    unready = pod()
    unready["status"]["conditions"][1]["status"] = "False"
    assert record(unready, report()) is None
    # Values that are not seconds are left out, the rest kept; a clock behind the Pod's clamps at 0.
    odd = record(pod(), report(phases={"imports": -1, "modelFetch": "x", "engineSetup": 3}, modelBytes=True))
    assert odd is not None and "modelBytes" not in odd
    kubelet = ("scheduling", "containerStart", "readiness")
    assert {k: v for k, v in odd["phases"].items() if k not in kubelet} == {"engineSetup": 3.0}
    late = record(pod(ready="2026-01-01T00:00:30Z"), report())
    assert late is not None and late["phases"]["readiness"] == 0.0


def test_recent_starts_their_medians_and_the_last() -> None:
    starts = [record(pod(f"m-{i}", ready=f"2026-01-01T00:00:{30 + i:02d}Z"), report()) for i in range(12)]
    assert all(starts)
    first = startup_status(None, [s for s in starts[:3] if s])
    assert first is not None and first["last"]["pod"] == "m-2"
    assert first["typical"]["starts"] == 3 and first["typical"]["seconds"] == 31.0  # 30, 31, 32
    assert first["typical"]["phases"]["modelFetch"] == 2.0
    # The same pods seen again change nothing (the status is not rewritten).
    assert startup_status(first, [s for s in starts[:3] if s]) is first
    every = startup_status(first, [s for s in starts if s])
    assert every is not None and len(every["recent"]) == RECENT_STARTS
    assert [r["pod"] for r in every["recent"]] == [f"m-{i}" for i in range(2, 12)]
    assert every["last"]["pod"] == "m-11" and every["typical"]["seconds"] == 36.5
    # Nothing started yet: no field; nothing new: the previous one, kept (also at zero replicas).
    assert startup_status(None, []) is None
    assert startup_status(every, []) is every


def test_the_capacity_answer_carries_the_start_and_the_status_model_takes_it() -> None:
    answer = {"kvCacheTokens": 4096, "maxModelLen": 2048, "maxConcurrency": 2.0, "blockSize": 16}
    reader = CapacityReader(lambda url, timeout: {**answer, "startup": startup_json()})
    pods = [pod()]
    assert reader.startups(pods) == []  # not asked yet
    assert reader.status(pods) == {"kvCacheTokens": 4096, "maxModelLen": 2048, "maxConcurrency": 2.0}
    starts = reader.startups(pods)
    assert [s["pod"] for s in starts] == ["m-1"]
    status = {"conditions": [], "startup": startup_status(None, starts)}
    model = InferenceServiceStatus.model_validate(status)
    assert model.model_dump(by_alias=True, exclude_none=True) == status
    # A runtime without the report (an older image): capacity still read, no start recorded.
    old = CapacityReader(lambda url, timeout: answer)
    assert old.status(pods) is not None and old.startups(pods) == []


def test_a_pod_as_the_operators_cache_keeps_it_still_makes_a_record() -> None:
    """The cache slims pods (operator/kube/cache.py); what a record needs must survive that."""
    full = pod()
    full["metadata"]["namespace"] = "ns"
    full["metadata"]["labels"] = {OWNER_LABEL: "m"}
    full["spec"] = {"containers": [{"name": "runtime", "image": "x" * 100}]}
    cache = ObjectCache("InferenceService")
    cache.replace("v1", "Pod", [full])
    [slim] = cache.children("ns", "m").values()
    assert "spec" not in slim  # slimmed
    assert record(slim, report()) == record(full, report()) is not None


def test_the_typical_start_the_schedule_reads_is_a_number_of_seconds_under_a_day() -> None:
    assert typical_seconds({"typical": {"seconds": 62.5}}) == 62.5
    for odd in (None, {}, {"typical": {"seconds": "62"}}, {"typical": {"seconds": True}}):
        assert typical_seconds(odd) is None, odd
    assert typical_seconds({"typical": {"seconds": -1}}) is None
    assert typical_seconds({"typical": {"seconds": 86_400}}) is None


def cache_report(*models: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {"bytes": sum(m["bytes"] for m in models), "models": list(models), **changes}


def test_the_node_caches_go_into_the_status_per_node_newest_pod_first() -> None:
    """spec.model.cache.scope Node: each pod tells what its node's cache held when it became Ready; per node
    the newest pod's view counts, and the cache survives the operator's pod cache (nodeName kept)."""
    tiny = {"uri": "s3://models/tiny", "bytes": 700, "inUse": True, "lastUsed": "2026-01-01T00:00:30.000Z"}
    old = {"uri": "hf://org/old", "revision": "main", "bytes": 9000, "inUse": False}
    reports = {
        "m-1": cache_report(tiny, old),
        "m-2": cache_report(tiny, maxBytes=10_000),  # later, on the same node: `old` was evicted
        "m-3": cache_report(tiny, {"uri": 7, "bytes": 1}, {"uri": "x", "bytes": -1}),  # unreadable items go
    }
    pods = []
    for name, node, created in (("m-1", "a", "00:00:00"), ("m-2", "a", "00:01:00"), ("m-3", "b", "00:00:00")):
        full = pod(name)
        full["metadata"].update(
            namespace="ns", labels={OWNER_LABEL: "m"}, creationTimestamp=f"2026-01-01T{created}Z"
        )
        full["status"]["podIP"] = name
        full["spec"] = {"nodeName": node, "containers": [{"name": "runtime"}]}
        pods.append(full)
    cache = ObjectCache("InferenceService")
    cache.replace("v1", "Pod", pods)
    slim = list(cache.children("ns", "m").values())
    answer = {"kvCacheTokens": 4096, "maxModelLen": 2048, "maxConcurrency": 2.0}
    reader = CapacityReader(
        lambda url, timeout: {**answer, "modelCache": reports[url.split("/")[2].split(":")[0]]}
    )
    assert reader.model_caches(slim) is None  # nothing asked yet
    reader.status(slim)
    caches = reader.model_caches(slim)
    assert caches == {
        "nodes": [
            {"node": "a", "bytes": 700, "maxBytes": 10_000, "models": [tiny]},
            {"node": "b", "bytes": 700, "models": [tiny]},
        ]
    }
    status = {"conditions": [], "modelCache": caches}
    model = InferenceServiceStatus.model_validate(status)
    assert model.model_dump(by_alias=True, exclude_none=True) == status
    assert model_cache_status([("a", ModelCacheReport.model_validate({"models": "not a list"}))]) == {
        "nodes": [{"node": "a", "bytes": 0, "models": []}]
    }
    assert model_cache_status([]) is None


def test_a_start_records_what_its_fetch_downloaded() -> None:
    assert record(pod(), report(fetchedBytes=0))["fetchedBytes"] == 0  # type: ignore[index]
    assert record(pod(), report(fetchedBytes=4_000_000))["fetchedBytes"] == 4_000_000  # type: ignore[index]
    for bad in (-1, 1.5, True, "7"):
        assert "fetchedBytes" not in record(pod(), report(fetchedBytes=bad))  # type: ignore[operator]
