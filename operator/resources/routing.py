"""spec.routing: the InferencePool of the runtime pods and the endpoint picker that serves it, as GIE v1.5.0's
own chart (config/charts/inferencepool) deploys them per pool, plus an optional HTTPRoute to a Gateway.
One file over 400 lines on purpose: the pool, the picker with its RBAC, and the route are built as one unit.

The picker's objects are named `<name>-epp` and carry the owner's labels (so the operator finds, watches and
prunes them), except app.kubernetes.io/name, which names the picker: the runtime's Service and ServiceMonitor
select on `pagoda-runtime` and must not pick up the picker. The picker's pods carry no owner label at all:
the operator's pod watch, status and capacity reads are about runtime pods only.
"""

from __future__ import annotations

from typing import Any

import yaml

from pagoda.contract import HTTP_PORT
from pagoda.operator.api import InferenceServiceSpec, RoutingSpec, ServiceMonitorSpec
from pagoda.operator.api.routing import RESPONSE_ALLOWANCE_SECONDS, waiting_room_seconds

from .meta import content_hash, labels, metadata, selector
from .quantity import canonical

PICKER_NAME = "pagoda-endpoint-picker"
PICKER_LABEL = "pagoda.dev/endpoint-picker"
POOL_API_VERSION = "inference.networking.k8s.io/v1"
POOL_GROUP = "inference.networking.k8s.io"
EXTENSION_GROUP = "inference.networking.x-k8s.io"
GRPC_PORT = 9002
HEALTH_PORT = 9003
METRICS_PORT = 9090
CONFIG_DIR = "/config"
CONFIG_FILE = "config.yaml"
# The picker's gRPC health services as GIE's chart probes them. One replica: "inference-extension" (serving
# once the pool has synced) for both probes. With leader election: "liveness" (always serving, so that a
# standby is not restarted) and "readiness" (only the leader, once synced: the Service's one endpoint).
HEALTH_SERVICE = "inference-extension"
LIVENESS_SERVICE = "liveness"
READINESS_SERVICE = "readiness"
# Up to the runtime pods' longest drain (GIE's chart: "should mirror the longest grace period in the pool").
PICKER_GRACE_SECONDS = 130
# The picker's own Prometheus metric of requests its flow control holds (the scale-from-zero signal).
QUEUE_METRIC = "inference_extension_flow_control_queue_size"
CONFIG_HASH_ANNOTATION = "pagoda.dev/config-hash"
RUN_AS_USER = 65532  # the distroless image's nonroot user


def picker_name(name: str) -> str:
    return f"{name}-epp"


def picker_selector(name: str) -> dict[str, str]:
    """matchLabels of the picker's Deployment and Service: never the runtime pods'."""
    return {"app.kubernetes.io/name": PICKER_NAME, PICKER_LABEL: name}


def picker_metadata(name: str, namespace: str) -> dict[str, Any]:
    """The picker objects' metadata. Their labels include picker_selector's, so that the picker's
    ServiceMonitor, which selects Services by those, finds the picker's Service."""
    child_labels = {
        **labels(name),
        **picker_selector(name),
        "app.kubernetes.io/component": "endpoint-picker",
    }
    return {"name": picker_name(name), "namespace": namespace, "labels": child_labels}


def routing_children(
    name: str,
    namespace: str,
    spec: InferenceServiceSpec,
    typical_start: float | None = None,
    picker_cluster_role: str | None = None,
) -> list[dict[str, Any]]:
    """Every routing object spec.routing asks for, in apply order: the picker's identity and config before
    its Deployment, the pool before the route that points at it. `typical_start`: the service's typical
    cold start in seconds (status.startup.typical), which sizes the picker's waiting room unless the spec
    sets it (api/routing.py waiting_room_seconds). `picker_cluster_role`: the ClusterRole the chart installs
    with PICKER_CLUSTER_RULES (--picker-cluster-role), bound in the service's namespace only; without it the
    picker gets a Role of its own (picker_rules), which the operator may grant only if it holds every rule
    of it in that namespace."""
    routing = spec.routing
    if routing is None:
        return []
    wait = waiting_room_seconds(routing.endpoint_picker.queue_timeout_seconds, typical_start)
    if picker_cluster_role is not None:
        identity = [
            service_account(name, namespace),
            shared_role_binding(name, namespace, picker_cluster_role),
        ]
    else:
        identity = [
            service_account(name, namespace),
            role(name, namespace, routing.endpoint_picker.replicas),
            role_binding(name, namespace),
        ]
    children = [
        *identity,
        config_map(name, namespace, spec, wait),
        picker_deployment(name, namespace, spec, wait),
        picker_service(name, namespace),
        inference_pool(name, namespace, routing),
    ]
    if spec.monitoring.service_monitor.enabled:
        children.append(picker_service_monitor(name, namespace, spec.monitoring.service_monitor))
    if routing.gateway is not None:
        children.append(http_route(name, namespace, routing, wait))
    return children


