"""The InferenceService samples the tests and benchmarks start from."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from e2e.lab import _objects
from e2e.lab.processes import SAMPLE


def tiny_sample(namespace: str, name: str = "tiny", *, real_pods: bool = False) -> dict[str, Any]:
    """examples/tiny-cpu.yaml in `namespace` as `name`. With `real_pods` it is unchanged, so its pods run on
    the real node (tier 4); otherwise it asks for kwok's simulated nodes (tests of the chart, the dashboards
    and status that need no running engine)."""
    obj: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    obj["metadata"] = {"name": name, "namespace": namespace}
    if not real_pods:
        obj["spec"]["scheduling"] = copy.deepcopy(_objects.KWOK_SCHEDULING)
    return obj


def budget_member(sample: dict[str, Any], budget: str, priority: int = 0) -> dict[str, Any]:
    """`sample` (a kwok one: no pods to scrape, no KEDA) autoscaled from 1 to 2 replicas as the member of
    GPUBudget `budget`, so that the budget has a member and its metric a series; `sample` itself, changed."""
    sample["spec"].pop("replicas", None)
    sample["spec"]["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 2,
        "metricsSource": "External",
        "budget": {"name": budget, "priority": priority},
    }
    return sample


def gpu_budget(name: str, gpus: int, namespace: str) -> dict[str, Any]:
    """A GPUBudget `name` of `gpus` GPUs for the InferenceServices of one namespace (docs/budget.md)."""
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "GPUBudget",
        "metadata": {"name": name},
        "spec": {
            "gpus": gpus,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        },
    }
