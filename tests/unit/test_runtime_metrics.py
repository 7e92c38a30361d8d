"""Tier 1: the pagoda_* metrics mapped from vLLM's metric names (old and new), rendered once per scrape."""

from __future__ import annotations

from metric_contract import RUNTIME_METRICS
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.parser import text_string_to_metric_families

from pagoda.runtime.metrics import ServerStatus, engine_gauges, render


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
    status = ServerStatus(model_name="tiny", ready=True, model_load_seconds=12.5, rejected_draining=3)
    out = samples(render(status, engine_registry("vllm:kv_cache_usage_perc")))
    assert out["pagoda_queue_depth"] == 5  # summed over engines, other models ignored
    assert out["pagoda_running_requests"] == 5
    assert out["pagoda_kv_cache_usage_ratio"] == 0.5  # the fullest engine
    assert out["pagoda_ready"] == 1 and out["pagoda_draining"] == 0
    assert out["pagoda_model_load_seconds"] == 12.5
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
