"""Tier 1: the JSON the runtime sends the operator (contract/payloads.py), each payload made by the runtime's
own code and read by the operator's: the producer's keys are exactly its model's (a key the model does not
know, or one renamed on one side only, fails here), and what the operator makes of it is what the status
needs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from pagoda import contract
from pagoda.contract.payloads import (
    AdapterEntry,
    AdapterList,
    AdapterSource,
    CachedModel,
    Capacity,
    EngineCandidate,
    EngineChoice,
    ModelCacheReport,
    Payload,
    ProfileResult,
    ProfileStep,
    StartupRecord,
)
from pagoda.contract.tune import KEYS
from pagoda.operator.kube.adapters import serves
from pagoda.operator.kube.capacity import CapacityReader
from pagoda.operator.status.profile import profile_status, result_fields
from pagoda.operator.status.startup import model_cache_status, record
from pagoda.runtime.models.modelcache import ModelCache, model_folder
from pagoda.runtime.models.modeluri import parse_model_uri
from pagoda.runtime.profiling import tune
from pagoda.runtime.profiling.config import Slo
from pagoda.runtime.profiling.result import result_json, summarize
from pagoda.runtime.serving import adapters
from pagoda.runtime.serving.adapters import Adapter, AdapterManager
from pagoda.runtime.serving.capacity import KvCacheCapacity
from pagoda.runtime.serving.startup import StartupClock

REPORT = json.loads((Path(__file__).parent / "profile_guidellm_report.json").read_text())
Json = dict[str, Any]


def on_the_wire(payload: Payload) -> Json:
    """What the producer sends: its model's JSON, through text as an HTTP body or a termination message."""
    body: Json = json.loads(json.dumps(payload.wire()))
    return body


def round_trips(model: type[Payload], data: Json) -> bool:
    """Whether the consumer's model reads `data` back to the same JSON: a key it does not know would be
    dropped, a key it misses would fail or be read as absent."""
    try:
        return model.model_validate(data).wire() == data
    except ValueError:
        return False


def aliases(model: type[Payload]) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


# --- the runtime's payloads, made by its own code -----------------------------------------------------------


def startup_record() -> StartupRecord:
    clock = StartupClock(started_at=1_800_000_000.0)
    for phase in contract.STARTUP_PHASES[1:]:
        clock.begin(phase)
    clock.model_bytes, clock.fetched_bytes = 4_000_000, 0
    clock.ready()
    return clock.payload()


def model_cache_report(root: Path) -> ModelCacheReport:
    """A node's cache with an S3 model and a hub model at a revision, as server.py reports it."""
    cache = ModelCache(root, max_bytes=10_000)
    for uri, revision, size in (("s3://models/tiny", None, 700), ("hf://org/model", "main", 900)):
        source = parse_model_uri(uri)

        def download(source: Any = source, size: int = size) -> Path:
            folder = model_folder(source, root)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "model.safetensors").write_bytes(b"x" * size)
            return folder

        cache.fetch(source, revision, download)
    return ModelCacheReport.model_validate(cache.report())


def capacity(root: Path) -> Capacity:
    kv = KvCacheCapacity(65536, 2048, 32.0, 16, max_num_seqs=128, max_num_batched_tokens=2048)
    return kv.payload(startup_record(), model_cache_report(root))


def profile_result() -> ProfileResult:
    """A tuned profile's result: GuideLLM's real report summarized, with the engine's choice."""
    plain = summarize(REPORT, Slo(ttft_ms=10_000.0, inter_token_ms=1_000.0), 64, 16)
    baseline = tune.Run(tune.Batch(), tune.Limits(2048, 128), plain)
    failed = tune.Run(tune.Batch(256), None, None, "did not start")
    chosen = tune.Run(tune.Batch(512, 8), tune.Limits(512, 8), plain)
    engine = tune.engine_result([baseline, failed, chosen], chosen)
    return plain.model_copy(update={"engine": engine})


def adapter_list() -> AdapterList:
    """The runtime's adapters in every state it reports."""
    manager = AdapterManager("base", "/cache", 30.0, True)
    manager.max_adapters, manager.max_rank = 4, 16
    loaded = Adapter("sql", "hf://org/sql", adapters.LOADED, 1, "/cache/sql", 8, loaded_at=1.0, revision="v1")
    failed = Adapter(
        "big", "file:///big", adapters.FAILED, error="rank 64 > 16", reason="AdapterRankTooLarge"
    )
    loading = Adapter("new", "s3://b/new", adapters.LOADING)
    manager.adapters = {a.name: a for a in (loaded, failed, loading)}
    return manager.describe()


# --- the tests ----------------------------------------------------------------------------------------------


