"""Pure builders: InferenceServiceSpec in, child manifests out (no I/O). One module per kind."""

from __future__ import annotations

from typing import Any

from pagoda.operator.api import InferenceServiceSpec

from .chattemplate import chat_template_config_map, chat_template_text
from .deployment import RestartStamps, deployment
from .inputs import DEFAULT_SETTINGS, NO_INPUTS, ChildInputs, OperatorSettings
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
    name: str, namespace: str, spec: InferenceServiceSpec, inputs: ChildInputs = NO_INPUTS
) -> list[dict[str, Any]]:
    """Every child manifest the spec asks for, in apply order (no ownerReferences: the controller adds them).

    The chat template's ConfigMap only with spec.engine.chatTemplate (before the Deployment, whose new pods
    mount it), the management key's ConfigMap only with a key (before the Deployment too), the ScaledObject
    only when autoscaling is set, the ServiceMonitor only when enabled, the routing objects
    (resources/routing.py) only with spec.routing, the profile Job last, with spec.slo only; a kind in
    CHILD_KINDS that is missing here is one the controller should delete. `inputs`: what the operator's
    settings and the service's status add to the spec (resources/inputs.py).
    """
    settings = inputs.settings
    template = chat_template_text(spec, inputs.chat_template)
    # The NetworkPolicies first: the pods are never up without them.
    children = network_policies(name, namespace, spec, settings.trusted_namespaces)
    if template is not None:
        children.append(chat_template_config_map(name, namespace, template))
    if settings.management_key is not None:
        children.append(management_config_map(name, namespace, settings.management_key))
    replicas = with_engine_choice(spec, inputs.engine_choice)
    children += [
        deployment(
            name,
            namespace,
            replicas,
            settings.default_image,
            inputs.stamps,
            inputs.chat_template,
            settings.management_key is not None,
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
                typical_start=inputs.typical_start,
                slo_concurrency=inputs.slo_concurrency,
                budget_limit=inputs.budget_limit,
            )
        )
    if spec.monitoring.service_monitor.enabled:
        children.append(service_monitor(name, namespace, spec))
    children += routing_children(name, namespace, spec, inputs.typical_start, settings.picker_cluster_role)
    # The Job runs the spec's own batch settings, not the engine choice it measures for.
    job = profile_job(
        name, namespace, spec, settings.default_image, inputs.chat_template, inputs.profile_request
    )
    return children + ([job] if job is not None else [])


__all__ = [
    "CHILD_KINDS",
    "DEFAULT_RUNTIME_IMAGE",
    "DEFAULT_SETTINGS",
    "ChildInputs",
    "OperatorSettings",
    "PROFILE_REQUEST_ANNOTATION",
    "RestartStamps",
    "desired_children",
    "labels",
    "selector",
    "selector_string",
    "service_url",
]
