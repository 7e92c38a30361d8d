"""Problems a person can act on: invalid spec with field paths, secret references, apply errors."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from pagoda.operator.reconcile.kube import KubeError, resource_path
from pagoda.operator.reconcile.problems import apply_problem, invalid_spec, secret_names


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
                }
            }
        },
    }
    assert secret_names([deployment, {"kind": "Service"}]) == ["hf", "aws"]


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