def test_the_capacity_answer_is_read_as_the_runtime_wrote_it(tmp_path: Path) -> None:
    body = on_the_wire(capacity(tmp_path))
    assert round_trips(Capacity, body) and set(body) == aliases(Capacity)
    assert round_trips(StartupRecord, body["startup"]) and set(body["startup"]) == aliases(StartupRecord)
    cache = body["modelCache"]
    assert round_trips(ModelCacheReport, cache) and set(cache) == aliases(ModelCacheReport)
    assert set().union(*cache["models"]) == aliases(CachedModel)
    # The operator's side: the status's capacity, the start's runtime phases, the node's cache.
    reader = CapacityReader(lambda url, timeout: body)
    pod = {
        "metadata": {"name": "m-1", "uid": "u1", "creationTimestamp": "2027-01-15T07:59:50Z"},
        "spec": {"nodeName": "node-a"},
        "status": {
            "podIP": "10.0.0.1",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2027-01-15T07:59:55Z"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2027-01-15T08:00:10Z"},
            ],
            "containerStatuses": [{"name": "runtime", "restartCount": 0}],
        },
    }
    assert reader.status([pod]) == {"kvCacheTokens": 65536, "maxModelLen": 2048, "maxConcurrency": 32.0}
    [start] = reader.startups([pod])
    assert set(start["phases"]) >= set(contract.STARTUP_PHASES)
    assert (start["modelBytes"], start["fetchedBytes"]) == (4_000_000, 0)
    caches = reader.model_caches([pod])
    assert caches is not None and caches["nodes"][0]["maxBytes"] == 10_000
    assert [m["uri"] for m in caches["nodes"][0]["models"]] == ["hf://org/model", "s3://models/tiny"]
    assert caches["nodes"][0]["models"][0]["revision"] == "main"


def test_the_startup_record_is_read_as_the_runtime_wrote_it() -> None:
    body = on_the_wire(startup_record())
    assert list(body["phases"]) == list(contract.STARTUP_PHASES)
    pod = {
        "metadata": {"name": "m-1", "creationTimestamp": "2027-01-15T07:59:50Z"},
        "status": {
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2027-01-15T07:59:55Z"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2027-01-15T08:00:10Z"},
            ],
            "containerStatuses": [{"name": "runtime", "restartCount": 0}],
        },
    }
    start = record(pod, StartupRecord.model_validate(body))
    assert start is not None and start["modelBytes"] == 4_000_000
    assert model_cache_status([("a", ModelCacheReport.model_validate({}))]) == {
        "nodes": [{"node": "a", "bytes": 0, "models": []}]
    }


def test_the_profile_result_is_read_as_the_runtime_wrote_it() -> None:
    result = profile_result()
    message = result_json(result).decode()
    body = json.loads(message)
    assert round_trips(ProfileResult, body) and set(body) == aliases(ProfileResult)
    assert set(body["steps"][0]) == aliases(ProfileStep)
    assert set(body["engine"]) == aliases(EngineChoice)
    assert set(body["engine"]["candidates"][0]) == aliases(EngineCandidate)
    # The engine's keys are the ones the operator applies to the replicas (contract/tune.py).
    assert set(KEYS.values()) <= aliases(EngineChoice) & aliases(EngineCandidate)
    fields = result_fields(message)
    assert fields["concurrency"] == body["concurrency"] and fields["steps"] == body["steps"]
    assert (fields["ttftMs"], fields["interTokenMs"]) == (10_000.0, 1_000.0)
    assert fields["engine"]["maxNumBatchedTokens"] == 512
    assert {"maxNumBatchedTokens": 256} in fields["engine"]["candidates"]  # its nulls left out
    job = {"metadata": {"name": "p-1"}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    status = profile_status(job, None, lambda name: message)
    assert status is not None and status["state"] == "Succeeded", status


def test_the_adapter_list_is_read_as_the_runtime_wrote_it() -> None:
    body = on_the_wire(adapter_list())
    assert round_trips(AdapterList, body) and set(body) == aliases(AdapterList)
    assert set().union(*body["adapters"]) == aliases(AdapterEntry)
    for entry in body["adapters"]:
        assert round_trips(AdapterEntry, entry)
    assert body["adapters"][0] == {"name": "big", "source": "file:///big", "state": "Failed"} | {
        "reason": "AdapterRankTooLarge",
        "error": "rank 64 > 16",
    }
    entries = {entry.name: entry for entry in AdapterList.model_validate(body).adapters or []}
    assert serves(entries["sql"], ("hf://org/sql", "v1")) and not serves(
        entries["sql"], ("hf://org/sql", None)
    )
    assert serves(entries["new"], ("s3://b/new", None))


@pytest.mark.parametrize("revision", [None, "v1"])
def test_the_put_body_the_operator_sends_is_what_the_runtime_reads(revision: str | None) -> None:
    put = AdapterSource(source="hf://org/sql", **({"revision": revision} if revision is not None else {}))
    sent = json.dumps(put.wire()).encode()
    assert json.loads(sent) == {"source": "hf://org/sql"} | ({"revision": revision} if revision else {})

    class Request:
        async def body(self) -> bytes:
            return sent

    assert asyncio.run(adapters._source(Request(), "sql")) == ("hf://org/sql", revision)


def test_a_key_the_model_does_not_know_or_a_renamed_one_fails(tmp_path: Path) -> None:
    made: list[tuple[type[Payload], Json]] = [
        (Capacity, on_the_wire(capacity(tmp_path))),
        (StartupRecord, on_the_wire(startup_record())),
        (ProfileResult, json.loads(result_json(profile_result()))),
        (AdapterList, on_the_wire(adapter_list())),
    ]
    for model, body in made:
        assert round_trips(model, body), model
        assert not round_trips(model, {**body, "addedKey": 1}), model
        for key in body:
            renamed = {k if k != key else f"{k}Renamed": v for k, v in body.items()}
            assert not round_trips(model, renamed), (model, key)
    # Inside: a step's key, an adapter's.
    result = json.loads(result_json(profile_result()))
    result["steps"][0]["addedKey"] = 1
    assert not round_trips(ProfileResult, result)
    listed = on_the_wire(adapter_list())
    listed["adapters"][0]["addedKey"] = 1
    assert not round_trips(AdapterList, listed)
