"""The KEDA ScaledObject: scale the Deployment on this service's queue depth (and KV-cache usage)."""

from __future__ import annotations

from typing import Any

from pagoda.operator.api import AutoscalingSpec

from .meta import metadata


def queue_depth_query(name: str, namespace: str) -> str:
    return f'sum(pagoda_queue_depth{{namespace="{namespace}",service="{name}"}})'


def kv_cache_query(name: str, namespace: str) -> str:
    return f'max(pagoda_kv_cache_usage_ratio{{namespace="{namespace}",service="{name}"}})'


def scaled_object(name: str, namespace: str, autoscaling: AutoscalingSpec) -> dict[str, Any]:
    triggers: list[dict[str, Any]] = [
        {
            "type": "prometheus",
            "name": "queue-depth",
            # AverageValue: KEDA divides the total by the replica count: the threshold is per replica.
            "metricType": "AverageValue",
            "metadata": {
                "serverAddress": autoscaling.prometheus_address,
                "query": queue_depth_query(name, namespace),
                "threshold": str(autoscaling.target_queue_depth),
            },
        }
    ]
    if autoscaling.kv_cache_usage is not None:
        triggers.append(
            {
                "type": "prometheus",
                "name": "kv-cache-usage",
                "metricType": "Value",
                "metadata": {
                    "serverAddress": autoscaling.prometheus_address,
                    "query": kv_cache_query(name, namespace),
                    "threshold": repr(float(autoscaling.kv_cache_usage.target_ratio)),
                },
            }
        )
    body = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
        "minReplicaCount": autoscaling.min_replicas,
        "maxReplicaCount": autoscaling.max_replicas,
        "pollingInterval": autoscaling.polling_interval,
        "cooldownPeriod": autoscaling.cooldown_period,
        # KEDA's cooldownPeriod only governs scaling to zero; replicas >= 1 are scaled down by the HPA,
        # so the same period becomes its scale-down stabilization window.
        "advanced": {
            "horizontalPodAutoscalerConfig": {
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": autoscaling.cooldown_period}}
            }
        },
        "triggers": triggers,
    }
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": metadata(name, namespace),
        "spec": body,
    }