def inference_pool(name: str, namespace: str, routing: RoutingSpec) -> dict[str, Any]:
    """The runtime pods (the Service's selector) on the runtime's port, served by this service's picker."""
    body = {
        "selector": {"matchLabels": selector(name)},
        "targetPorts": [{"number": HTTP_PORT}],
        "appProtocol": "http",
        "endpointPickerRef": {
            "name": picker_name(name),
            "port": {"number": GRPC_PORT},
            "failureMode": routing.endpoint_picker.failure_mode,
        },
    }
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": "InferencePool",
        "metadata": metadata(name, namespace),
        "spec": body,
    }


def picker_config(spec: InferenceServiceSpec, wait_seconds: int) -> dict[str, Any]:
    """The picker's EndpointPickerConfig: GIE's default scorers (queue depth, KV-cache usage, prefix-cache
    affinity, weighted as its chart does), with spec.lora also LoRA affinity (a replica that already has the
    request's adapter loaded, from the runtime's vllm:lora_requests_info), and flow control, which holds
    requests while the pool is saturated or has no ready replica, for at most `wait_seconds` (the waiting
    room; then 503)."""
    assert spec.routing is not None
    scorers = [("queue-scorer", 2), ("kv-cache-utilization-scorer", 2), ("prefix-cache-scorer", 3)]
    if spec.lora is not None:
        scorers.append(("lora-affinity-scorer", 1))
    return {
        "apiVersion": f"{EXTENSION_GROUP}/v1alpha1",
        "kind": "EndpointPickerConfig",
        "featureGates": ["flowControl"],
        "plugins": [
            *({"type": scorer} for scorer, _ in scorers),
            {"type": "metrics-data-source", "parameters": {"scheme": "http", "path": "/metrics"}},
            {"type": "core-metrics-extractor"},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [{"pluginRef": scorer, "weight": weight} for scorer, weight in scorers],
            }
        ],
        "flowControl": {"defaultRequestTTL": f"{wait_seconds}s"},
    }


def render_config(spec: InferenceServiceSpec, wait_seconds: int) -> str:
    return yaml.safe_dump(picker_config(spec, wait_seconds), sort_keys=False)


def config_map(name: str, namespace: str, spec: InferenceServiceSpec, wait_seconds: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": picker_metadata(name, namespace),
        "data": {CONFIG_FILE: render_config(spec, wait_seconds)},
    }


def leader_lease_name(name: str, namespace: str) -> str:
    """The Lease the picker's replicas elect a leader on (GIE's epp names it so, in the pool's namespace)."""
    return f"epp-{namespace}-{name}.gateway-api-inference-extension.sigs.k8s.io"


def picker_args(name: str, namespace: str, replicas: int = 1) -> list[str]:
    """The picker's command line as GIE's chart writes it for one pool (pool mode; metrics without auth,
    since the ServiceMonitor scrapes them like the runtime's); leader election with more than one replica."""
    leader = ["--ha-enable-leader-election"] if replicas > 1 else []
    return [
        "--pool-name",
        name,
        "--pool-namespace",
        namespace,
        "--pool-group",
        POOL_GROUP,
        "--config-file",
        f"{CONFIG_DIR}/{CONFIG_FILE}",
        "--grpc-port",
        str(GRPC_PORT),
        "--grpc-health-port",
        str(HEALTH_PORT),
        "--metrics-port",
        str(METRICS_PORT),
        "--metrics-endpoint-auth=false",
        "--tracing=false",
        "--zap-encoder",
        "json",
        "--v",
        "1",
        *leader,
    ]


def picker_deployment(
    name: str, namespace: str, spec: InferenceServiceSpec, wait_seconds: int
) -> dict[str, Any]:
    assert spec.routing is not None
    picker = spec.routing.endpoint_picker
    memory = canonical(picker.memory)
    elects = picker.replicas > 1
    live = LIVENESS_SERVICE if elects else HEALTH_SERVICE
    ready = READINESS_SERVICE if elects else HEALTH_SERVICE
    container = {
        "name": "epp",
        "image": picker.image,
        "args": picker_args(name, namespace, picker.replicas),
        "env": [
            {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "ports": [
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": {
            "requests": {"cpu": canonical(picker.cpu), "memory": memory},
            "limits": {"memory": memory},
        },
        "livenessProbe": {
            "grpc": {"port": HEALTH_PORT, "service": live},
            "initialDelaySeconds": 5,
            "periodSeconds": 10,
        },
        "readinessProbe": {"grpc": {"port": HEALTH_PORT, "service": ready}, "periodSeconds": 2},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
    }
    # The picker reads its config once at start: a changed config rolls the picker.
    config_hash = content_hash(render_config(spec, wait_seconds))
    template = {
        "metadata": {
            "labels": {**picker_selector(name), "app.kubernetes.io/instance": name},
            "annotations": {CONFIG_HASH_ANNOTATION: config_hash},
        },
        "spec": {
            "serviceAccountName": picker_name(name),
            "terminationGracePeriodSeconds": PICKER_GRACE_SECONDS,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": RUN_AS_USER,
                "runAsGroup": RUN_AS_USER,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [container],
            "volumes": [{"name": "config", "configMap": {"name": picker_name(name)}}],
            **({"affinity": _apart(name)} if elects else {}),
        },
    }
    body = {
        # One active picker (the leader, when several): its prefix-cache index lives in memory. Recreate, as
        # in GIE's chart: a rolling update would wait forever for a new replica to be Ready, and only a
        # leader is. So a change to the picker restarts every replica at once, and routing waits for one.
        "replicas": picker.replicas,
        "strategy": {"type": "Recreate"},
        "selector": {"matchLabels": picker_selector(name)},
        "template": template,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": picker_metadata(name, namespace),
        "spec": body,
    }


def _apart(name: str) -> dict[str, Any]:
    """The picker's replicas on different nodes where there is room: one node lost takes one replica."""
    term = {"labelSelector": {"matchLabels": picker_selector(name)}, "topologyKey": "kubernetes.io/hostname"}
    return {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]
        }
    }


