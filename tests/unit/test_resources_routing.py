"""spec.routing's builders: the InferencePool selects exactly the runtime pods, the endpoint picker is never
mistaken for a runtime pod (and the other way round), its config turns flow control on with the spec's
timeout, and the ScaledObject scales on the picker's queue only when routed."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from pagoda.contract import HTTP_PORT
from pagoda.operator.api import InferenceServiceSpec
from pagoda.operator.api.routing import (
    DEFAULT_QUEUE_TIMEOUT_SECONDS,
    RESPONSE_ALLOWANCE_SECONDS,
    waiting_room_seconds,
)
from pagoda.operator.kube.client import KubeError
from pagoda.operator.reconcile.problems import apply_problem
from pagoda.operator.resources import ChildInputs, OperatorSettings, desired_children, labels, selector
from pagoda.operator.resources.routing import (
    CONFIG_DIR,
    CONFIG_FILE,
    CONFIG_HASH_ANNOTATION,
    PICKER_RULES,
    QUEUE_METRIC,
    leader_lease_name,
)
from pagoda.operator.status.report import ready_condition, scale_from_zero_wait

BASE: dict[str, Any] = {
    "model": {"uri": "file:///models/tiny", "servedName": "tiny"},
    "resources": {"gpu": {"count": 1}},
    "autoscaling": {"minReplicas": 0, "maxReplicas": 3, "targetInFlight": 4},
    "monitoring": {"serviceMonitor": {"enabled": True}},
    "routing": {"endpointPicker": {"queueTimeoutSeconds": 240}},
}


def children(spec: dict[str, Any], name: str = "tiny", namespace: str = "ns") -> dict[tuple[str, str], Any]:
    built = desired_children(name, namespace, InferenceServiceSpec.model_validate(spec))
    return {(child["kind"], child["metadata"]["name"]): child for child in built}


def matches(selector_labels: dict[str, str], pod_labels: dict[str, str]) -> bool:
    return all(pod_labels.get(key) == value for key, value in selector_labels.items())


def test_routing_objects_only_with_spec_routing() -> None:
    routed = children(BASE)
    assert {key for key in routed if key[1] == "tiny-epp"} == {
        ("ServiceAccount", "tiny-epp"),
        ("Role", "tiny-epp"),
        ("RoleBinding", "tiny-epp"),
        ("ConfigMap", "tiny-epp"),
        ("Deployment", "tiny-epp"),
        ("Service", "tiny-epp"),
        ("ServiceMonitor", "tiny-epp"),
        ("NetworkPolicy", "tiny-epp"),
    }
    assert ("InferencePool", "tiny") in routed
    assert ("HTTPRoute", "tiny") not in routed  # no gateway named
    plain = {**BASE, "autoscaling": {"maxReplicas": 3}}
    del plain["routing"]
    assert not any(kind in ("InferencePool", "ConfigMap", "Role") for kind, _ in children(plain))


def test_with_the_charts_cluster_role_the_picker_is_bound_to_it_in_its_namespace_only() -> None:
    """--picker-cluster-role (the chart): no Role of the picker's own, whose rules the operator would have to
    hold; a RoleBinding in the service's namespace to the chart's ClusterRole, under a name of its own (a
    roleRef cannot change, so the old `tiny-epp` binding is pruned, not patched)."""
    inputs = ChildInputs(OperatorSettings(picker_cluster_role="pagoda-endpoint-picker"))
    built = desired_children("tiny", "ns", InferenceServiceSpec.model_validate(BASE), inputs)
    by_key = {(child["kind"], child["metadata"]["name"]): child for child in built}
    assert not any(kind == "Role" for kind, _ in by_key)
    assert ("RoleBinding", "tiny-epp") not in by_key
    binding = by_key[("RoleBinding", "tiny-epp-shared")]
    assert binding["metadata"]["namespace"] == "ns"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "pagoda-endpoint-picker",
    }
    pod = by_key[("Deployment", "tiny-epp")]["spec"]["template"]["spec"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "ns"}
    ]
    assert binding["metadata"]["labels"] == by_key[("ServiceAccount", "tiny-epp")]["metadata"]["labels"]


def test_pool_selects_the_runtime_pods_and_never_the_picker() -> None:
    built = children(BASE)
    pool = built[("InferencePool", "tiny")]["spec"]
    runtime_pod = built[("Deployment", "tiny")]["spec"]["template"]["metadata"]["labels"]
    picker_pod = built[("Deployment", "tiny-epp")]["spec"]["template"]["metadata"]["labels"]
    assert pool["selector"]["matchLabels"] == selector("tiny")
    assert pool["targetPorts"] == [{"number": HTTP_PORT}]
    assert pool["endpointPickerRef"]["name"] == "tiny-epp"
    assert matches(pool["selector"]["matchLabels"], runtime_pod)
    assert not matches(pool["selector"]["matchLabels"], picker_pod)
    # Each Service and ServiceMonitor selects its own pods/Services only.
    runtime_svc, picker_svc = built[("Service", "tiny")], built[("Service", "tiny-epp")]
    assert not matches(runtime_svc["spec"]["selector"], picker_pod)
    assert not matches(picker_svc["spec"]["selector"], runtime_pod)
    assert matches(picker_svc["spec"]["selector"], picker_pod)
    runtime_monitor = built[("ServiceMonitor", "tiny")]["spec"]["selector"]["matchLabels"]
    picker_monitor = built[("ServiceMonitor", "tiny-epp")]["spec"]["selector"]["matchLabels"]
    assert matches(runtime_monitor, runtime_svc["metadata"]["labels"])
    assert not matches(runtime_monitor, picker_svc["metadata"]["labels"])
    # A ServiceMonitor selects Services by their labels: the picker's finds the picker's Service (and so its
    # queue metric reaches Prometheus), never the runtime's.
    assert matches(picker_monitor, picker_svc["metadata"]["labels"])
    assert not matches(picker_monitor, runtime_svc["metadata"]["labels"])
    # The picker's pods carry no owner label: the operator's pod watch and status are about runtime pods.
    assert "pagoda.dev/inferenceservice" not in picker_pod
    # Its objects do (the operator finds, watches and prunes them by it).
    for key, child in built.items():
        assert child["metadata"]["labels"]["pagoda.dev/inferenceservice"] == "tiny", key
        assert (
            child["metadata"]["labels"]["app.kubernetes.io/managed-by"]
            == labels("tiny")["app.kubernetes.io/managed-by"]
        )


def test_picker_reads_the_config_the_operator_writes() -> None:
    built = children(BASE)
    deployment = built[("Deployment", "tiny-epp")]["spec"]
    pod = deployment["template"]["spec"]
    args = pod["containers"][0]["args"]
    config_path = args[args.index("--config-file") + 1]
    mount = pod["containers"][0]["volumeMounts"][0]
    assert config_path == f"{mount['mountPath']}/{CONFIG_FILE}" and mount["mountPath"] == CONFIG_DIR
    assert pod["volumes"][0]["configMap"]["name"] == "tiny-epp"
    assert args[args.index("--pool-name") + 1] == "tiny"
    assert args[args.index("--pool-namespace") + 1] == "ns"
    config = yaml.safe_load(built[("ConfigMap", "tiny-epp")]["data"][CONFIG_FILE])
    assert config["kind"] == "EndpointPickerConfig"
    assert config["featureGates"] == ["flowControl"]
    assert config["flowControl"]["defaultRequestTTL"] == "240s"  # never unbounded
    refs = {ref["pluginRef"] for ref in config["schedulingProfiles"][0]["plugins"]}
    assert refs == {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"}
    assert refs <= {plugin["type"] for plugin in config["plugins"]}
    assert pod["serviceAccountName"] == built[("RoleBinding", "tiny-epp")]["subjects"][0]["name"]


def picker(replicas: int | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The picker's pod spec and its Role's rules, at `replicas` (None: the default)."""
    endpoint_picker = {"queueTimeoutSeconds": 240} | ({} if replicas is None else {"replicas": replicas})
    built = children({**BASE, "routing": {"endpointPicker": endpoint_picker}})
    deployment = built[("Deployment", "tiny-epp")]["spec"]
    assert deployment["replicas"] == (2 if replicas is None else replicas)
    assert deployment["strategy"] == {"type": "Recreate"}  # a rolling update would wait for a standby's Ready
    return deployment["template"]["spec"], built[("Role", "tiny-epp")]["rules"]


