"""What `desired_children` builds from besides a service's name, namespace and spec, as two parameter objects:
the operator's settings, the same for every service (`OperatorSettings`), and what one pass adds for one
service from its status and its restart schedule (`ChildInputs`). Each field says which builder reads it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .deployment import NO_RESTART, RestartStamps
from .pod import DEFAULT_RUNTIME_IMAGE


@dataclass(frozen=True)
class OperatorSettings:
    """What the operator's command line and its management key give the children of every service."""

    # The runtime image of the pods whose spec.runtime.image is unset (--runtime-image).
    default_image: str = DEFAULT_RUNTIME_IMAGE
    # The operator's public key (PEM), in a ConfigMap before the Deployment whose pods mount it
    # (resources/management.py); the operator always gives it, and without it the pods' management API (the
    # adapters) is off.
    management_key: str | None = None
    # The namespaces the NetworkPolicies admit besides those the spec names (the operator's, Prometheus's;
    # resources/networkpolicy.py, --allow-from-namespace).
    trusted_namespaces: tuple[str, ...] = ()
    # The ClusterRole the endpoint picker is bound to (resources/routing.py, --picker-cluster-role).
    picker_cluster_role: str | None = None


DEFAULT_SETTINGS = OperatorSettings()


@dataclass(frozen=True)
class ChildInputs:
    """Everything `desired_children` reads besides the name, namespace and spec; the defaults are a service
    with no status yet and no restart schedule."""

    settings: OperatorSettings = DEFAULT_SETTINGS
    # The scheduled-restart annotations of the Deployment (see `RestartStamps`).
    stamps: RestartStamps = NO_RESTART
    # The template the operator read from the ConfigMap spec.engine.chatTemplate.configMap names (an inline
    # one is in the spec).
    chat_template: str | None = None
    # The service's typical cold start in seconds (status.startup.typical): how early a pre-warm window's
    # replicas start, and how long the endpoint picker holds a request while no replica runs (unless the
    # spec says).
    typical_start: float | None = None
    # The owner's pagoda.dev/profile annotation: a new value runs a new capacity profile
    # (resources/profile.py), whose Job comes last, with spec.slo only.
    profile_request: str | None = None
    # The metric SLO's base, the concurrency per replica the last profile measured within spec.slo
    # (status/profile.py slo_concurrency: the last one met, or 1, while the newest met the SLO at no step).
    slo_concurrency: int | None = None
    # The batch settings that profile chose (status.profile.engine), which the replicas run for the fields
    # the spec leaves unset (with spec.slo.tuneEngine); the profile Job keeps the spec's own.
    engine_choice: dict[str, Any] | None = None
    # The replicas the service's GPUBudget lets it hold now (reconcile/gpubudget.py), the ScaledObject's
    # maxReplicaCount when below spec.autoscaling.maxReplicas; None: no budget.
    budget_limit: int | None = None


NO_INPUTS = ChildInputs()  # a new service's, under the default settings
