"""Pure builders: InferenceServiceSpec in, child manifests out (no I/O). One module per kind."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pagoda.operator.api import InferenceServiceSpec

from .chattemplate import chat_template_config_map, chat_template_text
from .deployment import NO_RESTART, RestartStamps, deployment
from .management import management_config_map
from .meta import labels, selector, selector_string, service_url
from .networkpolicy import network_policies
from .pdb import pod_disruption_budget
from .pod import DEFAULT_RUNTIME_IMAGE
from .profile import PROFILE_REQUEST_ANNOTATION, profile_job, with_engine_choice
from .routing import routing_children
from .scaledobject import scaled_object
from .service import service
from .servicemonitor import service_monitor

# (apiVersion, kind, plural) of every kind that can be a child of an InferenceService.
CHILD_KINDS: list[tuple[str, str, str]] = [
    ("apps/v1", "Deployment", "deployments"),
    ("v1", "Service", "services"),
    ("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    ("keda.sh/v1alpha1", "ScaledObject", "scaledobjects"),
    ("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors"),
    ("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    # spec.routing: the endpoint picker's identity, config and Service, the InferencePool, the HTTPRoute.
    ("v1", "ServiceAccount", "serviceaccounts"),
    ("rbac.authorization.k8s.io/v1", "Role", "roles"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    ("v1", "ConfigMap", "configmaps"),
    ("inference.networking.k8s.io/v1", "InferencePool", "inferencepools"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes"),
    # spec.slo: the capacity profile.
    ("batch/v1", "Job", "jobs"),
]


def desired_children(
    name: str,
    namespace: str,
    spec: InferenceServiceSpec,
    default_image: str = DEFAULT_RUNTIME_IMAGE,
    stamps: RestartStamps = NO_RESTART,
    chat_template: str | None = None,
    management_key: str | None = None,
    trusted_namespaces: Iterable[str] = (),
    typical_start: float | None = None,
    profile_request: str | None = None,
    slo_concurrency: int | None = None,
    engine_choice: dict[str, Any] | None = None,
    picker_cluster_role: str | None = None,
) -> list[dict[str, Any]]:
    """Every child manifest the spec asks for, in apply order (no ownerReferences: the controller adds them).

    The chat template's ConfigMap only with spec.engine.chatTemplate (before the Deployment, whose new pods
    mount it), the ScaledObject only when autoscaling is set, the ServiceMonitor only when enabled, the
    routing objects (resources/routing.py) only with spec.routing; a kind in
    CHILD_KINDS that is missing here is one the controller should delete. `stamps`: the
    scheduled-restart annotations of the Deployment (see `RestartStamps`). `chat_template`: the template the
    operator read from the ConfigMap spec.engine.chatTemplate.configMap names (an inline one is in the spec).
    `management_key`: the operator's public key (PEM), in a ConfigMap before the Deployment whose pods mount
    it (resources/management.py); the operator always gives it, and without it the pods' management API
    (the adapters) is off. `trusted_namespaces`: the namespaces the NetworkPolicies admit besides those the
    spec names (the operator's, Prometheus's; resources/networkpolicy.py). `typical_start`: the service's
    typical cold start in seconds (status.startup.typical): how early a pre-warm window's replicas start, and
    how long the endpoint picker holds a request while no replica runs (unless the spec says).
    `profile_request`: the owner's pagoda.dev/profile annotation (a new value runs a new capacity profile;
    resources/profile.py), whose Job comes last, with spec.slo only. `slo_concurrency`: metric SLO's
    base, the concurrency per replica the last profile measured within spec.slo (reconcile/profile.py
    slo_concurrency: the last one met, or 1, while the newest met the SLO at no step).
    `engine_choice`: the batch settings that profile chose (status.profile.engine), which the replicas run
    for the fields the spec leaves unset (with spec.slo.tuneEngine); the profile Job keeps the spec's own.
    `picker_cluster_role`: the ClusterRole the endpoint picker is bound to (resources/routing.py).
    """
    template = chat_template_text(spec, chat_template)
    # The NetworkPolicies first: the pods are never up without them.
    children = network_policies(name, namespace, spec, trusted_namespaces)
    if template is not None:
        children.append(chat_template_config_map(name, namespace, template))
    if management_key is not None:
        children.append(management_config_map(name, namespace, management_key))
    replicas = with_engine_choice(spec, engine_choice)
    children += [
        deployment(
            name, namespace, replicas, default_image, stamps, chat_template, management_key is not None
        ),
        service(name, namespace, spec),
        pod_disruption_budget(name, namespace, spec),
    ]
    if spec.autoscaling is not None:
        children.append(
            scaled_object(
                name,
                namespace,
                spec.autoscaling,
                spec.routing is not None,
                typical_start=typical_start,
                slo_concurrency=slo_concurrency,
            )
        )
    if spec.monitoring.service_monitor.enabled:
        children.append(service_monitor(name, namespace, spec))
    children += routing_children(name, namespace, spec, typical_start, picker_cluster_role)
    job = profile_job(name, namespace, spec, default_image, chat_template, profile_request)  # the spec's own
    return children + ([job] if job is not None else [])


__all__ = [
    "CHILD_KINDS",
    "DEFAULT_RUNTIME_IMAGE",
    "PROFILE_REQUEST_ANNOTATION",
    "RestartStamps",
    "desired_children",
    "labels",
    "selector",
    "selector_string",
    "service_url",
]
