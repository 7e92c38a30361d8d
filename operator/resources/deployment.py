"""The Deployment of runtime pods."""

from __future__ import annotations

from typing import Any

from pagoda.operator.api import InferenceServiceSpec

from .meta import metadata, selector
from .pod import DEFAULT_RUNTIME_IMAGE, pod_template

PROGRESS_MARGIN_SECONDS = 300


def deployment(
    name: str, namespace: str, spec: InferenceServiceSpec, default_image: str = DEFAULT_RUNTIME_IMAGE
) -> dict[str, Any]:
    """The runtime Deployment. Autoscaled: no spec.replicas at all, so KEDA's HPA alone owns the field."""
    body: dict[str, Any] = {
        "selector": {"matchLabels": selector(name)},
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {
                "maxSurge": spec.rollout.max_surge,
                "maxUnavailable": spec.rollout.max_unavailable,
            },
        },
        # A rollout may legitimately spend the whole startup timeout loading weights.
        "progressDeadlineSeconds": spec.runtime.startup_timeout_seconds + PROGRESS_MARGIN_SECONDS,
        "template": pod_template(name, spec, default_image),
    }
    if spec.autoscaling is None:
        body = {"replicas": 1 if spec.replicas is None else spec.replicas, **body}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(name, namespace),
        "spec": body,
    }
