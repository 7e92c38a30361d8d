"""The InferenceService API (pagoda.dev/v1alpha1): pydantic models, the single source of the CRD schema."""

from __future__ import annotations

from .cost import CostSpec
from .engine import ChatTemplate, ConfigMapKeyRef, EngineSpec
from .errors import describe, error_messages, field_path
from .lora import LoraAdapter, LoraSpec
from .model import ModelCache, ModelSource
from .network import NetworkPeer, NetworkPolicySpec
from .restarts import RestartSchedule, RestartWindow
from .routing import EndpointPickerSpec, GatewayRef, RoutingSpec
from .rules import MSG_NAME
from .scaling import AutoscalingSpec, KvCacheTrigger, WarmWindow
from .spec import InferenceServiceSpec
from .status import CONDITION_TYPES, Condition, InferenceServiceStatus
from .workload import (
    DisruptionSpec,
    EnvVar,
    GpuSpec,
    LocalObjectReference,
    MonitoringSpec,
    ResourcesSpec,
    RolloutSpec,
    RuntimeSpec,
    RuntimeTlsSpec,
    SchedulingSpec,
    SecretKeyRef,
    ServiceMonitorSpec,
    ServiceSpec,
    Toleration,
)

GROUP = "pagoda.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
SHORT_NAMES = ["infsvc"]
CRD_NAME = f"{PLURAL}.{GROUP}"

__all__ = [
    "API_VERSION",
    "CONDITION_TYPES",
    "CRD_NAME",
    "GROUP",
    "KIND",
    "MSG_NAME",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "describe",
    "error_messages",
    "field_path",
    "AutoscalingSpec",
    "WarmWindow",
    "ChatTemplate",
    "Condition",
    "ConfigMapKeyRef",
    "CostSpec",
    "DisruptionSpec",
    "EndpointPickerSpec",
    "NetworkPeer",
    "NetworkPolicySpec",
    "EngineSpec",
    "EnvVar",
    "GatewayRef",
    "GpuSpec",
    "InferenceServiceSpec",
    "InferenceServiceStatus",
    "KvCacheTrigger",
    "LocalObjectReference",
    "LoraAdapter",
    "LoraSpec",
    "ModelCache",
    "ModelSource",
    "MonitoringSpec",
    "ResourcesSpec",
    "RestartSchedule",
    "RestartWindow",
    "RolloutSpec",
    "RoutingSpec",
    "RuntimeSpec",
    "RuntimeTlsSpec",
    "SchedulingSpec",
    "SecretKeyRef",
    "ServiceMonitorSpec",
    "ServiceSpec",
    "Toleration",
]
