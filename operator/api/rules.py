"""The cross-field rules of the API, once: CEL for the API server, messages shared with pydantic.

Each rule is enforced twice with the same message: by the API server at admission (CEL in the CRD, see
crdgen) and by the operator's pydantic models, so an object that got past an older CRD is reported the same.
One file over 400 lines on purpose: every rule of the API in one place, each CEL expression beside its
message.
"""

from __future__ import annotations

from pydantic import JsonValue

from pagoda.contract import (
    CACHE_DIR,
    IMAGE_MODEL_NAME,
    OCI_REFERENCE_PATTERN,
    POD_IP_ENV,
    POD_UID_ENV,
    S3_BUCKET_PATTERN,
    TERMINATION_MESSAGE_ENV,
    default_served_name_cel,
)
from pagoda.contract.vllmflags import OWNED_FLAGS, owned_flag_pattern

JsonDict = dict[str, JsonValue]

_HF = r"hf://[A-Za-z0-9][-._A-Za-z0-9]*(/[A-Za-z0-9][-._A-Za-z0-9]*)?/?"
# One part of an s3:// prefix: not empty, not '.' or '..' (the prefix is also the cache folder's path, which a
# '..' would leave; runtime/models/modeluri.py refuses the same). Written without look-ahead: the API server's
# regexps are RE2, and `[.]` rather than `\.`, which a CEL string literal refuses as an escape.
_S3_PART = r"([^/.][^/]*|[.][^/.][^/]*|[.][.][^/]+)"
_S3 = rf"s3://{S3_BUCKET_PATTERN}/{_S3_PART}(/{_S3_PART})*/?"
_PVC = r"pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/.*)?"
URI_PATTERN = rf"^({_HF}|{_S3}|{_PVC}|file:///.*)$"
# A model may also be an OCI image (oci://registry/repository:tag), mounted as an image volume; an adapter
# may not (its files come to a running pod, which cannot mount a new volume).
MODEL_URI_PATTERN = rf"^({_HF}|{_S3}|{_PVC}|oci://{OCI_REFERENCE_PATTERN}|file:///.*)$"
# Flags the runtime sets itself, in any spelling vLLM accepts: vLLM must not get them again in extraArgs.
OWNED_FLAG_PATTERN = owned_flag_pattern()

MSG_URI = (
    "spec.model.uri must use a known scheme: hf://org/name, s3://bucket/path, pvc://claim/path, "
    "oci://registry/repository:tag or file:///path"
)
MSG_MODEL_REVISION = "spec.model.revision is a hub revision (branch, tag or commit): it needs an hf:// uri"
MSG_CACHE = "spec.model.cache: set either pvc or size, not both"
MSG_CACHE_SIZE = "spec.model.cache.size must be greater than 0"
MSG_CACHE_NODE = (
    "spec.model.cache.scope Node keeps the cache in a folder on each node: it takes no pvc or storageClass"
)
MSG_CACHE_STORAGE_CLASS = "spec.model.cache.storageClass requires spec.model.cache.size"
MSG_EXTRA_ARGS = (
    f"spec.engine.extraArgs must not repeat flags the runtime sets itself ({', '.join(OWNED_FLAGS)}): "
    "use the spec fields"
)
SECRET_ENV_NAMES = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "PAGODA_API_KEY",
)
MSG_SECRET_ENV = (
    "spec.runtime.env: HF_TOKEN, HUGGING_FACE_HUB_TOKEN, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN and "
    "PAGODA_API_KEY must come from a Secret (valueFrom, model.credentialsSecret or runtime.apiKeySecret), "
    "never a literal value"
)
# vLLM's switches that mount routes no API key guards (the runtime's gate keeps those routes out too,
# docs/security.md#the-inference-api): refused in spec.runtime.env, with a value or from any source.
MSG_ENV_DEV_MODE = (
    "spec.runtime.env: VLLM_SERVER_DEV_MODE is not allowed: it turns on vLLM's development routes (RPC to "
    "the engine's workers, sleep, cache resets, weight updates), which take no API key"
)
MSG_ENV_LORA_UPDATING = (
    "spec.runtime.env: VLLM_ALLOW_RUNTIME_LORA_UPDATING is not allowed: it turns on vLLM's own adapter "
    "routes, which take no API key, and loading adapters that requests name; list adapters in "
    "spec.lora.adapters"
)
API_KEY_ENV = "PAGODA_API_KEY"
# The root filesystem is read-only: everything the runtime, vLLM, torch and the Hugging Face libraries write
# goes to the model cache volume, whatever image runs (a user's own too). Set by operator/resources/pod.py.
WRITABLE_ENV = {
    "HOME": CACHE_DIR,
    "TMPDIR": CACHE_DIR,
    "XDG_CACHE_HOME": f"{CACHE_DIR}/xdg",
    "VLLM_CACHE_ROOT": f"{CACHE_DIR}/vllm",
    "HF_HOME": f"{CACHE_DIR}/hf",
    "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_DIR}/torchinductor",
    "TRITON_CACHE_DIR": f"{CACHE_DIR}/triton",
    "NUMBA_CACHE_DIR": f"{CACHE_DIR}/numba",
}
# Every variable the operator sets on the runtime container (operator/resources/pod.py takes the names from
# here; tests/unit/test_resources_pod.py checks it sets no other), and why each is the operator's. Refused
# in spec.runtime.env, naming the variable: nothing the operator relies on, now or in a later version, is
# the user's to redefine (a POD_NAMESPACE of the user's once chose which namespace's node cache folder a pod
# mounted, issue #40). POD_NAMESPACE stays reserved with the pod's other identity variables, though the
# operator no longer sets it.
OPERATOR_ENV = {
    TERMINATION_MESSAGE_ENV: "the operator sets it: where the runtime writes why it could not start",
    "POD_NAMESPACE": "it is reserved for the pod's own namespace (the downward API)",
    POD_UID_ENV: "the operator sets it from the downward API: the management API accepts only calls signed "
    "for this pod's UID",
    POD_IP_ENV: "the operator sets it from the downward API: the management API accepts only calls "
    "addressed to this pod's IP",
    API_KEY_ENV: "the operator sets it from spec.runtime.apiKeySecret: name the key's Secret there",
    **{
        name: f"the operator sets it to {value}, on the cache volume (the root filesystem is read-only)"
        for name, value in WRITABLE_ENV.items()
    },
}
MSG_ENV_OPERATOR = "spec.runtime.env: {name} is not allowed: {why}"

