"""`/metrics`: vLLM's own metrics plus stable `pagoda_*` names read from them at scrape time.

vLLM renames metrics between releases (gpu_cache_usage_perc became kv_cache_usage_perc); the names
below are Pagoda's contract with the operator's KEDA trigger and with dashboards, so each one is mapped
from whichever vLLM name the installed engine exposes. The KV cache's capacity comes from the engine's config
(capacity.py), read once when the engine is loaded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from pagoda import contract
from pagoda.runtime.models.modelcache import ModelCache
from pagoda.runtime.serving.capacity import KvCacheCapacity
from pagoda.runtime.serving.lora import AdapterTracker
from pagoda.runtime.serving.startup import PHASES, StartupClock

WAITING = ("vllm:num_requests_waiting",)
RUNNING = ("vllm:num_requests_running",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


@dataclass
class EngineGauges:
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0


@dataclass
class ServerStatus:
    """What the server knows about itself, read by the collector at scrape time."""

    model_name: str
    ready: bool = False
    draining: bool = False
    stalled_seconds: float = 0.0  # the engine busy without progress (progress.py)
    startup: StartupClock | None = None  # the start-up phases (startup.py)
    rejected_draining: int = 0
    kv_cache: KvCacheCapacity | None = None  # once the engine is loaded
    adapters: AdapterTracker | None = None  # with LoRA on: per-adapter counts
    model_cache: ModelCache | None = None  # the folder downloads go to (modelcache.py)


def _values(families: Iterable[Metric], names: Sequence[str], model_name: str) -> list[float]:
    """Samples of the first name in `names` that the engine exposes, for this model."""
    by_name = {f.name: f for f in families}
    for name in names:
        family = by_name.get(name)
        if family is None:
            continue
        return [
            s.value
            for s in family.samples
            if s.name == name and s.labels.get("model_name", model_name) == model_name
        ]
    return []


def engine_gauges(families: Sequence[Metric], model_name: str) -> EngineGauges:
    """Queue depth and running requests summed over engines; KV-cache usage is the fullest engine's."""
    kv = _values(families, KV_USAGE, model_name)
    return EngineGauges(
        waiting=sum(_values(families, WAITING, model_name)),
        running=sum(_values(families, RUNNING, model_name)),
        kv_usage=min(1.0, max([0.0, *kv])),
    )


def pagoda_families(status: ServerStatus, gauges: EngineGauges) -> list[Metric]:
    labels = ["model_name"]
    value = [status.model_name]

    def gauge(name: str, doc: str, v: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=labels)
        family.add_metric(value, v)
        return family

    rejected = CounterMetricFamily(
        "pagoda_requests_rejected_draining",
        "Requests answered 503 after the drain's deadline.",
        labels=labels,
    )
    rejected.add_metric(value, status.rejected_draining)
    kv = status.kv_cache
    return [
        gauge(contract.QUEUE_DEPTH_METRIC, "Requests waiting in the engine's queue.", gauges.waiting),
        gauge(contract.RUNNING_REQUESTS_METRIC, "Requests the engine is running.", gauges.running),
        gauge(contract.KV_CACHE_USAGE_METRIC, "KV-cache usage, 0 to 1.", gauges.kv_usage),
        gauge("pagoda_ready", "1 when the model is loaded and the pod is not draining.", float(status.ready)),
        gauge("pagoda_draining", "1 after SIGTERM, while requests drain.", float(status.draining)),
        gauge(
            "pagoda_engine_stalled_seconds",
            "Seconds the engine has held requests and completed no step (0 while it makes progress).",
            status.stalled_seconds,
        ),
        gauge(
            "pagoda_model_load_seconds",
            "Seconds from the process's start to ready (0 while loading): the sum of the start-up phases.",
            status.startup.total() if status.startup and status.startup.ready_at else 0.0,
        ),
        gauge(
            "pagoda_kv_cache_capacity_tokens",
            "Tokens the KV cache holds (0 until the engine is loaded).",
            float(kv.tokens) if kv else 0.0,
        ),
        gauge(
            "pagoda_kv_cache_max_concurrency",
            "Requests of max_model_len tokens the KV cache holds at once (0 until the engine is loaded).",
            kv.max_concurrency if kv else 0.0,
        ),
        rejected,
        *startup_families(status),
        *adapter_families(status),
    ]


# Seconds: a tiny model's phases on a CPU take 0.01-30 s, a large one's download or compile many minutes.
STARTUP_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600)


def startup_families(status: ServerStatus) -> list[Metric]:
    """Once ready, each start-up phase this process went through (startup.py) as one observation of
    `pagoda_startup_phase_seconds{phase}`: summed over pods, where start-up time goes. Also the model's size
    on disk. None while loading."""
    clock = status.startup
    if clock is None or clock.ready_at is None:
        return []
    phases = HistogramMetricFamily(
        "pagoda_startup_phase_seconds",
        "Seconds this replica's start spent in each phase (imports, modelFetch, engineSetup, weightLoad, "
        "engineInit, apiServer); one observation per phase per process.",
        labels=["model_name", "phase"],
    )
    for name in PHASES:
        if name not in clock.phases:
            continue
        seconds = clock.phases[name]
        buckets = [(str(float(le)), float(seconds <= le)) for le in STARTUP_BUCKETS] + [("+Inf", 1.0)]
        phases.add_metric([status.model_name, name], buckets, seconds)
    families: list[Metric] = [phases]
    sizes = (
        ("pagoda_startup_model_bytes", "Bytes of the model folder this replica loaded.", clock.model_bytes),
        (
            "pagoda_startup_fetched_bytes",
            "Bytes this replica's start downloaded into the model cache: 0 when the model was cached.",
            clock.fetched_bytes,
        ),
    )
    for name, help_text, value in sizes:
        if value is not None:
            gauge = GaugeMetricFamily(name, help_text, labels=["model_name"])
            gauge.add_metric([status.model_name], float(value))
            families.append(gauge)
    return families


def adapter_families(status: ServerStatus) -> list[Metric]:
    """Requests and generated tokens per LoRA adapter (label `adapter`, the name clients send as `model`),
    counted since start, also after the adapter is unloaded. None without LoRA."""
    if status.adapters is None:
        return []
    labels = ["model_name", "adapter"]
    requests = CounterMetricFamily(
        "pagoda_lora_requests", "Requests the engine served through each LoRA adapter.", labels=labels
    )
    tokens = CounterMetricFamily(
        "pagoda_lora_generation_tokens", "Tokens generated through each LoRA adapter.", labels=labels
    )
    for name, counts in sorted(status.adapters.counts.items()):
        requests.add_metric([status.model_name, name], counts.requests)
        tokens.add_metric([status.model_name, name], counts.generation_tokens)
    return [requests, tokens]


class _Families:
    """A registry-shaped wrapper so generate_latest renders already-collected families."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def engine_registry() -> CollectorRegistry:
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    registry: CollectorRegistry = get_prometheus_registry()
    return registry


def render(status: ServerStatus, registry: CollectorRegistry | None) -> bytes:
    """One scrape: collect vLLM's registry once, derive the pagoda_* values from it, render both."""
    engine = list(registry.collect()) if registry is not None else []
    ours = pagoda_families(status, engine_gauges(engine, status.model_name))
    return generate_latest(_Families(engine + ours))