def test_pickers_elect_a_leader_and_only_the_leader_is_ready() -> None:
    for replicas in (None, 3):  # the default is a leader and a standby
        pod, rules = picker(replicas)
        container = pod["containers"][0]
        assert "--ha-enable-leader-election" in container["args"]
        # The standby answers `liveness` (never restarted for waiting) but not `readiness` (no traffic).
        assert container["livenessProbe"]["grpc"]["service"] == "liveness"
        assert container["readinessProbe"]["grpc"]["service"] == "readiness"
        term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        assert matches(term["podAffinityTerm"]["labelSelector"]["matchLabels"], pod_labels(replicas))
        lease = [rule for rule in rules if rule.get("resourceNames")]
        assert lease == [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": ["epp-ns-tiny.gateway-api-inference-extension.sigs.k8s.io"],
                "verbs": ["get", "update"],
            }
        ]
        assert lease[0]["resourceNames"] == [leader_lease_name("tiny", "ns")]


def pod_labels(replicas: int | None) -> dict[str, str]:
    endpoint_picker = {} if replicas is None else {"replicas": replicas}
    built = children({**BASE, "routing": {"endpointPicker": endpoint_picker}})
    return dict(built[("Deployment", "tiny-epp")]["spec"]["template"]["metadata"]["labels"])