REFUSED_ENV_NAMES = {
    "VLLM_SERVER_DEV_MODE": MSG_ENV_DEV_MODE,
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": MSG_ENV_LORA_UPDATING,
    **{name: MSG_ENV_OPERATOR.format(name=name, why=why) for name, why in OPERATOR_ENV.items()},
}
MSG_ENV_VALUE_AND_SOURCE = "spec.runtime.env[]: set value or valueFrom, not both"
MSG_ENV_SOURCE = (
    "spec.runtime.env[].valueFrom: set exactly one of secretKeyRef, configMapKeyRef, fieldRef and "
    "resourceFieldRef"
)
MSG_TOLERATION_KEY = "spec.scheduling.tolerations[]: a toleration without key needs operator Exists"
MSG_TOLERATION_VALUE = "spec.scheduling.tolerations[]: a toleration with operator Exists takes no value"
MSG_TOLERATION_SECONDS = "spec.scheduling.tolerations[]: tolerationSeconds needs effect NoExecute"
MSG_ROLLOUT_ZERO = (
    "spec.rollout: maxSurge and maxUnavailable cannot both be 0 (a rollout could then replace no pod)"
)
MSG_GPU_MEMORY = "spec.engine.gpuMemoryUtilization must be greater than 0 and at most 1"
MSG_BATCHED_TOKENS = (
    "spec.engine.maxNumBatchedTokens must be at least spec.engine.maxNumSeqs (a step carries at least one "
    "token of every sequence in it)"
)
MSG_CHAT_TEMPLATE = "spec.engine.chatTemplate: set exactly one of inline and configMap"
MSG_MIN_MAX = "spec.autoscaling.minReplicas must be less than or equal to spec.autoscaling.maxReplicas"
MSG_KV_TARGET = "spec.autoscaling.kvCacheUsage.targetRatio must be greater than 0 and at most 1"
MSG_TARGET_IN_FLIGHT = (
    "spec.autoscaling.targetInFlight is the target of metric InFlight (and metric SLO's until a profile "
    "measured one): do not set it with metric QueueDepth or together with targetQueueDepth"
)
MSG_AUTOSCALING_SLO = (
    "spec.autoscaling.metric SLO takes its target from the capacity profile of spec.slo: set spec.slo "
    "(ttftMs and interTokenMs), or choose metric InFlight"
)
MSG_TARGET_QUEUE_DEPTH = (
    "spec.autoscaling.targetQueueDepth is the target of metric QueueDepth: with metric InFlight set "
    "targetInFlight instead"
)
MSG_AUTOSCALING_METRICS = (
    "spec.autoscaling scales on the runtime's metrics in Prometheus, and nothing collects them: set "
    "spec.monitoring.serviceMonitor.enabled to true, or spec.autoscaling.metricsSource to External when "
    "Prometheus scrapes the pods another way"
)
MSG_SCALE_FROM_ZERO = (
    "spec.autoscaling.minReplicas 0 needs spec.routing: only the endpoint picker's queue can hold requests "
    "and ask for the first replica while none runs; set minReplicas to at least 1 or turn routing on"
)
MSG_TLS_ROUTING = (
    "spec.runtime.tls cannot be combined with spec.routing yet: the gateway's proxies and the endpoint "
    "picker call the pods over plain HTTP; terminate TLS at the Gateway instead, or leave spec.runtime.tls "
    "unset"
)
MSG_REPLICAS_XOR = "spec.replicas and spec.autoscaling are mutually exclusive: set one of them"
MSG_TENSOR_PARALLEL = "spec.engine.tensorParallelSize must equal spec.resources.gpu.count (no GPU left idle)"
MSG_NAME = "metadata.name must be a DNS-1035 label of at most 63 characters (it names the Service)"
MSG_RESTART_EVERY = (
    "spec.restartSchedule.every must be a duration from 1m to 720h in hours, minutes and seconds "
    "(e.g. 12h, 90m or 1h30m)"
)
MSG_RESTART_WINDOW = "spec.restartSchedule.window: start and end must differ"
MSG_WARM_WINDOW = "spec.autoscaling.schedule: a window's start and end must differ"
MSG_WARM_MIN = (
    "spec.autoscaling.schedule: a window's minReplicas must be at most spec.autoscaling.maxReplicas"
)
MSG_WARM_DAYS = "spec.autoscaling.schedule: a window's days must not repeat a day"
# A Go duration of whole hours, minutes and seconds, at least one of them (what CEL's duration() reads);
# the digit limits keep every value inside Go's duration range, so the rule below never fails to evaluate.
RESTART_EVERY_PATTERN = r"^([0-9]{1,4}h([0-9]{1,6}m)?([0-9]{1,8}s)?|[0-9]{1,6}m([0-9]{1,8}s)?|[0-9]{1,8}s)$"
RESTART_EVERY_MIN, RESTART_EVERY_MAX = "1m", "720h"
MSG_ADAPTER_URI = (
    "spec.lora.adapters[].uri must use a known scheme: hf://org/name, s3://bucket/path, pvc://claim/path or "
    "file:///path"
)
MSG_ADAPTER_REVISION = (
    "spec.lora.adapters[].revision is a hub revision (branch, tag or commit): it needs an hf:// uri"
)
MSG_LORA_CPU = "spec.lora.maxCpuLoras must be at least spec.lora.maxLoras"
MSG_LORA_ADAPTERS = (
    "spec.lora.adapters: more adapters than a replica holds (spec.lora.maxCpuLoras, which defaults to "
    "spec.lora.maxLoras)"
)
MSG_SLO_STREAMS = (
    "spec.slo.profile.streams must increase from step to step, each from 1 to 4096 (e.g. [1, 2, 4, 8, 16])"
)
MSG_ADAPTER_SERVED_NAME = (
    "spec.lora.adapters[].name must differ from the base model's served name: spec.model.servedName, or when "
    "it is unset the name the runtime derives from spec.model.uri (the repository id of hf://, the last part "
    f"of a file://, pvc:// or s3:// path, {IMAGE_MODEL_NAME} for oci://)"
)


