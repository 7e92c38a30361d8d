"""Labels, selectors and object metadata shared by every child of an InferenceService."""

from __future__ import annotations

import hashlib
from typing import Any

# The container's side of the operator-runtime contract (contract/__init__.py), re-exported for the builders.

APP_NAME = "pagoda-runtime"
# app.kubernetes.io/managed-by on every child and pod: the operator's watches select on it.
MANAGED_BY = "pagoda-operator"
# On every child and pod, naming its InferenceService: how the operator finds an owner's children.
OWNER_LABEL = "pagoda.dev/inferenceservice"
# The server-side apply field manager; compare.stale_fields reads managedFields by this name, and Events
# name it as their reporting component.
FIELD_MANAGER = "pagoda-operator"
# Holds a Deployment's spec.replicas for a moment when autoscaling is turned on (reconcile/apply.py
# hand_over_replicas), so that the operator's release of the field does not reset it to 1.
REPLICAS_HANDOVER_MANAGER = "pagoda-operator-replicas-handover"
# Scheduled restarts (reconcile/restarts.py): a new value on the pod template rolls every pod, as
# `kubectl rollout restart` (kubectl.kubernetes.io/restartedAt) does; on the Deployment itself, when the
# operator first saw the schedule (the first restart is one interval after it).
RESTARTED_AT_ANNOTATION = "pagoda.dev/restartedAt"
RESTART_SCHEDULE_SINCE_ANNOTATION = "pagoda.dev/restartScheduleSince"
CONTAINER_NAME = "runtime"
# The node label NVIDIA's GPU feature discovery sets to the GPU model (spec.resources.gpu.product).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


def labels(name: str) -> dict[str, str]:
    """Labels on every child (and the pod template) of InferenceService `name`."""
    return {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        OWNER_LABEL: name,
    }


def selector(name: str) -> dict[str, str]:
    """matchLabels of the Deployment, Service and PDB: nothing version-dependent, never changes."""
    return {"app.kubernetes.io/name": APP_NAME, OWNER_LABEL: name}


def selector_string(name: str) -> str:
    """The selector as a label-selector string (status.selector, for the scale subresource)."""
    return ",".join(f"{key}={value}" for key, value in selector(name).items())


def metadata(name: str, namespace: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": labels(name)}


def service_url(name: str, namespace: str, port: int, scheme: str = "http") -> str:
    """In-cluster URL of the service's OpenAI API (status.url); `scheme` https with spec.runtime.tls."""
    return f"{scheme}://{name}.{namespace}.svc:{port}"


def content_hash(text: str) -> str:
    """A short digest of a configuration a container reads once, at start: put on the pod template, it rolls
    the pods when the configuration changes (the picker's config, the chat template)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]