def picker_service(name: str, namespace: str) -> dict[str, Any]:
    body = {
        "type": "ClusterIP",
        "selector": picker_selector(name),
        "ports": [
            {"name": "grpc-ext-proc", "port": GRPC_PORT, "targetPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "http-metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT, "protocol": "TCP"},
        ],
    }
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": picker_metadata(name, namespace),
        "spec": body,
    }


def picker_service_monitor(name: str, namespace: str, monitor: ServiceMonitorSpec) -> dict[str, Any]:
    """The picker's metrics (its flow-control queue drives scaling from zero), scraped like the runtime's."""
    meta = picker_metadata(name, namespace)
    meta["labels"] = {**monitor.labels, **meta["labels"]}
    body = {
        "selector": {"matchLabels": picker_selector(name)},
        "endpoints": [{"port": "http-metrics", "path": "/metrics", "interval": monitor.interval}],
    }
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta,
        "spec": body,
    }


def service_account(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": picker_metadata(name, namespace)}


# What the picker reads (GIE's chart: the pool, the pods, InferenceObjectives and InferenceModelRewrites).
PICKER_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": ["get", "list", "watch"]},
    {
        "apiGroups": [EXTENSION_GROUP],
        "resources": ["inferenceobjectives", "inferencemodelrewrites"],
        "verbs": ["get", "list", "watch"],
    },
]


# What leader election needs besides (client-go's Lease lock): read, create and renew the Lease; the Event
# it records on a new leader. `get` and `update` only on the pool's own Lease (RBAC cannot limit `create`).
LEADER_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]


def picker_rules(name: str, namespace: str, replicas: int) -> list[dict[str, Any]]:
    if replicas == 1:
        return PICKER_RULES
    lease = {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": [leader_lease_name(name, namespace)],
        "verbs": ["get", "update"],
    }
    return [*PICKER_RULES, lease, *LEADER_RULES]


# The chart's ClusterRole for every picker (`<release>-endpoint-picker`), bound by a RoleBinding in each
# routed service's namespace: what picker_rules grants, with `get` and `update` on every Lease of that
# namespace, not only the pool's own (a ClusterRole cannot name a Lease per pool). The operator then holds
# no Lease permission outside its own namespace: the chart grants it `bind` on this one ClusterRole instead,
# which RBAC's escalation check accepts in place of holding the rules themselves.
PICKER_CLUSTER_RULES: list[dict[str, Any]] = [
    *PICKER_RULES,
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]


def role(name: str, namespace: str, replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": picker_metadata(name, namespace),
        "rules": picker_rules(name, namespace, replicas),
    }


def role_binding(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": picker_metadata(name, namespace),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": picker_name(name)},
        "subjects": [{"kind": "ServiceAccount", "name": picker_name(name), "namespace": namespace}],
    }


def shared_role_binding(name: str, namespace: str, cluster_role: str) -> dict[str, Any]:
    """The picker's ServiceAccount bound to the chart's ClusterRole in this namespace. Its own name
    (`<name>-epp-shared`): a RoleBinding's roleRef cannot change, so the binding to the picker's own Role
    (an operator run without --picker-cluster-role, or before it) is pruned and this one created beside."""
    meta = picker_metadata(name, namespace)
    meta["name"] = f"{picker_name(name)}-shared"
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"kind": "ServiceAccount", "name": picker_name(name), "namespace": namespace}],
    }


def http_route(name: str, namespace: str, routing: RoutingSpec, wait_seconds: int) -> dict[str, Any]:
    """Attach the pool to the user's Gateway: every path of the listener (or of `hostnames`), with a request
    timeout that outlasts the picker's waiting room (`wait_seconds`) unless the spec sets one."""
    gateway = routing.gateway
    assert gateway is not None
    request_timeout = gateway.request_timeout_seconds or wait_seconds + RESPONSE_ALLOWANCE_SECONDS
    parent: dict[str, Any] = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gateway.name}
    if gateway.namespace:
        parent["namespace"] = gateway.namespace
    rule = {
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
        "backendRefs": [{"group": POOL_GROUP, "kind": "InferencePool", "name": name}],
        "timeouts": {"request": f"{request_timeout}s"},
    }
    body: dict[str, Any] = {"parentRefs": [parent], "rules": [rule]}
    if gateway.hostnames:
        body["hostnames"] = list(gateway.hostnames)
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": metadata(name, namespace),
        "spec": body,
    }
