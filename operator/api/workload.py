"""spec.resources, scheduling, runtime, service, monitoring, disruption and rollout."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from pagoda.contract import (
    HTTP_PORT,
    INFERENCE_API,
    MAX_REQUEST_BODY_BYTES,
    PORT_NAME,
    TLS_CA_KEY,
    TLS_CERT_KEY,
    TLS_KEY_KEY,
)

from .base import ApiModel, IntOrPercent, ObjectName, Quantity, is_zero
from .rules import (
    ENV_RULES,
    ENV_SOURCE_RULES,
    MSG_ENV_SOURCE,
    MSG_ENV_VALUE_AND_SOURCE,
    MSG_ROLLOUT_ZERO,
    MSG_SECRET_ENV,
    MSG_TOLERATION_KEY,
    MSG_TOLERATION_SECONDS,
    MSG_TOLERATION_VALUE,
    REFUSED_ENV_NAMES,
    ROLLOUT_RULES,
    SECRET_ENV_NAMES,
    TOLERATION_RULES,
    validations,
)

_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
# A label or taint key: an optional DNS-subdomain prefix and a name of at most 63 characters.
QUALIFIED_NAME_PATTERN = rf"^({_SUBDOMAIN}/)?{_NAME}$"
# An extended resource: always domain/name (a bare name is a native resource: cpu, memory).
EXTENDED_RESOURCE_PATTERN = rf"^{_SUBDOMAIN}/{_NAME}$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LabelMap = dict[
    Annotated[str, Field(max_length=317)], Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
]
# spec.runtime.imagePullSecrets: a pod pulls from a few registries at most.
MAX_PULL_SECRETS = 16
# spec.runtime.maxRequestBodyBytes: at least 1 KiB (less refuses ordinary chat requests), at most 1 GiB
# (vLLM's app holds a request's body whole in memory before parsing it, one per request in flight).
REQUEST_BODY_BYTES_MIN = 1024
REQUEST_BODY_BYTES_MAX = 1024**3


class GpuSpec(ApiModel):
    """GPUs of one replica."""

    count: int = Field(ge=1, le=64, description="GPUs per replica; must equal engine.tensorParallelSize.")
    resource_name: str = Field(
        default="nvidia.com/gpu",
        min_length=1,
        max_length=253,
        pattern=EXTENDED_RESOURCE_PATTERN,
        description="Extended resource name the device plugin advertises (domain/name, e.g. amd.com/gpu).",
    )
    product: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        description="Required GPU model, matched against the node label nvidia.com/gpu.product "
        "(e.g. NVIDIA-H100-80GB-HBM3).",
    )


class ResourcesSpec(ApiModel):
    """Compute resources of one replica."""

    gpu: GpuSpec = Field(description="GPUs per replica (requested as limits).")
    cpu: Quantity | None = Field(
        default=None, description="CPU request (no limit: the engine may use idle cores), e.g. 8 or 8000m."
    )
    memory: Quantity | None = Field(default=None, description="Memory request and limit, e.g. 64Gi.")
    shared_memory_size: Quantity | None = Field(
        default=None,
        description="Size limit of the in-memory /dev/shm volume (NCCL and tensor parallelism use it); "
        "counts against memory. Unbounded (up to the pod's memory) when unset.",
    )


class Toleration(ApiModel):
    """A pod toleration (core/v1 Toleration)."""

    model_config = ConfigDict(json_schema_extra=validations(TOLERATION_RULES))

    key: str | None = Field(
        default=None,
        max_length=317,
        pattern=QUALIFIED_NAME_PATTERN,
        description="Taint key; empty with Exists matches all.",
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal (default)."
    )
    value: str | None = Field(
        default=None,
        max_length=63,
        pattern=LABEL_VALUE_PATTERN,
        description="Taint value for operator Equal.",
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all."
    )
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated before eviction."
    )

    @model_validator(mode="after")
    def _as_the_api_server_checks(self) -> Toleration:
        if self.key is None and self.operator != "Exists":
            raise ValueError(MSG_TOLERATION_KEY)
        if self.operator == "Exists" and self.value is not None:
            raise ValueError(MSG_TOLERATION_VALUE)
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError(MSG_TOLERATION_SECONDS)
        return self


class SchedulingSpec(ApiModel):
    """Where the replicas may run."""

    node_selector: LabelMap = Field(
        default_factory=dict,
        max_length=32,
        description="Node labels the pods require (the GPU product label is added from "
        "resources.gpu.product).",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=32,
        description="Extra tolerations; the nvidia.com/gpu NoSchedule toleration is always added.",
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        description="Pod affinity (core/v1 Affinity), copied to the pod template as written.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    topology_spread_constraints: list[dict[str, Any]] | None = Field(
        default=None,
        max_length=8,
        description="How the replicas spread over the cluster (core/v1 TopologySpreadConstraint list, "
        "copied to the pod template as written). Unset: across nodes where there is room (maxSkew 1 on "
        "kubernetes.io/hostname, ScheduleAnyway), so that one node lost or drained takes as few replicas as "
        "the cluster allows; [] turns spreading off.",
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    )
    priority_class_name: ObjectName | None = Field(default=None, description="PriorityClass of the pods.")


class SecretKeyRef(ApiModel):
    """A key of a Secret in the same namespace."""

    name: ObjectName = Field(description="Secret name.")
    key: str = Field(default="api-key", min_length=1, max_length=253, description="Key within the Secret.")


class LocalObjectReference(ApiModel):
    """A Secret in the same namespace, by name (core/v1 LocalObjectReference)."""

    name: ObjectName = Field(description="Secret name.")


class KeyRef(ApiModel):
    """A key of a Secret or ConfigMap in the same namespace."""

    name: ObjectName = Field(description="The object's name.")
    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$", description="The key.")
    optional: bool | None = Field(default=None, description="Start even when the object or key is missing.")


class FieldRef(ApiModel):
    """A field of the pod (the downward API)."""

    field_path: str = Field(
        max_length=253,
        pattern=rf"^(metadata\.(name|namespace|uid|(labels|annotations)\['({_SUBDOMAIN}/)?{_NAME}'\])"
        r"|spec\.(nodeName|serviceAccountName)|status\.(hostIP|hostIPs|podIP|podIPs))$",
        description="e.g. metadata.name, metadata.labels['app'], status.podIP.",
    )


class ResourceFieldRef(ApiModel):
    """A resource request or limit of the runtime container."""

    resource: Literal[
        "limits.cpu",
        "limits.memory",
        "limits.ephemeral-storage",
        "requests.cpu",
        "requests.memory",
        "requests.ephemeral-storage",
    ] = Field(description="The request or limit.")


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from (core/v1 EnvVarSource): exactly one source."""

    model_config = ConfigDict(json_schema_extra=validations(ENV_SOURCE_RULES))

    secret_key_ref: KeyRef | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: KeyRef | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: FieldRef | None = Field(default=None, description="A field of the pod.")
    resource_field_ref: ResourceFieldRef | None = Field(
        default=None, description="A request or limit of the container."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvVarSource:
        sources = (self.secret_key_ref, self.config_map_key_ref, self.field_ref, self.resource_field_ref)
        if sum(source is not None for source in sources) != 1:
            raise ValueError(MSG_ENV_SOURCE)
        return self


class EnvVar(ApiModel):
    """An environment variable of the runtime container."""

    model_config = ConfigDict(json_schema_extra=validations(ENV_RULES))

    name: str = Field(
        min_length=1, max_length=253, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", description="Name."
    )
    value: str | None = Field(default=None, max_length=32768, description="Literal value.")
    value_from: EnvVarSource | None = Field(
        default=None,
        description="Source of the value: secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef.",
    )

    @model_validator(mode="after")
    def _no_literal_secret(self) -> EnvVar:
        if self.name in REFUSED_ENV_NAMES:
            raise ValueError(REFUSED_ENV_NAMES[self.name])
        if self.value is not None and self.name in SECRET_ENV_NAMES:
            raise ValueError(MSG_SECRET_ENV)
        if self.value is not None and self.value_from is not None:
            raise ValueError(MSG_ENV_VALUE_AND_SOURCE)
        return self


class RuntimeTlsSpec(ApiModel):
    """HTTPS on the runtime's port, with a certificate from a Secret (docs/security.md#tls)."""

    secret_name: ObjectName = Field(
        description=f"A Secret in the same namespace with cert-manager's key names (type kubernetes.io/tls): "
        f"{TLS_CERT_KEY} (the certificate, chain included) and {TLS_KEY_KEY} (its private key, unencrypted), "
        f"and {TLS_CA_KEY} (the CA that issued it) for verification. Mounted read-only; a renewed "
        "certificate is served to new connections within a minute, without a restart.",
    )
    insecure_skip_verify: bool = Field(
        default=False,
        description=f"Prometheus (the ServiceMonitor) and the operator (its capacity reads and management "
        f"calls) reach the pods without verifying their certificate. By default both verify it against the "
        f"Secret's {TLS_CA_KEY} and the name <name>.<namespace>.svc, which the certificate must carry, and "
        f"the operator calls no pod it cannot verify; set this when the Secret has no {TLS_CA_KEY} (e.g. a "
        "public ACME issuer's certificate): the connections stay encrypted but are not authenticated.",
    )


class RuntimeSpec(ApiModel):
    """The Pagoda runtime container."""

    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Runtime image; the operator's default (matching its own version) when unset.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="Image pull policy of the runtime container."
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        max_length=MAX_PULL_SECRETS,
        description="Secrets in the same namespace (type kubernetes.io/dockerconfigjson) for pulling from "
        "private registries, copied to the pods' imagePullSecrets: the kubelet uses them for the runtime "
        "image and for an oci:// model image alike (an image volume), in the replicas and the profile Job. "
        "Unset: those of the namespace's default ServiceAccount, if it has any (Kubernetes adds them only "
        "to a pod that names none).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    env: list[EnvVar] = Field(default_factory=list, max_length=64, description="Extra environment variables.")
    api_key_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the API key (env PAGODA_API_KEY); every request to the inference API "
        f"({', '.join(INFERENCE_API)}) then requires `Authorization: Bearer <key>`; the probes and /metrics "
        "stay open.",
    )
    tls: RuntimeTlsSpec | None = Field(
        default=None,
        description="Serve HTTPS instead of HTTP (--tls-cert-file, --tls-key-file), with the certificate in "
        "a Secret; the probes, the Service (appProtocol https), the ServiceMonitor and the operator's calls "
        "follow. Not with spec.routing.",
    )
    max_request_body_bytes: int | None = Field(
        default=None,
        ge=REQUEST_BODY_BYTES_MIN,
        le=REQUEST_BODY_BYTES_MAX,
        description="The largest request body the runtime accepts, in bytes (--max-request-body-bytes), "
        "from 1 KiB to 1 GiB; a larger one gets 413 before vLLM reads it. Unset: the runtime's default, "
        f"{MAX_REQUEST_BODY_BYTES // 1024**2} MiB, enough for a long chat and a few inline base64 images; "
        "raise it for larger images or more of them (vLLM holds each body in memory while it parses it).",
    )
    drain_timeout_seconds: int = Field(
        default=120,
        ge=0,
        le=3600,
        description="On shutdown, how long in-flight and queued requests may take to finish "
        "(--drain-timeout); terminationGracePeriodSeconds covers it.",
    )
    stall_timeout_seconds: int | None = Field(
        default=None,
        ge=0,
        le=3600,
        description="How long the engine may hold requests and complete no step before the runtime fails its "
        "liveness probe and exits, so that the pod restarts (--stall-timeout); 0: never. Unset: the "
        "runtime's default, the longest one engine step takes at a slow CPU's prefill rate and at least "
        "30 s (docs/runtime.md). A hung engine never ends a step.",
    )
    startup_timeout_seconds: int = Field(
        default=1800,
        ge=60,
        le=86400,
        description="How long model download and loading may take before the pod is restarted "
        "(startupProbe).",
    )

    @model_validator(mode="after")
    def _unique_pull_secrets(self) -> RuntimeSpec:
        names = [secret.name for secret in self.image_pull_secrets]
        if len(set(names)) != len(names):
            raise ValueError(f"spec.runtime.imagePullSecrets: duplicate names in {names}")
        return self


