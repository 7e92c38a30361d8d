"""Problems a person can act on: invalid spec with field paths, secret references, apply errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from pagoda.operator.api import InferenceServiceSpec
from pagoda.operator.api import rules as r
from pagoda.operator.kube.client import KubeError, resource_path
from pagoda.operator.reconcile.problems import INVALID_SPEC_PREFIX, apply_problem, invalid_spec, secret_names


class Engine(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dtype: str
    tensorParallelSize: int


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    engine: Engine


def test_invalid_spec_names_every_field() -> None:
    with pytest.raises(ValidationError) as caught:
        Spec.model_validate({"engine": {"dtype": 3, "tensorParallelSize": "x"}})
    problem = invalid_spec(caught.value)
    assert problem.reason == "InvalidSpec" and not problem.retry
    assert "spec.engine.dtype:" in problem.message
    assert "spec.engine.tensorParallelSize:" in problem.message


@pytest.mark.parametrize(
    ("mutate", "rule_message"),
    [
        (lambda spec: spec["engine"].update(extraArgs=["--port=9000"]), r.MSG_EXTRA_ARGS),
        (lambda spec: spec["engine"].update(gpuMemoryUtilization=1.5), r.MSG_GPU_MEMORY),
        (lambda spec: spec["model"].update(uri="ftp://host/model"), r.MSG_URI),
        (lambda spec: spec.update(replicas=2), r.MSG_REPLICAS_XOR),
    ],
    ids=["owned-flag", "gpu-memory", "uri", "replicas-and-autoscaling"],
)
def test_invalid_spec_says_what_admission_says(
    llama_spec: dict[str, Any],
    cel_check: Callable[[dict[str, Any]], list[str]],
    mutate: Callable[[dict[str, Any]], None],
    rule_message: str,
) -> None:
    """The Degraded message of a spec that breaks a rule is the rule's admission message, word for word
    (no pydantic "Value error, " prefix)."""
    mutate(llama_spec)
    obj = {"apiVersion": "pagoda.dev/v1alpha1", "kind": "InferenceService", "metadata": {"name": "m"}}
    assert cel_check({**obj, "spec": llama_spec}) == [rule_message]
    with pytest.raises(ValidationError) as caught:
        InferenceServiceSpec.model_validate(llama_spec)
    assert invalid_spec(caught.value).message == INVALID_SPEC_PREFIX + rule_message


def test_secret_names_from_pod_template() -> None:
    deployment = {
        "kind": "Deployment",
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "env": [
                                {
                                    "name": "HF_TOKEN",
                                    "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}},
                                },
                                {
                                    "name": "K",
                                    "valueFrom": {"secretKeyRef": {"name": "opt", "optional": True}},
                                },
                                {"name": "PLAIN", "value": "x"},
                            ],
                            "envFrom": [{"secretRef": {"name": "aws"}}, {"configMapRef": {"name": "cm"}}],
                        }
                    ],
                    "volumes": [{"name": "v", "secret": {"secretName": "hf"}}],
                    "imagePullSecrets": [{"name": "regcred"}, {"name": "aws"}],
                }
            }
        },
    }
    assert secret_names([deployment, {"kind": "Service"}]) == ["hf", "aws", "regcred"]


def test_apply_problem_reasons() -> None:
    scaled = {"kind": "ScaledObject", "apiVersion": "keda.sh/v1alpha1"}
    missing = apply_problem(
        scaled, KubeError(404, "NotFound", "the server could not find the requested resource")
    )
    assert missing.reason == "ApiNotInstalled" and "KEDA" in missing.message and missing.retry
    rejected = apply_problem(scaled, KubeError(422, "Invalid", "spec.maxReplicaCount: Invalid value"))
    assert rejected.reason == "ApplyRejected" and "spec.maxReplicaCount" in rejected.message
    assert not rejected.retry


def test_resource_paths() -> None:
    assert resource_path("v1", "services", "ns", "a") == "/api/v1/namespaces/ns/services/a"
    assert resource_path("apps/v1", "deployments", "ns") == "/apis/apps/v1/namespaces/ns/deployments"
    assert (
        resource_path("pagoda.dev/v1alpha1", "inferenceservices", None)
        == "/apis/pagoda.dev/v1alpha1/inferenceservices"
    )