def rule(
    expr: str, message: str, field_path: str | None = None, reason: str = "FieldValueInvalid"
) -> JsonDict:
    """One `x-kubernetes-validations` entry."""
    entry: JsonDict = {"rule": expr, "message": message, "reason": reason}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


MODEL_RULES = [
    rule(f"self.uri.matches('{MODEL_URI_PATTERN}')", MSG_URI, ".uri"),
    rule("!has(self.revision) || self.uri.startsWith('hf://')", MSG_MODEL_REVISION, ".revision"),
]
# A quantity of 0 written any way the quantity pattern allows (0, 0.0, .0Gi, 0e3, +0).
ZERO_QUANTITY_PATTERN = r"^[+]?0*([.]0*)?([KMGTPE]i|[numkMGTPE]|[eE][-+]?[0-9]+)?$"
CACHE_RULES = [
    rule("!(has(self.pvc) && has(self.size))", MSG_CACHE),
    rule("!has(self.storageClass) || has(self.size)", MSG_CACHE_STORAGE_CLASS, ".storageClass"),
    rule(
        "!has(self.scope) || self.scope != 'Node' || !(has(self.pvc) || has(self.storageClass))",
        MSG_CACHE_NODE,
        ".scope",
    ),
    rule(
        "!has(self.size) || (type(self.size) == int ? self.size > 0"
        f" : !self.size.matches('{ZERO_QUANTITY_PATTERN}'))",
        MSG_CACHE_SIZE,
        ".size",
    ),
]
ENGINE_RULES = [
    rule(
        "!has(self.gpuMemoryUtilization)"
        " || (self.gpuMemoryUtilization > 0.0 && self.gpuMemoryUtilization <= 1.0)",
        MSG_GPU_MEMORY,
        ".gpuMemoryUtilization",
    ),
    rule(
        f"!has(self.extraArgs) || self.extraArgs.all(a, !a.matches('{OWNED_FLAG_PATTERN}'))",
        MSG_EXTRA_ARGS,
        ".extraArgs",
    ),
    rule(
        "!has(self.maxNumBatchedTokens) || !has(self.maxNumSeqs)"
        " || self.maxNumBatchedTokens >= self.maxNumSeqs",
        MSG_BATCHED_TOKENS,
        ".maxNumBatchedTokens",
    ),
]
CHAT_TEMPLATE_RULES = [rule("has(self.inline) != has(self.configMap)", MSG_CHAT_TEMPLATE)]
AUTOSCALING_RULES = [
    rule("!has(self.minReplicas) || self.minReplicas <= self.maxReplicas", MSG_MIN_MAX, ".minReplicas"),
    rule(
        "!has(self.targetInFlight)"
        " || (has(self.metric) ? self.metric in ['InFlight', 'SLO'] : !has(self.targetQueueDepth))",
        MSG_TARGET_IN_FLIGHT,
        ".targetInFlight",
    ),
    rule(
        "!has(self.targetQueueDepth) || !has(self.metric) || self.metric == 'QueueDepth'",
        MSG_TARGET_QUEUE_DEPTH,
        ".targetQueueDepth",
    ),
    rule(
        "!has(self.schedule) || self.schedule.all(w, w.minReplicas <= self.maxReplicas)",
        MSG_WARM_MIN,
        ".schedule",
    ),
]
KV_TRIGGER_RULES = [
    rule("self.targetRatio > 0.0 && self.targetRatio <= 1.0", MSG_KV_TARGET, ".targetRatio"),
]
SPEC_RULES = [
    rule("!(has(self.replicas) && has(self.autoscaling))", MSG_REPLICAS_XOR, ".replicas"),
    rule(
        "!has(self.autoscaling) || !has(self.autoscaling.metric) || self.autoscaling.metric != 'SLO'"
        " || has(self.slo)",
        MSG_AUTOSCALING_SLO,
        ".autoscaling.metric",
    ),
    rule(
        "!has(self.engine) || !has(self.engine.tensorParallelSize)"
        " || self.engine.tensorParallelSize == self.resources.gpu.count",
        MSG_TENSOR_PARALLEL,
        ".engine.tensorParallelSize",
    ),
    # Defaults are not in the CRD, so an absent metricsSource or enabled means their defaults
    # (ServiceMonitor, false).
    rule(
        "!has(self.autoscaling)"
        " || (has(self.autoscaling.metricsSource) && self.autoscaling.metricsSource == 'External')"
        " || (has(self.monitoring) && has(self.monitoring.serviceMonitor)"
        " && has(self.monitoring.serviceMonitor.enabled) && self.monitoring.serviceMonitor.enabled)",
        MSG_AUTOSCALING_METRICS,
        ".autoscaling",
    ),
    rule(
        "!has(self.autoscaling) || !has(self.autoscaling.minReplicas) || self.autoscaling.minReplicas >= 1"
        " || has(self.routing)",
        MSG_SCALE_FROM_ZERO,
        ".autoscaling.minReplicas",
    ),
    rule(
        "!has(self.runtime) || !has(self.runtime.tls) || !has(self.routing)",
        MSG_TLS_ROUTING,
        ".runtime.tls",
    ),
    # The served name is worked out once, outside the adapters (`in` a list of their names), which keeps the
    # CEL cost estimate of the URI's split from growing with the number of adapters.
    rule(
        "!has(self.lora) || !has(self.lora.adapters) || !((has(self.model.servedName) ? self.model.servedName"
        f" : {default_served_name_cel('self.model.uri')}) in self.lora.adapters.map(a, a.name))",
        MSG_ADAPTER_SERVED_NAME,
        ".lora.adapters",
    ),
]


