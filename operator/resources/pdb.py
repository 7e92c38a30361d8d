"""The PodDisruptionBudget: voluntary disruptions take down at most maxUnavailable replicas at once."""

from __future__ import annotations

from typing import Any

from pagoda.operator.api import InferenceServiceSpec

from .meta import metadata, selector


def pod_disruption_budget(name: str, namespace: str, spec: InferenceServiceSpec) -> dict[str, Any]:
    body = {
        "maxUnavailable": spec.disruption.max_unavailable,
        "selector": {"matchLabels": selector(name)},
        # A pod that never became ready (e.g. stuck loading) must not block a node drain.
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(name, namespace),
        "spec": body,
    }
