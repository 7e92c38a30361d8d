"""InferenceServiceSpec: the whole spec, and the rules that span its parts."""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from pagoda.contract import default_served_name

from .base import ApiModel
from .cost import CostSpec
from .engine import EngineSpec
from .lora import LoraSpec
from .model import ModelSource
from .network import NetworkPolicySpec
from .restarts import RestartSchedule
from .routing import RoutingSpec
from .rules import (
    MSG_ADAPTER_SERVED_NAME,
    MSG_AUTOSCALING_METRICS,
    MSG_AUTOSCALING_SLO,
    MSG_REPLICAS_XOR,
    MSG_SCALE_FROM_ZERO,
    MSG_TENSOR_PARALLEL,
    MSG_TLS_ROUTING,
    SPEC_RULES,
    validations,
)
from .scaling import AutoscalingSpec
from .slo import SloSpec
from .workload import (
    DisruptionSpec,
    MonitoringSpec,
    ResourcesSpec,
    RolloutSpec,
    RuntimeSpec,
    SchedulingSpec,
    ServiceSpec,
)


class InferenceServiceSpec(ApiModel):
    """An LLM served by the Pagoda runtime (vLLM) behind a Service, scaled on its load."""

    model_config = ConfigDict(json_schema_extra=validations(SPEC_RULES))

    model: ModelSource = Field(description="The model to serve.")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="vLLM engine settings.")
    resources: ResourcesSpec = Field(description="Compute resources of one replica.")
    replicas: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="Fixed number of replicas (default 1); mutually exclusive with autoscaling. "
        "`kubectl scale` sets it.",
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        description="Scale on in-flight requests or queue depth with KEDA; mutually exclusive with replicas.",
    )
    disruption: DisruptionSpec = Field(
        default_factory=DisruptionSpec, description="PodDisruptionBudget settings."
    )
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="Rolling update settings.")
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, description="Pod placement.")
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec, description="The runtime container.")
    service: ServiceSpec = Field(default_factory=ServiceSpec, description="The Service.")
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec, description="Metrics collection.")
    network_policy: NetworkPolicySpec = Field(
        default_factory=NetworkPolicySpec,
        description="Who may connect to the pods (a NetworkPolicy; on by default, see docs/security.md).",
    )
    restart_schedule: RestartSchedule | None = Field(
        default=None,
        description="Optional rolling restarts of every pod at an interval (vLLM's memory grows over a "
        "long run), optionally only within a daily window; status.restarts shows the last and the next.",
    )
    lora: LoraSpec | None = Field(
        default=None,
        description="Serve LoRA adapters beside the base model (see docs/lora.md): the engine limits "
        "(changing one restarts the pods) and the adapters (loaded and unloaded at run time, no restart).",
    )
    routing: RoutingSpec | None = Field(
        default=None,
        description="Route requests through the Gateway API Inference Extension (see docs/routing.md): an "
        "InferencePool of the runtime pods and an endpoint picker (prefix-cache aware, queue and KV-cache "
        "aware, holds requests while no replica runs); allows autoscaling.minReplicas 0.",
    )
    slo: SloSpec | None = Field(
        default=None,
        description="Latency objectives (TTFT and inter-token p95): the operator measures the concurrency "
        "one replica serves within them with a profile Job and reports it in status.profile (see "
        "docs/capacity.md).",
    )
    cost: CostSpec | None = Field(
        default=None,
        description="Optional prices: cost per 1M generated tokens and break-even against an API "
        "(dashboard panels and an alert; needs kube-state-metrics, see docs/observability.md).",
    )

    @model_validator(mode="after")
    def _cross_field(self) -> InferenceServiceSpec:
        if self.replicas is not None and self.autoscaling is not None:
            raise ValueError(MSG_REPLICAS_XOR)
        if self.autoscaling and self.autoscaling.metric == "SLO" and self.slo is None:
            raise ValueError(MSG_AUTOSCALING_SLO)
        tp = self.engine.tensor_parallel_size
        if tp is not None and tp != self.resources.gpu.count:
            raise ValueError(MSG_TENSOR_PARALLEL)
        monitored = self.monitoring.service_monitor.enabled
        if self.autoscaling and self.autoscaling.metrics_source == "ServiceMonitor" and not monitored:
            raise ValueError(MSG_AUTOSCALING_METRICS)
        if self.autoscaling and self.autoscaling.min_replicas == 0 and self.routing is None:
            raise ValueError(MSG_SCALE_FROM_ZERO)
        if self.runtime.tls is not None and self.routing is not None:
            raise ValueError(MSG_TLS_ROUTING)
        if self.lora and any(adapter.name == self.served_name for adapter in self.lora.adapters):
            raise ValueError(MSG_ADAPTER_SERVED_NAME)
        return self

    @property
    def tensor_parallel_size(self) -> int:
        """The effective tensor parallel size (the GPU count when not given)."""
        return self.engine.tensor_parallel_size or self.resources.gpu.count

    @property
    def served_name(self) -> str:
        """The model name clients send: spec.model.servedName, else the name the runtime derives from the
        URI (the contract's rule: file:///models/tiny serves `tiny`)."""
        return self.model.served_name or default_served_name(self.model.uri)
