"""The Deployment of runtime pods."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagoda.operator.api import InferenceServiceSpec

from .meta import RESTART_SCHEDULE_SINCE_ANNOTATION, RESTARTED_AT_ANNOTATION, metadata, selector
from .pod import DEFAULT_RUNTIME_IMAGE, pod_template

PROGRESS_MARGIN_SECONDS = 300


@dataclass(frozen=True)
class RestartStamps:
    """The scheduled-restart annotations (reconcile/restarts.py), RFC 3339 times: `restarted_at` goes on the
    pod template (a new value rolls every pod), `since` on the Deployment (when the operator first saw the
    restart schedule)."""

    restarted_at: str | None = None
    since: str | None = None


NO_RESTART = RestartStamps()


def deployment(
    name: str,
    namespace: str,
    spec: InferenceServiceSpec,
    default_image: str = DEFAULT_RUNTIME_IMAGE,
    stamps: RestartStamps = NO_RESTART,
    chat_template: str | None = None,
    management: bool = False,
) -> dict[str, Any]:
    """The runtime Deployment. Autoscaled: no spec.replicas at all, so KEDA's HPA alone owns the field.
    `chat_template`, `management`: see pod_template."""
    template = pod_template(name, namespace, spec, default_image, chat_template, management)
    if stamps.restarted_at is not None:
        annotations = template["metadata"].setdefault("annotations", {})
        annotations[RESTARTED_AT_ANNOTATION] = stamps.restarted_at
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
        "template": template,
    }
    if spec.autoscaling is None:
        body = {"replicas": 1 if spec.replicas is None else spec.replicas, **body}
    meta = metadata(name, namespace)
    if stamps.since is not None:
        meta["annotations"] = {RESTART_SCHEDULE_SINCE_ANNOTATION: stamps.since}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": body}