RESTART_SCHEDULE_RULES = [
    rule(
        f"!self.every.matches('{RESTART_EVERY_PATTERN}')"
        f" || (duration(self.every) >= duration('{RESTART_EVERY_MIN}')"
        f" && duration(self.every) <= duration('{RESTART_EVERY_MAX}'))",
        MSG_RESTART_EVERY,
        ".every",
    )
]
ADAPTER_RULES = [
    rule(f"self.uri.matches('{URI_PATTERN}')", MSG_ADAPTER_URI, ".uri"),
    rule("!has(self.revision) || self.uri.startsWith('hf://')", MSG_ADAPTER_REVISION, ".revision"),
]
# Defaults are not in the CRD: an absent maxLoras is 1, an absent maxCpuLoras is maxLoras.
_MAX_LORAS = "(has(self.maxLoras) ? self.maxLoras : 1)"
LORA_RULES = [
    rule(f"!has(self.maxCpuLoras) || self.maxCpuLoras >= {_MAX_LORAS}", MSG_LORA_CPU, ".maxCpuLoras"),
    rule(
        "!has(self.adapters)"
        f" || size(self.adapters) <= (has(self.maxCpuLoras) ? self.maxCpuLoras : {_MAX_LORAS})",
        MSG_LORA_ADAPTERS,
        ".adapters",
    ),
]
RESTART_WINDOW_RULES = [rule("self.start != self.end", MSG_RESTART_WINDOW, ".end")]
WARM_WINDOW_RULES = [rule("self.start != self.end", MSG_WARM_WINDOW, ".end")]


