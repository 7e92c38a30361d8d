"""spec.autoscaling: a KEDA ScaledObject on the runtime's in-flight requests or queue depth (and optionally
KV-cache usage)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from pagoda.contract import KV_CACHE_USAGE_METRIC, QUEUE_DEPTH_METRIC, RUNNING_REQUESTS_METRIC

from .base import ApiModel
from .budget import BudgetRef
from .restarts import CLOCK_PATTERN, DailyWindow
from .rules import (
    AUTOSCALING_RULES,
    KV_TRIGGER_RULES,
    MSG_KV_TARGET,
    MSG_MIN_MAX,
    MSG_TARGET_IN_FLIGHT,
    MSG_TARGET_QUEUE_DEPTH,
    MSG_WARM_DAYS,
    MSG_WARM_MIN,
    MSG_WARM_WINDOW,
    WARM_WINDOW_RULES,
    validations,
)

ScalingMetric = Literal["InFlight", "QueueDepth", "SLO"]
# The metrics that scale on in-flight requests (running + waiting): InFlight, and SLO with a measured target.
IN_FLIGHT_METRICS: tuple[ScalingMetric, ...] = ("InFlight", "SLO")
MetricsSource = Literal["ServiceMonitor", "External"]
DEFAULT_TARGET_IN_FLIGHT = 32
DEFAULT_TARGET_QUEUE_DEPTH = 5
# metric SLO: the target is this share of the measured concurrency at the SLO (20% headroom for bursts).
DEFAULT_SLO_TARGET_RATIO = 0.8
Weekday = Literal["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
WEEKDAYS: tuple[Weekday, ...] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
# Warm-up before a schedule window when the spec sets none and no start has been measured yet.
DEFAULT_WARM_UP_SECONDS = 300


def slo_target(concurrency: int, ratio: float = DEFAULT_SLO_TARGET_RATIO) -> int:
    """metric SLO's in-flight target per replica: `ratio` (sloTargetRatio) of `concurrency`, the concurrency
    per replica the capacity profile measured within spec.slo, rounded down, at least 1. The one place the
    ratio is applied: the ScaledObject's threshold (target_per_replica) and status.sizing's replicasNeeded
    (status/sizing.py) both come from it."""
    return max(1, int(concurrency * ratio))


class KvCacheTrigger(ApiModel):
    """Scale out when KV-cache usage of the busiest replica passes a ratio."""

    model_config = ConfigDict(json_schema_extra=validations(KV_TRIGGER_RULES))

    target_ratio: float = Field(
        description=f"KV-cache usage ratio in (0, 1] (max over replicas of {KV_CACHE_USAGE_METRIC}) "
        "to scale at."
    )

    @field_validator("target_ratio")
    @classmethod
    def _fraction(cls, value: float) -> float:
        if not 0.0 < value <= 1.0:
            raise ValueError(MSG_KV_TARGET)
        return value


class WarmWindow(DailyWindow):
    """A daily window in which the service keeps at least minReplicas warm replicas (a known peak). They start
    warmUpSeconds before the window opens, so that they are Ready when it does."""

    model_config = ConfigDict(json_schema_extra=validations(WARM_WINDOW_RULES))
    EMPTY: ClassVar[str] = MSG_WARM_WINDOW

    start: str = Field(
        max_length=5, pattern=CLOCK_PATTERN, description="When the window opens, HH:MM (24-hour) in timeZone."
    )
    end: str = Field(
        max_length=5,
        pattern=CLOCK_PATTERN,
        description="When it closes, HH:MM; earlier than start for a window across midnight (e.g. 22:00 to "
        "02:00, ending the next day). After it the floor is released and the load triggers decide again.",
    )
    days: list[Weekday] = Field(
        default_factory=lambda: list(WEEKDAYS),
        min_length=1,
        max_length=7,
        description="The days the window opens on (Mon ... Sun). Default: every day.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    min_replicas: int = Field(ge=1, le=1000, description="Replicas kept warm during the window.")

    @field_validator("days")
    @classmethod
    def _distinct(cls, value: list[Weekday]) -> list[Weekday]:
        if len(set(value)) != len(value):
            raise ValueError(MSG_WARM_DAYS)
        return value


class AutoscalingSpec(ApiModel):
    """Autoscaling by KEDA; the Deployment's replicas are then owned by KEDA's HPA."""

    model_config = ConfigDict(json_schema_extra=validations(AUTOSCALING_RULES))

    min_replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Fewest replicas. 0 (scale to zero when idle) needs spec.routing: the endpoint "
        "picker's queue holds the first requests and KEDA starts a replica on it; without routing at "
        "least 1, since the load is measured on the replicas themselves.",
    )
    max_replicas: int = Field(ge=1, le=1000, description="Most replicas.")
    metric: ScalingMetric | None = Field(
        default=None,
        description="What the main trigger measures, per replica: InFlight, the requests the engine is "
        f"running plus those waiting ({RUNNING_REQUESTS_METRIC} + {QUEUE_DEPTH_METRIC}), or QueueDepth, the "
        f"waiting ones only ({QUEUE_DEPTH_METRIC}; with continuous batching it rises only once the batch, "
        "engine.maxNumSeqs, is full, after latency has already grown), or SLO: in-flight requests with the "
        "target taken from the capacity profile (sloTargetRatio of status.profile.concurrency; needs "
        "spec.slo, and until a profile has measured one, targetInFlight or its default; while the newest "
        "profile met the SLO at no step, the target of the last that met it, or 1 when none did: condition "
        "SLOUnmet). Default: InFlight, or QueueDepth when only targetQueueDepth is set.",
    )
    target_in_flight: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="In-flight requests (running + waiting) per replica to aim for, with metric InFlight "
        f"(with metric SLO, until a profile has measured the capacity). Default: {DEFAULT_TARGET_IN_FLIGHT}. "
        "Set it at or a little below the concurrency that still meets your latency goal (metric SLO "
        "measures that for you); above engine.maxNumSeqs the excess waits in the queue.",
    )
    slo_target_ratio: float = Field(
        default=DEFAULT_SLO_TARGET_RATIO,
        gt=0,
        le=1,
        description="With metric SLO: the in-flight target per replica as a fraction of the concurrency "
        "the profile measured within spec.slo (rounded down, at least 1), the headroom that absorbs a "
        f"burst while a new replica starts. Default: {DEFAULT_SLO_TARGET_RATIO}.",
    )
    target_queue_depth: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description=f"Waiting requests per replica ({QUEUE_DEPTH_METRIC}) to aim for, with metric "
        f"QueueDepth. Default: {DEFAULT_TARGET_QUEUE_DEPTH}.",
    )
    kv_cache_usage: KvCacheTrigger | None = Field(
        default=None, description="Optional second trigger on KV-cache usage."
    )
    metrics_source: MetricsSource = Field(
        default="ServiceMonitor",
        description="How the runtime's metrics reach Prometheus: ServiceMonitor (requires "
        "monitoring.serviceMonitor.enabled) or External (collected another way, e.g. a PodMonitor or "
        "annotation-based scraping; the series must carry the labels namespace and service=<name>, as "
        "a ServiceMonitor's targets do).",
    )
    polling_interval: int = Field(
        default=15, ge=1, le=3600, description="Seconds between KEDA's metric queries."
    )
    cooldown_period: int = Field(
        default=300,
        ge=0,
        le=3600,
        description="Seconds the load must stay low before replicas are removed (KEDA cooldownPeriod and the "
        "HPA's scale-down stabilization window).",
    )
    schedule: list[WarmWindow] = Field(
        default_factory=list,
        max_length=8,
        description="Pre-warming for known peaks: daily windows with a floor of warm replicas (KEDA cron "
        "triggers beside the load trigger; the replicas start warmUpSeconds early).",
    )
    warm_up_seconds: int | None = Field(
        default=None,
        ge=0,
        le=3600,
        description="How long before a schedule window opens its replicas start. Default: the typical cold "
        f"start this service measured (status.startup.typical.seconds), or {DEFAULT_WARM_UP_SECONDS} before "
        "one is measured; rounded up to whole minutes (cron's resolution).",
    )
    budget: BudgetRef | None = Field(
        default=None,
        description="A GPUBudget this service shares with others (docs/budget.md): the operator then sets "
        "the ScaledObject's maxReplicaCount to the replicas the budget gives it now (at most maxReplicas, "
        "at least minReplicas, the guarantee), and status.budget says what it asked for, got, and why.",
    )
    prometheus_address: str = Field(
        default="http://prometheus-operated.monitoring.svc:9090",
        min_length=1,
        max_length=2048,
        pattern=r"^https?://.+",
        description="Prometheus server KEDA queries.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(MSG_MIN_MAX)
        in_flight, queue = self.target_in_flight is not None, self.target_queue_depth is not None
        if in_flight and (self.metric not in IN_FLIGHT_METRICS if self.metric else queue):
            raise ValueError(MSG_TARGET_IN_FLIGHT)
        if queue and self.metric not in (None, "QueueDepth"):
            raise ValueError(MSG_TARGET_QUEUE_DEPTH)
        if any(window.min_replicas > self.max_replicas for window in self.schedule):
            raise ValueError(MSG_WARM_MIN)
        return self

    @property
    def scaling_metric(self) -> ScalingMetric:
        """The metric in effect: as set, else QueueDepth for a spec that only names targetQueueDepth (the
        API before `metric` existed), else InFlight."""
        if self.metric is not None:
            return self.metric
        return "QueueDepth" if self.target_queue_depth is not None else "InFlight"

    def target_per_replica(self, slo_concurrency: int | None = None) -> int:
        """The per-replica target of the metric in effect; `slo_concurrency`: the base of metric SLO's
        target (reconcile/profile.py slo_concurrency: what the capacity profile measured within the SLO, the
        last such measurement or 1 while the newest profile met it at no step; None before a measurement,
        when targetInFlight holds)."""
        if self.scaling_metric == "SLO" and slo_concurrency is not None:
            return slo_target(slo_concurrency, self.slo_target_ratio)
        if self.scaling_metric in IN_FLIGHT_METRICS:
            return self.target_in_flight or DEFAULT_TARGET_IN_FLIGHT
        return self.target_queue_depth or DEFAULT_TARGET_QUEUE_DEPTH