class ServiceSpec(ApiModel):
    """The Service in front of the replicas."""

    port: int = Field(default=HTTP_PORT, ge=1, le=65535, description=f"Service port (named {PORT_NAME}).")
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP", description="Service type."
    )


class ServiceMonitorSpec(ApiModel):
    """A Prometheus Operator ServiceMonitor for the runtime's /metrics."""

    enabled: bool = Field(default=False, description="Create a ServiceMonitor (monitoring.coreos.com/v1).")
    interval: str = Field(
        default="15s",
        min_length=1,
        max_length=32,
        pattern=r"^(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?$",
        description="Scrape interval (a Prometheus duration, e.g. 30s or 1m30s).",
    )
    labels: LabelMap = Field(
        default_factory=dict,
        max_length=16,
        description="Extra labels on the ServiceMonitor (e.g. to match a Prometheus serviceMonitorSelector).",
    )


class MonitoringSpec(ApiModel):
    """Metrics collection."""

    service_monitor: ServiceMonitorSpec = Field(
        default_factory=ServiceMonitorSpec, description="ServiceMonitor settings."
    )


class DisruptionSpec(ApiModel):
    """The PodDisruptionBudget."""

    max_unavailable: IntOrPercent = Field(
        default=1, description="Replicas a voluntary disruption (drain, eviction) may take down at once."
    )


class RolloutSpec(ApiModel):
    """The Deployment's rolling update."""

    model_config = ConfigDict(json_schema_extra=validations(ROLLOUT_RULES))

    max_surge: IntOrPercent = Field(
        default=1, description="Extra replicas during a rollout (each needs its GPUs; 0 to roll in place)."
    )
    max_unavailable: IntOrPercent = Field(
        default=0, description="Replicas that may be unavailable during a rollout."
    )

    @model_validator(mode="after")
    def _can_replace(self) -> RolloutSpec:
        if is_zero(self.max_surge) and is_zero(self.max_unavailable):
            raise ValueError(MSG_ROLLOUT_ZERO)
        return self