def _zero(field: str) -> str:
    """CEL: the int-or-string `field` is 0 or 0%."""
    return f"(type(self.{field}) == int ? self.{field} == 0 : self.{field}.matches('^0+%$'))"


# The API server's own checks of a pod's toleration, at the InferenceService's admission instead of the
# Deployment's (which the user would see only in the operator's status).
TOLERATION_RULES = [
    rule(
        "has(self.key) || (has(self.operator) && self.operator == 'Exists')", MSG_TOLERATION_KEY, ".operator"
    ),
    rule(
        "!(has(self.operator) && self.operator == 'Exists' && has(self.value))",
        MSG_TOLERATION_VALUE,
        ".value",
    ),
    rule(
        "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
        MSG_TOLERATION_SECONDS,
        ".tolerationSeconds",
    ),
]

# Defaults are not in the CRD: an absent maxSurge is 1, an absent maxUnavailable is 0 (RolloutSpec).
ROLLOUT_RULES = [
    rule(
        f"!(has(self.maxSurge) && {_zero('maxSurge')}"
        f" && (!has(self.maxUnavailable) || {_zero('maxUnavailable')}))",
        MSG_ROLLOUT_ZERO,
        ".maxSurge",
    )
]


def validations(rules: list[JsonDict]) -> JsonDict:
    """A model's json_schema_extra carrying its CEL rules."""
    return {"x-kubernetes-validations": [*rules]}


# Each step more than the one before, written out for the 12 steps a profile may have: core CEL only (the
# lists library's isSorted() is the API server's, not every CEL evaluator's).
SLO_MAX_STEPS = 12
SLO_PROFILE_RULES = [
    rule(
        "!has(self.streams) || ("
        + " && ".join(
            f"(size(self.streams) <= {i} || self.streams[{i}] > self.streams[{i - 1}])"
            for i in range(1, SLO_MAX_STEPS)
        )
        + ")",
        MSG_SLO_STREAMS,
        ".streams",
    )
]
ENV_RULES = [
    rule(
        "!has(self.value) || !(self.name in [" + ", ".join(f"'{n}'" for n in SECRET_ENV_NAMES) + "])",
        MSG_SECRET_ENV,
        ".value",
    ),
    rule("!(has(self.value) && has(self.valueFrom))", MSG_ENV_VALUE_AND_SOURCE, ".valueFrom"),
    *(rule(f"self.name != '{name}'", message, ".name") for name, message in REFUSED_ENV_NAMES.items()),
]
_ENV_SOURCES = ("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef")
ENV_SOURCE_RULES = [
    rule(" + ".join(f"(has(self.{s}) ? 1 : 0)" for s in _ENV_SOURCES) + " == 1", MSG_ENV_SOURCE),
]
ROOT_RULES = [
    rule(
        "size(self.metadata.name) <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        MSG_NAME,
    )
]
