"""Tier 1: the pagoda_* metrics mapped from vLLM's metric names (old and new), rendered once per scrape,
and the KV cache's capacity read from a started engine's config."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import MutableMapping
from types import SimpleNamespace
from typing import Any

from metric_contract import RUNTIME_METRICS
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.parser import text_string_to_metric_families

from pagoda.runtime.serving import capacity
from pagoda.runtime.serving.capacity import KvCacheCapacity
from pagoda.runtime.serving.metrics import ServerStatus, engine_gauges, render
from pagoda.runtime.serving.server import PagodaApp, RuntimeState
from pagoda.runtime.serving.startup import StartupClock


def engine_registry(kv_name: str, model: str = "tiny") -> CollectorRegistry:
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    waiting = Gauge("vllm:num_requests_waiting", "w", labels, registry=registry)
    running = Gauge("vllm:num_requests_running", "r", labels, registry=registry)
    kv = Gauge(kv_name, "kv", labels, registry=registry)
    for engine, (w, r, k) in enumerate([(3, 4, 0.25), (2, 1, 0.5)]):
        waiting.labels(model, str(engine)).set(w)
        running.labels(model, str(engine)).set(r)
        kv.labels(model, str(engine)).set(k)
    waiting.labels("other-model", "0").set(100)
    return registry


def samples(text: bytes) -> dict[str, float]:
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
        if s.labels.get("model_name") == "tiny"
    }


def test_new_vllm_names_map_to_stable_names() -> None:
    clock = StartupClock(started_at=time.time())
    clock.phases = {"imports": 10.0, "modelFetch": 2.5}
    clock.ready_at = time.time()
    status = ServerStatus(model_name="tiny", ready=True, startup=clock, rejected_draining=3)
    out = samples(render(status, engine_registry("vllm:kv_cache_usage_perc")))
    assert out["pagoda_queue_depth"] == 5  # summed over engines, other models ignored
    assert out["pagoda_running_requests"] == 5
    assert out["pagoda_kv_cache_usage_ratio"] == 0.5  # the fullest engine
    assert out["pagoda_ready"] == 1 and out["pagoda_draining"] == 0
    assert out["pagoda_model_load_seconds"] == 12.5  # the start-up phases' sum
    assert out["pagoda_requests_rejected_draining_total"] == 3
    assert out["vllm:num_requests_waiting"] in (3, 2)  # vLLM's own metrics are kept


def test_old_gpu_cache_name_still_maps() -> None:
    registry = engine_registry("vllm:gpu_cache_usage_perc")
    gauges = engine_gauges(list(registry.collect()), "tiny")
    assert (gauges.waiting, gauges.running, gauges.kv_usage) == (5, 5, 0.5)


def test_no_engine_yet_reports_zeros_and_not_ready() -> None:
    out = samples(render(ServerStatus(model_name="tiny"), None))
    assert out["pagoda_queue_depth"] == 0 and out["pagoda_ready"] == 0
    assert set(out) >= RUNTIME_METRICS


def vllm_config(**cache: object) -> SimpleNamespace:
    """The parts of a started engine's vllm_config that capacity.py reads."""
    return SimpleNamespace(
        cache_config=SimpleNamespace(**cache), model_config=SimpleNamespace(max_model_len=2048)
    )


def test_kv_cache_capacity_is_vllms_own_numbers_on_metrics_and_in_the_payload() -> None:
    # What vLLM 0.32's handshake leaves in the runtime's config (tiny model, 1 GiB CPU KV cache): it logs
    # "CPU KV cache size: 131,072 tokens, Maximum concurrency for 2,048 tokens per request: 64.00x".
    config = vllm_config(
        num_gpu_blocks=1024, block_size=128, kv_cache_size_tokens=131072, kv_cache_max_concurrency=64.0
    )
    kv = capacity.from_vllm_config(config)
    assert kv == KvCacheCapacity(tokens=131072, max_model_len=2048, max_concurrency=64.0, block_size=128)
    assert kv.payload().wire() == {
        "kvCacheTokens": 131072,
        "maxModelLen": 2048,
        "maxConcurrency": 64.0,
        "blockSize": 128,
    }
    # With the scheduler's batch limits (vLLM's CPU defaults), the JSON says them too.
    config.scheduler_config = SimpleNamespace(max_num_seqs=128, max_num_batched_tokens=2048)
    limits = capacity.from_vllm_config(config)
    assert limits is not None and (limits.max_num_seqs, limits.max_num_batched_tokens) == (128, 2048)
    wire = limits.payload().wire()
    assert wire["maxNumSeqs"] == 128 and wire["maxNumBatchedTokens"] == 2048
    out = samples(render(ServerStatus(model_name="tiny", ready=True, kv_cache=kv), None))
    assert out["pagoda_kv_cache_capacity_tokens"] == 131072
    assert out["pagoda_kv_cache_max_concurrency"] == 64.0


def test_kv_cache_capacity_without_vllms_totals_is_blocks_times_block_size() -> None:
    kv = capacity.from_vllm_config(vllm_config(num_gpu_blocks=100, block_size=16))
    assert kv == KvCacheCapacity(tokens=1600, max_model_len=2048, max_concurrency=1600 / 2048, block_size=16)
    assert capacity.from_vllm_config(vllm_config(num_gpu_blocks=None, block_size=16)) is None


def test_kv_cache_capacity_is_zero_until_the_engine_is_loaded() -> None:
    out = samples(render(ServerStatus(model_name="tiny"), None))
    assert out["pagoda_kv_cache_capacity_tokens"] == 0 and out["pagoda_kv_cache_max_concurrency"] == 0


def get(app: PagodaApp, path: str) -> tuple[int, dict[str, str], object]:
    """One GET through the runtime's ASGI app: (status, headers, JSON body)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    asyncio.run(app({"type": "http", "method": "GET", "path": path, "headers": []}, receive, send))
    headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    return sent[0]["status"], headers, json.loads(sent[1]["body"])


def test_capacity_endpoint_is_503_until_loaded_then_the_numbers() -> None:
    state = RuntimeState("tiny")
    app = PagodaApp(state)
    status, headers, body = get(app, capacity.PATH)
    assert (status, headers["retry-after"]) == (503, "5")
    assert body == {
        "error": {
            "message": "The model is loading; its KV-cache capacity is not known yet.",
            "type": "ServiceUnavailable",
            "param": None,
            "code": 503,
        }
    }
    state.status.kv_cache = KvCacheCapacity(
        tokens=4096, max_model_len=2048, max_concurrency=2.0, block_size=16
    )
    status, _, body = get(app, capacity.PATH)
    assert status == 200
    assert body == {"kvCacheTokens": 4096, "maxModelLen": 2048, "maxConcurrency": 2.0, "blockSize": 16}
    clock = state.status.startup = StartupClock(started_at=time.time() - 3)
    status, _, body = get(app, capacity.PATH)
    assert isinstance(body, dict) and "startup" not in body  # still loading: no phases to report
    clock.model_bytes = 1234
    clock.ready()
    status, _, body = get(app, capacity.PATH)
    assert status == 200 and isinstance(body, dict)
    assert body["kvCacheTokens"] == 4096
    startup = body["startup"]
    assert startup["modelBytes"] == 1234 and set(startup["phases"]) == {"imports"}
    assert 2.5 < startup["seconds"] == startup["phases"]["imports"] < 60
    assert startup["startedAt"].endswith("Z") and startup["readyAt"] > startup["startedAt"]
