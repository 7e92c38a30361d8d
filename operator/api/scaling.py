"""spec.autoscaling: a KEDA ScaledObject on the runtime's queue depth (and optionally KV-cache usage)."""

from __future__ import annotations

from pydantic import ConfigDict, Field, field_validator, model_validator

from .base import ApiModel
from .rules import AUTOSCALING_RULES, KV_TRIGGER_RULES, MSG_KV_TARGET, MSG_MIN_MAX, validations


class KvCacheTrigger(ApiModel):
    """Scale out when KV-cache usage of the busiest replica passes a ratio."""

    model_config = ConfigDict(json_schema_extra=validations(KV_TRIGGER_RULES))

    target_ratio: float = Field(
        description="KV-cache usage ratio in (0, 1] (max over replicas of pagoda_kv_cache_usage_ratio) "
        "to scale at."
    )

    @field_validator("target_ratio")
    @classmethod
    def _fraction(cls, value: float) -> float:
        if not 0.0 < value <= 1.0:
            raise ValueError(MSG_KV_TARGET)
        return value


class AutoscalingSpec(ApiModel):
    """Autoscaling by KEDA; the Deployment's replicas are then owned by KEDA's HPA."""

    model_config = ConfigDict(json_schema_extra=validations(AUTOSCALING_RULES))

    min_replicas: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="Fewest replicas (at least 1: queue depth is measured on the replicas themselves).",
    )
    max_replicas: int = Field(ge=1, le=1000, description="Most replicas.")
    target_queue_depth: int = Field(
        default=5,
        ge=1,
        le=100_000,
        description="Waiting requests per replica (pagoda_queue_depth) to aim for.",
    )
    kv_cache_usage: KvCacheTrigger | None = Field(
        default=None, description="Optional second trigger on KV-cache usage."
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
    prometheus_address: str = Field(
        default="http://prometheus-operated.monitoring.svc:9090",
        min_length=1,
        max_length=2048,
        pattern=r"^https?://.+",
        description="Prometheus server KEDA queries.",
    )

    @model_validator(mode="after")
    def _min_le_max(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(MSG_MIN_MAX)
        return self