def test_one_picker_runs_without_an_election() -> None:
    pod, rules = picker(1)
    container = pod["containers"][0]
    assert "--ha-enable-leader-election" not in container["args"]
    assert container["livenessProbe"]["grpc"]["service"] == "inference-extension"
    assert container["readinessProbe"]["grpc"]["service"] == "inference-extension"
    assert "affinity" not in pod
    assert rules == PICKER_RULES  # no Lease, no Events


def test_picker_replicas_are_bounded() -> None:
    for replicas in (0, 6):
        with pytest.raises(ValueError, match="replicas"):
            InferenceServiceSpec.model_validate(
                {**BASE, "routing": {"endpointPicker": {"replicas": replicas}}}
            )


def test_lora_affinity_only_with_adapters() -> None:
    def refs(spec: dict[str, Any]) -> list[str]:
        config = yaml.safe_load(children(spec)[("ConfigMap", "tiny-epp")]["data"][CONFIG_FILE])
        return [ref["pluginRef"] for ref in config["schedulingProfiles"][0]["plugins"]]

    assert "lora-affinity-scorer" not in refs(BASE)
    lora = {**BASE, "lora": {"maxLoras": 2, "adapters": [{"name": "sql", "uri": "file:///models/sql"}]}}
    assert refs(lora)[-1] == "lora-affinity-scorer"


def test_a_changed_picker_config_rolls_the_picker() -> None:
    def stamp(timeout: int) -> str:
        spec = {**BASE, "routing": {"endpointPicker": {"queueTimeoutSeconds": timeout}}}
        template = children(spec)[("Deployment", "tiny-epp")]["spec"]["template"]
        return str(template["metadata"]["annotations"][CONFIG_HASH_ANNOTATION])

    assert stamp(240) == stamp(240)
    assert stamp(240) != stamp(300)


def test_scaled_object_scales_on_the_picker_queue_only_when_routed() -> None:
    triggers = children(BASE)[("ScaledObject", "tiny")]["spec"]["triggers"]
    queue = [t for t in triggers if t["name"] == "picker-queue"]
    assert len(queue) == 1
    query = queue[0]["metadata"]["query"]
    assert QUEUE_METRIC in query and 'inference_pool="tiny"' in query and 'namespace="ns"' in query
    assert queue[0]["metadata"]["threshold"] == "4"  # the same per-replica target as the load trigger
    assert children(BASE)[("ScaledObject", "tiny")]["spec"]["minReplicaCount"] == 0
    plain = {**BASE, "autoscaling": {"maxReplicas": 3}}
    del plain["routing"]
    names = [t["name"] for t in children(plain)[("ScaledObject", "tiny")]["spec"]["triggers"]]
    assert names == ["in-flight"]


