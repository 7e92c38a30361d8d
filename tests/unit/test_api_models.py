"""The pydantic models: the user shape of issue #2, defaults, aliases, the examples."""

from __future__ import annotations

from typing import Any

import pytest

from pagoda.operator.api import GROUP, KIND, PLURAL, SHORT_NAMES, VERSION, InferenceServiceSpec


def test_identity_constants() -> None:
    assert (GROUP, VERSION, KIND) == ("pagoda.dev", "v1alpha1", "InferenceService")
    assert PLURAL == "inferenceservices"
    assert "isvc" not in SHORT_NAMES and SHORT_NAMES


def test_user_shape_parses_with_camel_case(llama_spec: dict[str, Any]) -> None:
    spec = InferenceServiceSpec.model_validate(llama_spec)
    assert spec.model.served_name == "llama-3.1-70b"
    assert spec.model.credentials_secret == "hf-token"
    assert spec.engine.tensor_parallel_size == 4
    assert spec.engine.gpu_memory_utilization == pytest.approx(0.92)
    assert spec.resources.gpu.product == "NVIDIA-H100-80GB-HBM3"
    assert spec.autoscaling is not None and spec.autoscaling.max_replicas == 4


def test_defaults_match_the_issue() -> None:
    minimal = {"model": {"uri": "hf://gpt2"}, "resources": {"gpu": {"count": 1}}}
    spec = InferenceServiceSpec.model_validate(minimal)
    assert spec.engine.gpu_memory_utilization == pytest.approx(0.90)
    assert spec.engine.block_size == 16
    assert spec.engine.enable_prefix_caching is True
    assert spec.engine.quantization == "none"
    assert spec.resources.gpu.resource_name == "nvidia.com/gpu"
    assert spec.disruption.max_unavailable == 1
    assert spec.service.port == 8000 and spec.service.type == "ClusterIP"
    assert spec.monitoring.service_monitor.enabled is False
    assert spec.replicas is None and spec.autoscaling is None
    assert spec.tensor_parallel_size == 1  # the GPU count when not given
    assert spec.served_name == "gpt2"  # the runtime serves hf://gpt2 as gpt2


def test_dump_by_alias_round_trips(llama_spec: dict[str, Any]) -> None:
    spec = InferenceServiceSpec.model_validate(llama_spec)
    dumped = spec.model_dump(by_alias=True, exclude_none=True)
    assert dumped["model"]["servedName"] == "llama-3.1-70b"
    assert InferenceServiceSpec.model_validate(dumped) == spec


def test_models_are_immutable(llama_spec: dict[str, Any]) -> None:
    spec = InferenceServiceSpec.model_validate(llama_spec)
    with pytest.raises(Exception, match="frozen"):
        spec.replicas = 3  # type: ignore[misc]


def test_examples_are_valid(example: dict[str, Any]) -> None:
    document = example
    assert document["apiVersion"] == f"{GROUP}/{VERSION}" and document["kind"] == KIND
    InferenceServiceSpec.model_validate(document["spec"])


def test_the_examples_cover_the_api(all_examples: dict[str, dict[str, Any]]) -> None:
    """Every optional part of the spec appears in at least one example (so the golden files show it)."""
    seen: set[str] = set()
    for document in all_examples.values():
        seen |= _paths(document["spec"])
    for wanted in (
        "model.cache.pvc",
        "model.cache.storageClass",
        "engine.extraArgs",
        "autoscaling.kvCacheUsage.targetRatio",
        "autoscaling.metric",
        "autoscaling.targetInFlight",
        "replicas",
        "scheduling.affinity",
        "scheduling.tolerations",
        "runtime.apiKeySecret.name",
        "runtime.env",
        "monitoring.serviceMonitor.enabled",
        "lora.maxCpuLoras",
        "lora.adapters",
        "resources.sharedMemorySize",
        "disruption.maxUnavailable",
        "rollout.maxSurge",
    ):
        assert wanted in seen, wanted
    schemes = {document["spec"]["model"]["uri"].split(":")[0] for document in all_examples.values()}
    assert schemes == {"hf", "s3", "pvc", "file"}
    assert "inferenceservice-llama" in all_examples and "tiny-cpu" in all_examples


def _paths(value: Any, prefix: str = "") -> set[str]:
    found = {prefix} if prefix else set()
    if isinstance(value, dict):
        for key, sub in value.items():
            found |= _paths(sub, f"{prefix}.{key}" if prefix else key)
    return found
