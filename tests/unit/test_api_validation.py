"""Invalid specs: pydantic names the field, and the CRD's CEL rules reject the same objects with the same
message (so the operator reports exactly what admission would have said)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from pagoda.operator.api import InferenceServiceSpec, describe, error_messages
from pagoda.operator.api import rules as r
from pagoda.operator.api.base import NAME_PATTERN

Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutation:
    def mutate(spec: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node = spec
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value

    return mutate


def _drop(path: str) -> Mutation:
    def mutate(spec: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node = spec
        for key in parents:
            node = node[key]
        del node[leaf]

    return mutate


def _both(*mutations: Mutation) -> Mutation:
    def mutate(spec: dict[str, Any]) -> None:
        for mutation in mutations:
            mutation(spec)

    return mutate


# (id, mutation, the field path the error must name, the CEL message when a CEL rule mirrors it)
CASES: list[tuple[str, Mutation, str, str | None]] = [
    ("unknown-scheme", _set("model.uri", "gs://bucket/model"), "spec.model.uri", r.MSG_URI),
    (
        "revision-without-hf",
        _both(_set("model.uri", "s3://bucket/llama"), _set("model.revision", "main")),
        "spec.model",
        r.MSG_MODEL_REVISION,
    ),
    ("hf-without-name", _set("model.uri", "hf://"), "spec.model.uri", r.MSG_URI),
    ("file-relative", _set("model.uri", "file://models/tiny"), "spec.model.uri", r.MSG_URI),
    ("s3-without-key", _set("model.uri", "s3://bucket"), "spec.model.uri", r.MSG_URI),
    ("s3-dot-dot", _set("model.uri", "s3://bucket/models/../../etc"), "spec.model.uri", r.MSG_URI),
    ("s3-empty-part", _set("model.uri", "s3://bucket//tmp/x"), "spec.model.uri", r.MSG_URI),
    ("s3-dot", _set("model.uri", "s3://bucket/a/./b"), "spec.model.uri", r.MSG_URI),
    (
        "min-above-max",
        _set("autoscaling", {"minReplicas": 5, "maxReplicas": 2}),
        "spec.autoscaling.minReplicas",
        r.MSG_MIN_MAX,
    ),
    (
        "tp-not-gpu-count",
        _set("engine.tensorParallelSize", 2),
        "spec.engine.tensorParallelSize",
        r.MSG_TENSOR_PARALLEL,
    ),
    (
        "gpu-mem-zero",
        _set("engine.gpuMemoryUtilization", 0),
        "spec.engine.gpuMemoryUtilization",
        r.MSG_GPU_MEMORY,
    ),
    (
        "gpu-mem-above-one",
        _set("engine.gpuMemoryUtilization", 1.5),
        "spec.engine.gpuMemoryUtilization",
        r.MSG_GPU_MEMORY,
    ),
    (
        "batched-tokens-below-seqs",
        _both(_set("engine.maxNumSeqs", 64), _set("engine.maxNumBatchedTokens", 32)),
        "spec.engine.maxNumBatchedTokens",
        r.MSG_BATCHED_TOKENS,
    ),
    ("replicas-and-autoscaling", _set("replicas", 2), "spec.replicas", r.MSG_REPLICAS_XOR),
    (
        "cache-pvc-and-size",
        _set("model.cache", {"pvc": "cache", "size": "100Gi"}),
        "spec.model.cache",
        r.MSG_CACHE,
    ),
    (
        "cache-class-without-size",
        _set("model.cache", {"storageClass": "fast"}),
        "spec.model.cache.storageClass",
        r.MSG_CACHE_STORAGE_CLASS,
    ),
    (
        "oci-without-repository",
        _set("model.uri", "oci://registry.example"),
        "spec.model.uri",
        r.MSG_URI,
    ),
    (
        "oci-adapter",  # an adapter comes to a running pod, which cannot mount a new image volume
        _set("lora", {"adapters": [{"name": "sql", "uri": "oci://registry.example/adapters/sql:1"}]}),
        "spec.lora.adapters[].uri",
        r.MSG_ADAPTER_URI,
    ),
    (
        "cache-node-with-pvc",
        _set("model.cache", {"scope": "Node", "pvc": "shared"}),
        "spec.model.cache.scope",
        r.MSG_CACHE_NODE,
    ),
    (
        "cache-node-with-storage-class",
        _set("model.cache", {"scope": "Node", "size": "10Gi", "storageClass": "fast"}),
        "spec.model.cache.scope",
        r.MSG_CACHE_NODE,
    ),
    (
        "kv-ratio-above-one",
        _set("autoscaling.kvCacheUsage", {"targetRatio": 1.2}),
        "spec.autoscaling.kvCacheUsage.targetRatio",
        r.MSG_KV_TARGET,
    ),
    (
        "in-flight-target-with-queue-depth-metric",
        _set("autoscaling", {"maxReplicas": 2, "metric": "QueueDepth", "targetInFlight": 8}),
        "spec.autoscaling.targetInFlight",
        r.MSG_TARGET_IN_FLIGHT,
    ),
    (
        "both-targets-without-metric",
        _set("autoscaling", {"maxReplicas": 2, "targetInFlight": 8, "targetQueueDepth": 2}),
        "spec.autoscaling.targetInFlight",
        r.MSG_TARGET_IN_FLIGHT,
    ),
    (
        "queue-depth-target-with-in-flight-metric",
        _set("autoscaling", {"maxReplicas": 2, "metric": "InFlight", "targetQueueDepth": 2}),
        "spec.autoscaling.targetQueueDepth",
        r.MSG_TARGET_QUEUE_DEPTH,
    ),
    (
        "autoscaling-without-service-monitor",
        _drop("monitoring"),
        "spec.autoscaling",
        r.MSG_AUTOSCALING_METRICS,
    ),
    (
        "autoscaling-with-service-monitor-off",
        _set("monitoring.serviceMonitor.enabled", False),
        "spec.autoscaling",
        r.MSG_AUTOSCALING_METRICS,
    ),
    (
        "autoscaling-service-monitor-source-explicit",
        _both(_drop("monitoring"), _set("autoscaling.metricsSource", "ServiceMonitor")),
        "spec.autoscaling",
        r.MSG_AUTOSCALING_METRICS,
    ),
    (
        "literal-token-in-env",
        _set("runtime", {"env": [{"name": "HF_TOKEN", "value": "hf_abc"}]}),
        "spec.runtime.env",
        r.MSG_SECRET_ENV,
    ),
    (
        "vllm-dev-mode-in-env",
        _set("runtime", {"env": [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}]}),
        "spec.runtime.env",
        r.MSG_ENV_DEV_MODE,
    ),
    (
        "vllm-dev-mode-off-in-env",  # refused whatever its value: the name alone is the switch's
        _set(
            "runtime",
            {"env": [{"name": "LOG", "value": "1"}, {"name": "VLLM_SERVER_DEV_MODE", "value": "0"}]},
        ),
        "spec.runtime.env",
        r.MSG_ENV_DEV_MODE,
    ),
    (
        "vllm-runtime-lora-updating-in-env",
        _set("runtime", {"env": [{"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"}]}),
        "spec.runtime.env",
        r.MSG_ENV_LORA_UPDATING,
    ),
    (
        "vllm-runtime-lora-updating-from-a-config-map",
        _set(
            "runtime",
            {
                "env": [
                    {
                        "name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
                        "valueFrom": {"configMapKeyRef": {"name": "flags", "key": "lora"}},
                    }
                ]
            },
        ),
        "spec.runtime.env",
        r.MSG_ENV_LORA_UPDATING,
    ),
    (
        "pod-namespace-in-env",  # it chose which namespace's node cache folder a pod mounted (issue #40 §5)
        _set(
            "runtime",
            {"env": [{"name": "POD_NAMESPACE", "value": "team-b"}]},
        ),
        "spec.runtime.env",
        r.REFUSED_ENV_NAMES["POD_NAMESPACE"],
    ),
    (
        "pod-uid-in-env-from-the-downward-api",  # refused from any source: the name is the operator's
        _set(
            "runtime",
            {"env": [{"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
        ),
        "spec.runtime.env",
        r.REFUSED_ENV_NAMES["POD_UID"],
    ),
    (
        "pull-secret-not-a-name",
        _set("runtime.imagePullSecrets", [{"name": "Reg_Cred"}]),
        "spec.runtime.imagePullSecrets[0].name",
        None,
    ),
    (
        "pull-secret-without-name",
        _set("runtime.imagePullSecrets", [{}]),
        "spec.runtime.imagePullSecrets[0].name",
        None,
    ),
    (
        "pull-secret-as-a-string",  # a list of {name}, as a pod's imagePullSecrets
        _set("runtime.imagePullSecrets", ["regcred"]),
        "spec.runtime.imagePullSecrets[0]",
        None,
    ),
    (
        "pull-secrets-repeat",
        _set("runtime.imagePullSecrets", [{"name": "regcred"}, {"name": "regcred"}]),
        "spec.runtime.imagePullSecrets",
        None,
    ),
    (
        "pull-secrets-too-many",
        _set("runtime.imagePullSecrets", [{"name": f"pull-{i}"} for i in range(17)]),
        "spec.runtime.imagePullSecrets",
        None,
    ),
    (
        "body-limit-too-small",
        _set("runtime.maxRequestBodyBytes", 1023),
        "spec.runtime.maxRequestBodyBytes",
        None,
    ),
    (
        "body-limit-above-1-gib",
        _set("runtime.maxRequestBodyBytes", 1024**3 + 1),
        "spec.runtime.maxRequestBodyBytes",
        None,
    ),
    (
        "body-limit-as-a-quantity",  # bytes as an integer, not a Kubernetes quantity
        _set("runtime.maxRequestBodyBytes", "64Mi"),
        "spec.runtime.maxRequestBodyBytes",
        None,
    ),
    (
        "label-value-invalid",
        _set("scheduling", {"nodeSelector": {"pool": "a b"}}),
        "spec.scheduling.nodeSelector.pool",
        None,
    ),
    (
        "scrape-interval-garbage",
        _set("monitoring", {"serviceMonitor": {"interval": "30s1m"}}),
        "spec.monitoring.serviceMonitor.interval",
        None,
    ),
    ("quantization-unknown", _set("engine.quantization", "int4"), "spec.engine.quantization", None),
    ("dtype-unknown", _set("engine.dtype", "float64"), "spec.engine.dtype", None),
    (
        "gpu-count-zero",
        _both(_set("resources.gpu.count", 0), _drop("engine.tensorParallelSize")),
        "spec.resources.gpu.count",
        None,
    ),
    ("model-missing", _drop("model"), "spec.model", None),
    ("resources-missing", _drop("resources"), "spec.resources", None),
    (
        "secret-name-invalid",
        _set("model.credentialsSecret", "HF_Token"),
        "spec.model.credentialsSecret",
        None,
    ),
    ("token-in-spec", _set("model.token", "hf_abc"), "spec.model.token", None),
    ("memory-not-quantity", _set("resources.memory", "lots"), "spec.resources.memory", None),
    ("block-size-odd", _set("engine.blockSize", 17), "spec.engine.blockSize", None),
    ("service-type-unknown", _set("service.type", "Ingress"), "spec.service.type", None),
    ("max-surge-garbage", _set("rollout.maxSurge", "half"), "spec.rollout.maxSurge", None),
    (
        "extra-arg-owned-flag",
        _set("engine.extraArgs", ["--enforce-eager", "--port=9000"]),
        "spec.engine.extraArgs",
        r.MSG_EXTRA_ARGS,
    ),
    (
        "extra-arg-owned-flag-underscore",
        _set("engine.extraArgs", ["--served_model_name", "other"]),
        "spec.engine.extraArgs",
        r.MSG_EXTRA_ARGS,
    ),
    (
        "extra-arg-owned-flag-underscore-with-value",
        _set("engine.extraArgs", ["--api_key=secret"]),
        "spec.engine.extraArgs",
        r.MSG_EXTRA_ARGS,
    ),
    ("max-model-len-tiny", _set("engine.maxModelLen", 8), "spec.engine.maxModelLen", None),
    ("s3-bucket-too-short", _set("model.uri", "s3://ab/model"), "spec.model.uri", r.MSG_URI),
    ("pvc-claim-uppercase", _set("model.uri", "pvc://Models/llama"), "spec.model.uri", r.MSG_URI),
    ("extra-arg-too-long", _set("engine.extraArgs", ["x" * 1025]), "spec.engine.extraArgs[0]", None),
    ("typo-field", _set("replica", 2), "spec.replica", None),
    (
        "min-replicas-zero-without-routing",
        _set("autoscaling.minReplicas", 0),
        "spec.autoscaling.minReplicas",
        r.MSG_SCALE_FROM_ZERO,
    ),
    ("min-replicas-negative", _set("autoscaling.minReplicas", -1), "spec.autoscaling.minReplicas", None),
    (
        "picker-queue-timeout-zero",
        _set("routing", {"endpointPicker": {"queueTimeoutSeconds": 0}}),
        "spec.routing.endpointPicker.queueTimeoutSeconds",
        None,
    ),
    (
        "picker-failure-mode-unknown",
        _set("routing", {"endpointPicker": {"failureMode": "Retry"}}),
        "spec.routing.endpointPicker.failureMode",
        None,
    ),
    ("gateway-without-name", _set("routing", {"gateway": {}}), "spec.routing.gateway.name", None),
    ("drain-negative", _set("runtime.drainTimeoutSeconds", -1), "spec.runtime.drainTimeoutSeconds", None),
    ("metric-unknown", _set("autoscaling.metric", "Latency"), "spec.autoscaling.metric", None),
    (
        "metrics-source-unknown",
        _set("autoscaling.metricsSource", "PodMonitor"),
        "spec.autoscaling.metricsSource",
        None,
    ),
    ("in-flight-target-zero", _set("autoscaling.targetInFlight", 0), "spec.autoscaling.targetInFlight", None),
    ("cost-price-zero", _set("cost", {"gpuHourPrice": 0}), "spec.cost.gpuHourPrice", None),
    ("cost-price-missing", _set("cost", {"apiPricePerMillionTokens": 0.6}), "spec.cost.gpuHourPrice", None),
    (
        "cost-api-price-negative",
        _set("cost", {"gpuHourPrice": 2.5, "apiPricePerMillionTokens": -0.6}),
        "spec.cost.apiPricePerMillionTokens",
        None,
    ),
    (
        "cost-currency-not-iso",
        _set("cost", {"gpuHourPrice": 2.5, "currency": "usd"}),
        "spec.cost.currency",
        None,
    ),
    ("cost-price-not-number", _set("cost", {"gpuHourPrice": "cheap"}), "spec.cost.gpuHourPrice", None),
    (
        "adapter-named-like-the-model",
        _set("lora.adapters", [{"name": "llama-3.1-70b", "uri": "hf://org/sql-lora"}]),
        "spec.lora.adapters",
        r.MSG_ADAPTER_SERVED_NAME,
    ),
    (
        "adapters-more-than-held",
        _set(
            "lora",
            {"maxLoras": 1, "adapters": [{"name": "a", "uri": "hf://o/a"}, {"name": "b", "uri": "hf://o/b"}]},
        ),
        "spec.lora",
        r.MSG_LORA_ADAPTERS,
    ),
    (
        "adapters-cpu-below-gpu",
        _set("lora", {"maxLoras": 2, "maxCpuLoras": 1}),
        "spec.lora",
        r.MSG_LORA_CPU,
    ),
    (
        "adapter-unknown-scheme",
        _set("lora.adapters", [{"name": "sql", "uri": "gs://bucket/sql"}]),
        "spec.lora.adapters",
        r.MSG_ADAPTER_URI,
    ),
    ("adapter-rank-not-vllm", _set("lora.maxLoraRank", 48), "spec.lora.maxLoraRank", None),
    (
        "adapter-name-dash-first",
        _set("lora.adapters", [{"name": "-sql", "uri": "hf://o/a"}]),
        "spec.lora.adapters[0].name",
        None,
    ),
    (
        "adapter-name-too-long",
        _set("lora.adapters", [{"name": "a" * 64, "uri": "hf://o/a"}]),
        "spec.lora.adapters[0].name",
        None,
    ),
    (
        "adapter-names-repeat",
        _set("lora.adapters", [{"name": "a", "uri": "hf://o/a"}, {"name": "a", "uri": "hf://o/b"}]),
        "spec.lora",
        None,
    ),
    (
        "chat-template-does-not-compile",
        _set("engine.chatTemplate", {"inline": "{% for m in messages %}\n{{ m.content }\n{% endfor %}"}),
        "spec.engine.chatTemplate.inline: the Jinja template does not compile: line 2: unexpected '}'",
        None,
    ),
    (
        "chat-template-unknown-filter",
        _set("engine.chatTemplate", {"inline": "{{ messages | shout }}"}),
        "spec.engine.chatTemplate.inline: the Jinja template does not compile: line 1: No filter named",
        None,
    ),
    (
        "chat-template-inline-and-config-map",
        _set("engine.chatTemplate", {"inline": "{{ x }}", "configMap": {"name": "t", "key": "t.jinja"}}),
        "spec.engine.chatTemplate",
        r.MSG_CHAT_TEMPLATE,
    ),
    ("chat-template-empty", _set("engine.chatTemplate", {}), "spec.engine.chatTemplate", r.MSG_CHAT_TEMPLATE),
    (
        "chat-template-key-not-a-key",
        _set("engine.chatTemplate", {"configMap": {"name": "t", "key": "../t.jinja/"}}),
        "spec.engine.chatTemplate.configMap.key",
        None,
    ),
    (
        "chat-template-config-map-without-key",
        _set("engine.chatTemplate", {"configMap": {"name": "t"}}),
        "spec.engine.chatTemplate.configMap.key",
        None,
    ),
    (
        "toleration-without-key-or-exists",  # found by tests/integration/test_admission_properties.py
        _set("scheduling.tolerations", [{"effect": "NoSchedule"}]),
        "spec.scheduling.tolerations",
        r.MSG_TOLERATION_KEY,
    ),
    (
        "toleration-seconds-without-no-execute",
        _set("scheduling.tolerations", [{"key": "k", "operator": "Exists", "tolerationSeconds": 5}]),
        "spec.scheduling.tolerations",
        r.MSG_TOLERATION_SECONDS,
    ),
    (
        "cache-size-zero",  # found by tests/integration/test_admission_properties.py
        _set("model.cache", {"size": "0.0Gi", "storageClass": "fast"}),
        "spec.model.cache",
        r.MSG_CACHE_SIZE,
    ),
    (
        "rollout-that-replaces-no-pod",  # found by tests/integration/test_admission_properties.py
        _set("rollout", {"maxSurge": "0%", "maxUnavailable": 0}),
        "spec.rollout",
        r.MSG_ROLLOUT_ZERO,
    ),
    (
        "gateway-namespace-not-a-name",  # found by tests/integration/test_admission_properties.py
        _set("routing", {"gateway": {"name": "inference", "namespace": "Gateways"}}),
        "spec.routing.gateway.namespace",
        None,
    ),
    (
        "negative-cpu",  # found by tests/integration/test_admission_properties.py
        _set("resources.cpu", "-1"),
        "spec.resources.cpu",
        None,
    ),
    (
        "pdb-count-as-string",  # found by tests/integration/test_admission_properties.py
        _set("disruption.maxUnavailable", "2"),
        "spec.disruption.maxUnavailable",
        None,
    ),
    (
        "gpu-resource-name-without-domain",  # found by tests/integration/test_admission_properties.py
        _set("resources.gpu.resourceName", "gpu"),
        "spec.resources.gpu.resourceName",
        None,
    ),
    (
        "network-policy-namespace-not-a-name",
        _set("networkPolicy.allowFrom", [{"namespace": "Team_B"}]),
        "spec.networkPolicy.allowFrom[0].namespace",
        None,
    ),
    (
        "network-policy-unknown-field",
        _set("networkPolicy.allowFrom", [{"namespaces": ["team-b"]}]),
        "spec.networkPolicy.allowFrom[0]",
        None,
    ),
    (
        "slo-streams-not-increasing",
        _set("slo.profile.streams", [1, 4, 2]),
        "spec.slo.profile",
        r.MSG_SLO_STREAMS,
    ),
    ("slo-stream-zero", _set("slo.profile.streams", [0, 1]), "spec.slo.profile.streams[0]", None),
    ("slo-ttft-zero", _set("slo.ttftMs", 0), "spec.slo.ttftMs", None),
    ("slo-without-inter-token", _set("slo", {"ttftMs": 500}), "spec.slo.interTokenMs", None),
    ("slo-step-too-short", _set("slo.profile.stepSeconds", 1), "spec.slo.profile.stepSeconds", None),
    ("slo-prompt-empty", _set("slo.request.promptTokens", 0), "spec.slo.request.promptTokens", None),
    (
        "autoscaling-slo-without-slo",
        _set("autoscaling", {"maxReplicas": 4, "metric": "SLO"}),
        "spec",
        r.MSG_AUTOSCALING_SLO,
    ),
    (
        "slo-target-ratio-zero",
        _set("autoscaling", {"maxReplicas": 4, "metric": "SLO", "sloTargetRatio": 0}),
        "spec.autoscaling.sloTargetRatio",
        None,
    ),
    (
        "prometheus-not-url",
        _set("autoscaling.prometheusAddress", "prometheus:9090"),
        "spec.autoscaling.prometheusAddress",
        None,
    ),
]


@pytest.mark.parametrize(
    ("mutate", "field", "cel_message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_invalid_spec_names_the_field(
    llama_spec: dict[str, Any], mutate: Mutation, field: str, cel_message: str | None
) -> None:
    mutate(llama_spec)
    with pytest.raises(ValidationError) as caught:
        InferenceServiceSpec.model_validate(llama_spec)
    messages = error_messages(caught.value)
    assert any(message.startswith(field) for message in messages), messages
    if cel_message is not None:
        assert cel_message in messages
        assert field.split("[")[0] in cel_message or cel_message.startswith(field)


@pytest.mark.parametrize(
    ("mutate", "cel_message"), [(c[1], c[3]) for c in CASES if c[3]], ids=[c[0] for c in CASES if c[3]]
)
def test_cel_rule_rejects_the_same_object_with_the_same_message(
    llama_spec: dict[str, Any],
    mutate: Mutation,
    cel_message: str,
    cel_check: Callable[[dict[str, Any]], list[str]],
) -> None:
    mutate(llama_spec)
    violations = cel_check(_object("llama", llama_spec))
    assert violations == [cel_message]


def test_valid_examples_pass_every_cel_rule(
    example: dict[str, Any], cel_check: Callable[[dict[str, Any]], list[str]]
) -> None:
    assert cel_check(example) == []


@pytest.mark.parametrize("name", ["Llama", "1-llama", "llama_3", "x" * 64, "llama."])
def test_cel_rejects_names_that_cannot_name_a_service(
    llama_spec: dict[str, Any], name: str, cel_check: Callable[[dict[str, Any]], list[str]]
) -> None:
    assert cel_check(_object(name, llama_spec)) == [r.MSG_NAME]


def test_cel_accepts_a_63_character_name(
    llama_spec: dict[str, Any], cel_check: Callable[[dict[str, Any]], list[str]]
) -> None:
    assert cel_check(_object("a" * 63, llama_spec)) == []


def test_tensor_parallel_may_be_omitted_and_follows_the_gpu_count(
    llama_spec: dict[str, Any], cel_check: Callable[[dict[str, Any]], list[str]]
) -> None:
    del llama_spec["engine"]["tensorParallelSize"]
    assert InferenceServiceSpec.model_validate(llama_spec).tensor_parallel_size == 4
    assert cel_check(_object("llama", llama_spec)) == []


@pytest.mark.parametrize("name", sorted(r.OPERATOR_ENV))
def test_every_variable_the_operator_sets_is_refused_in_the_env_naming_it(
    llama_spec: dict[str, Any], name: str, cel_check: Callable[[dict[str, Any]], list[str]]
) -> None:
    """Whatever its source: a ConfigMap's value is as much the user's as a literal one."""
    source = {"configMapKeyRef": {"name": "settings", "key": "value"}}
    llama_spec["runtime"] = {"env": [{"name": "LOG", "value": "1"}, {"name": name, "valueFrom": source}]}
    with pytest.raises(ValidationError) as caught:
        InferenceServiceSpec.model_validate(llama_spec)
    message = f"spec.runtime.env: {name} is not allowed: "
    assert any(m.startswith("spec.runtime.env") and message in m for m in error_messages(caught.value))
    assert cel_check(_object("llama", llama_spec)) == [r.REFUSED_ENV_NAMES[name]]
    assert r.REFUSED_ENV_NAMES[name].startswith(message)


def test_secret_env_from_a_secret_is_allowed(
    llama_spec: dict[str, Any], cel_check: Callable[[dict[str, Any]], list[str]]
) -> None:
    ref = {"secretKeyRef": {"name": "hf", "key": "token"}}
    llama_spec["runtime"] = {"env": [{"name": "HF_TOKEN", "valueFrom": ref}, {"name": "LOG", "value": "1"}]}
    InferenceServiceSpec.model_validate(llama_spec)
    assert cel_check(_object("llama", llama_spec)) == []


def test_gpu_memory_utilization_of_exactly_one_is_allowed(
    llama_spec: dict[str, Any], cel_check: Callable[[dict[str, Any]], list[str]]
) -> None:
    llama_spec["engine"]["gpuMemoryUtilization"] = 1
    assert InferenceServiceSpec.model_validate(llama_spec).engine.gpu_memory_utilization == 1.0
    assert cel_check(_object("llama", llama_spec)) == []


@pytest.mark.parametrize(
    "autoscaling",
    [
        {"maxReplicas": 2},
        {"maxReplicas": 2, "metric": "InFlight", "targetInFlight": 8},
        {"maxReplicas": 2, "targetInFlight": 8},
        {"maxReplicas": 2, "metric": "QueueDepth", "targetQueueDepth": 2},
        {"maxReplicas": 2, "targetQueueDepth": 2},
        {"maxReplicas": 2, "metric": "QueueDepth"},
    ],
)
def test_each_metric_with_its_own_target_is_allowed(
    llama_spec: dict[str, Any], autoscaling: dict[str, Any], cel_check: Callable[[dict[str, Any]], list[str]]
) -> None:
    llama_spec["autoscaling"] = autoscaling
    InferenceServiceSpec.model_validate(llama_spec)
    assert cel_check(_object("llama", llama_spec)) == []


def test_autoscaling_on_external_metrics_needs_no_service_monitor(
    llama_spec: dict[str, Any], cel_check: Callable[[dict[str, Any]], list[str]]
) -> None:
    """The opt-out: Prometheus scrapes the pods another way (a PodMonitor, annotations)."""
    del llama_spec["monitoring"]
    llama_spec["autoscaling"]["metricsSource"] = "External"
    spec = InferenceServiceSpec.model_validate(llama_spec)
    assert spec.autoscaling is not None and spec.autoscaling.metrics_source == "External"
    assert cel_check(_object("llama", llama_spec)) == []


def test_fixed_replicas_need_no_metrics(
    llama_spec: dict[str, Any], cel_check: Callable[[dict[str, Any]], list[str]]
) -> None:
    del llama_spec["autoscaling"], llama_spec["monitoring"]
    llama_spec["replicas"] = 2
    InferenceServiceSpec.model_validate(llama_spec)
    assert cel_check(_object("llama", llama_spec)) == []


def test_describe_joins_every_error_on_one_line(llama_spec: dict[str, Any]) -> None:
    llama_spec["model"]["uri"] = "gs://x/y"
    llama_spec["engine"]["dtype"] = "float64"
    with pytest.raises(ValidationError) as caught:
        InferenceServiceSpec.model_validate(llama_spec)
    text = describe(caught.value)
    assert r.MSG_URI in text and "spec.engine.dtype: Input should be" in text and "\n" not in text


def _object(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": "llm"},
        "spec": copy.deepcopy(spec),
    }


def test_cost_is_optional_and_currency_defaults_to_usd(
    llama_spec: dict[str, Any], cel_check: Callable[[dict[str, Any]], list[str]]
) -> None:
    assert InferenceServiceSpec.model_validate(llama_spec).cost is None
    llama_spec["cost"] = {"gpuHourPrice": 2}  # an integer is a number too
    cost = InferenceServiceSpec.model_validate(llama_spec).cost
    assert cost is not None and (cost.gpu_hour_price, cost.api_price_per_million_tokens) == (2.0, None)
    assert cost.currency == "USD"
    assert cel_check(_object("llama", llama_spec)) == []


def test_cost_prices_must_be_positive_in_the_crd_schema(crd_root_schema: dict[str, Any]) -> None:
    """The API server rejects 0 and negative prices itself (exclusiveMinimum), naming the field."""
    cost = crd_root_schema["properties"]["spec"]["properties"]["cost"]
    assert cost["required"] == ["gpuHourPrice"]
    for name in ("gpuHourPrice", "apiPricePerMillionTokens"):
        field = cost["properties"][name]
        assert (field["type"], field["minimum"], field["exclusiveMinimum"]) == ("number", 0, True)


def test_pull_secrets_and_the_body_limit_pass_and_are_bounded_in_the_crd_schema(
    llama_spec: dict[str, Any],
    crd_root_schema: dict[str, Any],
    cel_check: Callable[[dict[str, Any]], list[str]],
) -> None:
    """The API server refuses what pydantic refuses: a Secret name's pattern, at most 16 secrets, each once
    (a list map keyed by name), and a body limit from 1 KiB to 1 GiB."""
    llama_spec["runtime"] = {
        "imagePullSecrets": [{"name": "regcred"}, {"name": "models.pull"}],
        "maxRequestBodyBytes": 64 * 1024**2,
    }
    runtime = InferenceServiceSpec.model_validate(llama_spec).runtime
    assert [secret.name for secret in runtime.image_pull_secrets] == ["regcred", "models.pull"]
    assert runtime.max_request_body_bytes == 64 * 1024**2
    assert cel_check(_object("llama", llama_spec)) == []
    fields = crd_root_schema["properties"]["spec"]["properties"]["runtime"]["properties"]
    secrets = fields["imagePullSecrets"]
    assert (secrets["maxItems"], secrets["x-kubernetes-list-type"]) == (16, "map")
    assert secrets["x-kubernetes-list-map-keys"] == ["name"]
    name = secrets["items"]["properties"]["name"]
    assert secrets["items"]["required"] == ["name"]
    assert (name["maxLength"], name["pattern"]) == (253, NAME_PATTERN)
    limit = fields["maxRequestBodyBytes"]
    assert (limit["type"], limit["minimum"], limit["maximum"]) == ("integer", 1024, 1024**3)


def test_chat_templates_inline_or_from_a_config_map_pass(
    llama_spec: dict[str, Any], cel_check: Callable[[dict[str, Any]], list[str]]
) -> None:
    for template in (
        {"inline": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"},
        {"configMap": {"name": "chat-templates", "key": "llama-3.1.jinja"}},
    ):
        llama_spec["engine"]["chatTemplate"] = template
        InferenceServiceSpec.model_validate(llama_spec)
        assert cel_check(_object("llama", llama_spec)) == []
