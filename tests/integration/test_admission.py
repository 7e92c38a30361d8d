"""Invalid InferenceServices are rejected by the API server itself (CRD schema + CEL), naming the field.

No operator involved: this is what `kubectl apply` of a bad manifest sees. Server-side dry run, so nothing
is stored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from isvc import GROUP, PLURAL, VERSION, manifest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from pagoda.contract import IMAGE_MODEL_NAME
from pagoda.operator.api import InferenceServiceSpec
from pagoda.operator.api.rules import MSG_ADAPTER_SERVED_NAME
from pagoda.operator.reconcile.problems import INVALID_SPEC_PREFIX, invalid_spec
from tests.repo import REPO

# Autoscaling needs a metrics source: the ServiceMonitor the operator writes.
MONITORED = {"monitoring": {"serviceMonitor": {"enabled": True}}}
AUTO = {"replicas": None, "autoscaling": {"minReplicas": 1, "maxReplicas": 2}, **MONITORED}

# (id, spec overrides, text the error must contain: the field's name)
INVALID: list[tuple[str, dict[str, Any], list[str]]] = [
    ("unknown-uri-scheme", {"model": {"uri": "ftp://host/model"}}, ["spec.model.uri"]),
    ("missing-model", {"model": None}, ["spec.model"]),
    ("missing-gpu-count", {"resources": {"gpu": {"count": None}}}, ["spec.resources.gpu.count"]),
    ("zero-gpus", {"resources": {"gpu": {"count": 0}}}, ["spec.resources.gpu.count"]),
    ("bad-dtype", {"engine": {"dtype": "int4"}}, ["spec.engine.dtype"]),
    ("bad-quantization", {"engine": {"quantization": "bitsandbytes"}}, ["spec.engine.quantization"]),
    ("gpu-memory-above-1", {"engine": {"gpuMemoryUtilization": 1.5}}, ["gpuMemoryUtilization"]),
    ("gpu-memory-zero", {"engine": {"gpuMemoryUtilization": 0}}, ["gpuMemoryUtilization"]),
    ("tensor-parallel-not-gpu-count", {"engine": {"tensorParallelSize": 2}}, ["tensorParallelSize"]),
    ("bad-block-size", {"engine": {"blockSize": 7}}, ["spec.engine.blockSize"]),
    ("negative-replicas", {"replicas": -1}, ["spec.replicas"]),
    ("replicas-and-autoscaling", {"autoscaling": {"minReplicas": 1, "maxReplicas": 2}}, ["spec.replicas"]),
    (
        "min-above-max",
        {"replicas": None, "autoscaling": {"minReplicas": 5, "maxReplicas": 2}},
        ["minReplicas"],
    ),
    (
        "zero-target-queue-depth",
        {**AUTO, "autoscaling": {"maxReplicas": 2, "targetQueueDepth": 0}},
        ["targetQueueDepth"],
    ),
    (
        "autoscaling-without-metrics",
        {"replicas": None, "autoscaling": {"minReplicas": 1, "maxReplicas": 2}},
        ["spec.autoscaling", "spec.monitoring.serviceMonitor.enabled"],
    ),
    (
        "queue-depth-target-with-in-flight-metric",
        {**AUTO, "autoscaling": {"maxReplicas": 2, "metric": "InFlight", "targetQueueDepth": 2}},
        ["spec.autoscaling.targetQueueDepth"],
    ),
    (
        "in-flight-target-with-queue-depth-metric",
        {**AUTO, "autoscaling": {"maxReplicas": 2, "metric": "QueueDepth", "targetInFlight": 8}},
        ["spec.autoscaling.targetInFlight"],
    ),
    (
        "kv-ratio-above-1",
        {**AUTO, "autoscaling": {"maxReplicas": 2, "kvCacheUsage": {"targetRatio": 2.0}}},
        ["targetRatio"],
    ),
    (
        "credentials-not-a-name",
        {"model": {"credentialsSecret": "Not_A_Name"}},
        ["spec.model.credentialsSecret"],
    ),
    ("cache-pvc-and-size", {"model": {"cache": {"pvc": "models", "size": "10Gi"}}}, ["spec.model.cache"]),
    ("bad-memory-quantity", {"resources": {"memory": "lots"}}, ["spec.resources.memory"]),
    ("bad-service-port", {"service": {"port": 70000}}, ["spec.service.port"]),
    ("unknown-field", {"engine": {"turbo": True}}, ["spec.engine.turbo"]),
    ("zero-gpu-hour-price", {"cost": {"gpuHourPrice": 0}}, ["spec.cost.gpuHourPrice"]),
    ("cost-without-gpu-hour-price", {"cost": {"apiPricePerMillionTokens": 0.6}}, ["spec.cost.gpuHourPrice"]),
    (
        "negative-api-price",
        {"cost": {"gpuHourPrice": 2.5, "apiPricePerMillionTokens": -1}},
        ["spec.cost.apiPricePerMillionTokens"],
    ),
    ("lowercase-currency", {"cost": {"gpuHourPrice": 2.5, "currency": "usd"}}, ["spec.cost.currency"]),
    ("restart-every-too-short", {"restartSchedule": {"every": "30s"}}, ["spec.restartSchedule.every"]),
    ("restart-every-in-days", {"restartSchedule": {"every": "1d"}}, ["spec.restartSchedule.every"]),
    (
        "restart-window-empty",
        {"restartSchedule": {"every": "1h", "window": {"start": "02:00", "end": "02:00"}}},
        ["spec.restartSchedule.window"],
    ),
    (
        "adapter-names-repeat",
        {
            "lora": {
                "maxLoras": 2,
                "adapters": [{"name": "a", "uri": "hf://o/a"}, {"name": "a", "uri": "hf://o/b"}],
            }
        },
        ["spec.lora.adapters[1]"],
    ),
    (
        "adapter-name-dash-first",
        {"lora": {"adapters": [{"name": "-a", "uri": "hf://o/a"}]}},
        ["spec.lora.adapters[0].name"],
    ),
    (
        "adapter-uri-scheme",
        {"lora": {"adapters": [{"name": "a", "uri": "gs://b/a"}]}},
        ["spec.lora.adapters[0].uri"],
    ),
    (
        "adapter-served-name",
        {"lora": {"adapters": [{"name": "tiny", "uri": "hf://o/a"}]}},
        ["spec.lora.adapters"],
    ),
    (
        "adapters-more-than-held",
        {"lora": {"adapters": [{"name": "a", "uri": "hf://o/a"}, {"name": "b", "uri": "hf://o/b"}]}},
        ["spec.lora.adapters", "maxCpuLoras"],
    ),
    ("lora-rank-not-vllm", {"lora": {"maxLoraRank": 48}}, ["spec.lora.maxLoraRank"]),
    ("lora-cpu-below-gpu", {"lora": {"maxLoras": 2, "maxCpuLoras": 1}}, ["spec.lora.maxCpuLoras"]),
    (
        "pull-secret-not-a-name",
        {"runtime": {"imagePullSecrets": [{"name": "Reg_Cred"}]}},
        ["spec.runtime.imagePullSecrets[0].name"],
    ),
    (
        "pull-secrets-repeat",
        {"runtime": {"imagePullSecrets": [{"name": "regcred"}, {"name": "regcred"}]}},
        ["spec.runtime.imagePullSecrets[1]"],
    ),
    (
        "body-limit-too-small",
        {"runtime": {"maxRequestBodyBytes": 1023}},
        ["spec.runtime.maxRequestBodyBytes"],
    ),
    (
        "restart-window-not-a-clock",
        {"restartSchedule": {"every": "1h", "window": {"start": "2am", "end": "05:00"}}},
        ["spec.restartSchedule.window.start"],
    ),
    (
        "vllm-dev-mode-in-env",
        {"runtime": {"env": [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}]}},
        ["spec.runtime.env[0].name", "VLLM_SERVER_DEV_MODE is not allowed"],
    ),
    (
        "vllm-runtime-lora-updating-in-env",
        {
            "runtime": {
                "env": [
                    {"name": "LOG", "value": "1"},
                    {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "1"},
                ]
            }
        },
        ["spec.runtime.env[1].name", "VLLM_ALLOW_RUNTIME_LORA_UPDATING is not allowed"],
    ),
    (
        "pod-namespace-in-env",  # it chose which namespace's node cache folder a pod mounted (issue #40 §5)
        {
            "model": {"cache": {"scope": "Node"}},
            "runtime": {"env": [{"name": "POD_NAMESPACE", "value": "kube-system"}]},
        },
        ["spec.runtime.env[0].name", "POD_NAMESPACE is not allowed"],
    ),
]


@pytest.mark.parametrize(("overrides", "fields"), [pytest.param(o, f, id=i) for i, o, f in INVALID])
def test_invalid_spec_is_rejected_at_admission(
    crd: None, cluster_api: Any, namespace: str, overrides: dict[str, Any], fields: list[str]
) -> None:
    body = manifest("bad", namespace, **overrides)
    api = client.CustomObjectsApi(cluster_api)
    with pytest.raises(ApiException) as caught:
        api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body, dry_run="All", field_validation="Strict"
        )
    assert caught.value.status in (400, 422), caught.value.body  # 400: strict decoding of unknown fields
    message = json.loads(caught.value.body)["message"]
    for field in fields:
        assert field in message, f"{field!r} not named in: {message}"


# (id, spec overrides) breaking one cross-field rule each (api/rules.py)
RULE_BREAKERS: list[tuple[str, dict[str, Any]]] = [
    ("owned-flag-underscore", {"engine": {"extraArgs": ["--served_model_name=other"]}}),
    ("gpu-memory-above-1", {"engine": {"gpuMemoryUtilization": 1.5}}),
    ("unknown-uri-scheme", {"model": {"uri": "ftp://host/model"}}),
    ("replicas-and-autoscaling", {"autoscaling": {"minReplicas": 1, "maxReplicas": 2}, **MONITORED}),
    ("restart-every-too-long", {"restartSchedule": {"every": "721h"}}),
    ("adapter-served-name", {"lora": {"adapters": [{"name": "tiny", "uri": "hf://o/a"}]}}),
    (
        "adapters-more-than-held",
        {"lora": {"adapters": [{"name": "a", "uri": "hf://o/a"}, {"name": "b", "uri": "hf://o/b"}]}},
    ),
    ("lora-cpu-below-gpu", {"lora": {"maxLoras": 2, "maxCpuLoras": 1}}),
    ("rollout-replaces-no-pod", {"rollout": {"maxSurge": 0}}),
    ("cache-size-zero", {"model": {"cache": {"size": "0Gi"}}}),
    ("cache-size-zero-int", {"model": {"cache": {"size": 0}}}),
    ("toleration-without-key", {"scheduling": {"tolerations": [{"operator": "Equal", "value": "v"}]}}),
    (
        "restart-window-empty",
        {"restartSchedule": {"every": "1h", "window": {"start": "03:00", "end": "03:00"}}},
    ),
    ("vllm-dev-mode-in-env", {"runtime": {"env": [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}]}}),
    (
        "vllm-runtime-lora-updating-from-a-config-map",
        {
            "runtime": {
                "env": [
                    {
                        "name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
                        "valueFrom": {"configMapKeyRef": {"name": "flags", "key": "lora"}},
                    }
                ]
            }
        },
    ),
]


@pytest.mark.parametrize("overrides", [pytest.param(o, id=i) for i, o in RULE_BREAKERS])
def test_degraded_says_what_admission_says(
    crd: None, cluster_api: Any, namespace: str, overrides: dict[str, Any]
) -> None:
    """The operator's InvalidSpec message (for an object stored under an older CRD) is the API server's
    rule message, word for word."""
    body = manifest("bad", namespace, **overrides)
    with pytest.raises(ApiException) as caught:
        client.CustomObjectsApi(cluster_api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body, dry_run="All"
        )
    admission = json.loads(caught.value.body)["message"]
    with pytest.raises(ValidationError) as invalid:
        InferenceServiceSpec.model_validate(body["spec"])
    degraded = invalid_spec(invalid.value).message.removeprefix(INVALID_SPEC_PREFIX)
    assert admission.endswith(f": {degraded}"), (admission, degraded)


def test_a_valid_spec_is_accepted(crd: None, cluster_api: Any, namespace: str) -> None:
    """The base every invalid case starts from is itself valid (so each case fails for its own reason)."""
    api = client.CustomObjectsApi(cluster_api)
    priced = {"cost": {"gpuHourPrice": 2.5, "apiPricePerMillionTokens": 0.6, "currency": "EUR"}}
    window = {"start": "22:00", "end": "04:00", "timeZone": "Europe/Berlin"}
    restarted = {"restartSchedule": {"every": "12h", "window": window}}
    lora = {
        "lora": {"maxLoras": 2, "maxLoraRank": 64, "adapters": [{"name": "sql", "uri": "pvc://adapters/sql"}]}
    }
    private = {"runtime": {"imagePullSecrets": [{"name": "regcred"}], "maxRequestBodyBytes": 1024**3}}
    for overrides in ({}, AUTO, priced, restarted, {"restartSchedule": {"every": "1m"}}, lora, private):
        created = api.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            manifest("ok", namespace, **overrides),
            dry_run="All",
            field_validation="Strict",
        )
        assert created["metadata"]["name"] == "ok"


EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_is_accepted_by_the_api_server(
    crd: None, cluster_api: Any, namespace: str, path: Path
) -> None:
    """What the README and docs tell people to `kubectl apply` passes the real CRD schema and CEL rules."""
    body = yaml.safe_load(path.read_text())
    body["metadata"]["namespace"] = namespace
    created = client.CustomObjectsApi(cluster_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body, dry_run="All", field_validation="Strict"
    )
    assert created["spec"] == body["spec"]


# The name a model is served under when spec.model.servedName is unset (contract/__init__.py), on each scheme:
# (id, model URI, an adapter named like it), which every pod would refuse (the runtime's --lora check).
SERVED_NAME_CLASHES: list[tuple[str, str, str]] = [
    ("file", "file:///models/tiny/", "tiny"),
    ("pvc-path", "pvc://models/llama/8b-instruct", "8b-instruct"),
    ("pvc-claim-only", "pvc://llama", "llama"),
    ("oci", "oci://registry.example/models/llama:3.1", IMAGE_MODEL_NAME),
    ("hf-one-part", "hf://gpt2", "gpt2"),
    ("hf-one-part-slash", "hf://gpt2/", "gpt2"),
    ("s3-deep-prefix-slash", "s3://my-bucket/llama/3.1/8b-instruct/", "8b-instruct"),
]
# The same URIs with an adapter named like another part of them (hf://org/name serves org/name, which no
# adapter name can be): admitted.
SERVED_NAME_NEIGHBOURS: list[tuple[str, str, str]] = [
    ("file", "file:///models/tiny/", "models"),
    ("pvc-path", "pvc://models/llama/8b-instruct", "llama"),
    ("oci", "oci://registry.example/models/llama:3.1", "llama"),
    ("hf-two-parts", "hf://org/name", "name"),
    ("s3-deep-prefix", "s3://my-bucket/llama/3.1/8b-instruct/", "3.1"),
]


def _served_name_spec(uri: str, adapter: str) -> dict[str, Any]:
    return {
        "model": {"uri": uri, "servedName": None},
        "lora": {
            "maxLoras": 2,
            "adapters": [{"name": "sql", "uri": "hf://o/sql"}, {"name": adapter, "uri": "hf://o/a"}],
        },
    }


@pytest.mark.parametrize(("uri", "adapter"), [pytest.param(u, a, id=i) for i, u, a in SERVED_NAME_CLASHES])
def test_an_adapter_named_like_the_derived_served_name_is_refused_by_both(
    crd: None, cluster_api: Any, namespace: str, uri: str, adapter: str
) -> None:
    """The API server's CEL and the operator's models refuse it, with the same message (issue #40 §6: the
    rule compared adapters with the whole URI, so this passed admission and failed in every pod)."""
    body = manifest("bad", namespace, **_served_name_spec(uri, adapter))
    with pytest.raises(ApiException) as caught:
        client.CustomObjectsApi(cluster_api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body, dry_run="All", field_validation="Strict"
        )
    admission = json.loads(caught.value.body)["message"]
    assert "spec.lora.adapters" in admission and MSG_ADAPTER_SERVED_NAME in admission, admission
    with pytest.raises(ValidationError) as invalid:
        InferenceServiceSpec.model_validate(body["spec"])
    assert admission.endswith(f": {invalid_spec(invalid.value).message.removeprefix(INVALID_SPEC_PREFIX)}")


@pytest.mark.parametrize(("uri", "adapter"), [pytest.param(u, a, id=i) for i, u, a in SERVED_NAME_NEIGHBOURS])
def test_an_adapter_named_like_another_part_of_the_uri_is_admitted_by_both(
    crd: None, cluster_api: Any, namespace: str, uri: str, adapter: str
) -> None:
    body = manifest("ok", namespace, **_served_name_spec(uri, adapter))
    client.CustomObjectsApi(cluster_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body, dry_run="All", field_validation="Strict"
    )
    InferenceServiceSpec.model_validate(body["spec"])