def test_http_route_points_the_gateway_at_the_pool() -> None:
    spec = {**BASE, "routing": {"gateway": {"name": "inference", "namespace": "gw", "hostnames": ["a.b"]}}}
    route = children(spec)[("HTTPRoute", "tiny")]["spec"]
    assert route["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference", "namespace": "gw"}
    ]
    assert route["hostnames"] == ["a.b"]
    assert route["rules"][0]["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "tiny"}
    ]


@pytest.mark.parametrize(("waiting_room", "ready"), [(300, True), (None, False)])
def test_zero_replicas_are_ready_only_when_a_request_wakes_the_service(
    waiting_room: int | None, ready: bool
) -> None:
    deployment = {"spec": {"replicas": 0}, "status": {}}
    condition = ready_condition(deployment, [], None, waiting_room=waiting_room)
    assert condition.reason == "ScaledToZero" and condition.status is ready
    assert ("up to 300 s" in condition.message) is ready


def owner(spec: dict[str, Any], typical: float | None = None) -> dict[str, Any]:
    status = {"startup": {"typical": {"seconds": typical}}} if typical is not None else {}
    return {"spec": spec, "status": status}


def test_only_an_autoscaled_routed_service_waits_for_a_replica_at_zero() -> None:
    unset = {**BASE, "routing": {}}
    assert scale_from_zero_wait(owner(BASE)) == 240  # the spec's queueTimeoutSeconds
    assert scale_from_zero_wait(owner(unset)) == DEFAULT_QUEUE_TIMEOUT_SECONDS
    assert scale_from_zero_wait(owner(unset, typical=400.0)) == 840  # 2 x 400 s in whole minutes
    fixed = {key: value for key, value in BASE.items() if key != "autoscaling"} | {"replicas": 0}
    assert scale_from_zero_wait(owner(fixed)) is None  # nothing starts a replica
    plain = {key: value for key, value in BASE.items() if key != "routing"}
    assert scale_from_zero_wait(owner(plain)) is None


@pytest.mark.parametrize(
    ("typical", "wait"),
    [(None, 300), (20.0, 300), (150.0, 300), (151.0, 360), (400.0, 840), (1799.0, 3600), (5000.0, 3600)],
)
def test_the_waiting_room_follows_the_measured_cold_start(typical: float | None, wait: int) -> None:
    """Unset, the picker's TTL is twice the typical cold start in whole minutes, within [300, 3600]; the
    gateway's route outlasts it by the response allowance."""
    assert waiting_room_seconds(None, typical) == wait
    assert waiting_room_seconds(45, typical) == 45  # the spec's value wins
    spec = {**BASE, "routing": {"gateway": {"name": "inference"}}}
    built = {
        (child["kind"], child["metadata"]["name"]): child
        for child in desired_children(
            "tiny", "ns", InferenceServiceSpec.model_validate(spec), ChildInputs(typical_start=typical)
        )
    }
    config = yaml.safe_load(built[("ConfigMap", "tiny-epp")]["data"][CONFIG_FILE])
    assert config["flowControl"]["defaultRequestTTL"] == f"{wait}s"
    route = built[("HTTPRoute", "tiny")]["spec"]["rules"][0]
    assert route["timeouts"]["request"] == f"{wait + RESPONSE_ALLOWANCE_SECONDS}s"
    spec["routing"]["gateway"]["requestTimeoutSeconds"] = 90
    assert children(spec)[("HTTPRoute", "tiny")]["spec"]["rules"][0]["timeouts"]["request"] == "90s"


def test_missing_inference_pool_crd_says_what_to_install() -> None:
    manifest = children(BASE)[("InferencePool", "tiny")]
    problem = apply_problem(
        manifest, KubeError(404, "NotFound", "the server could not find the requested resource")
    )
    assert problem.reason == "ApiNotInstalled"
    assert "Gateway API Inference Extension" in problem.message and "spec.routing" in problem.message
