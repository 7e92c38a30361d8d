"""InferenceServiceStatus: what the operator reports (written by the controller)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import ApiModel

ConditionType = Literal["Ready", "Progressing", "Degraded"]
CONDITION_TYPES: tuple[ConditionType, ...] = ("Ready", "Progressing", "Degraded")


class Condition(ApiModel):
    """One condition, as in metav1.Condition."""

    type: str = Field(max_length=316, description="Ready, Progressing or Degraded.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(max_length=1024, description="CamelCase reason for the last transition.")
    message: str = Field(default="", max_length=32768, description="Human-readable detail.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed for."
    )
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")


class InferenceServiceStatus(ApiModel):
    """Observed state of an InferenceService."""

    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=8,
        description="Ready, Progressing and Degraded.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(default=None, description="metadata.generation last reconciled.")
    replicas: int | None = Field(default=None, description="Replicas of the Deployment (scale subresource).")
    ready_replicas: int | None = Field(default=None, description="Ready replicas of the Deployment.")
    ready_summary: str | None = Field(
        default=None, description="readyReplicas/replicas, e.g. 2/3 (the Ready column of kubectl get)."
    )
    selector: str | None = Field(
        default=None, description="Label selector of the pods, as a string (scale subresource)."
    )
    url: str | None = Field(
        default=None, description="In-cluster URL of the OpenAI API, http://<name>.<ns>.svc:<port>."
    )
