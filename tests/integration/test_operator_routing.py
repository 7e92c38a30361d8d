"""spec.routing on the real control plane: the InferencePool CRD is optional in a cluster (a Degraded reason
that says what to install while it is missing, the pool once it is there), routing off removes every routing
object, and a routed service at zero replicas is Ready (the picker holds requests) while an unrouted one
cannot ask for zero at all (CEL, at admission)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import OperatorProcess, wait_until
from isvc import create, get, patch
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.lab.addons import wait_established
from e2e.lab.cluster import Cluster
from pagoda.operator.api import rules
from pagoda.operator.kube.client import Kube
from pagoda.operator.resources import selector

POOL_CRD = "inferencepools.inference.networking.k8s.io"
POOL_CRD_FILE = "inference.networking.k8s.io_inferencepools.yaml"
POOLS = ("inference.networking.k8s.io/v1", "inferencepools")
ROUTING = {"endpointPicker": {"queueTimeoutSeconds": 120}}
PICKER_KINDS = [
    ("v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io/v1", "roles"),
    ("rbac.authorization.k8s.io/v1", "rolebindings"),
    ("v1", "configmaps"),
    ("apps/v1", "deployments"),
    ("v1", "services"),
]


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return {}


def crd_file(cluster: Cluster) -> Path:
    path = cluster.bin_dir / "crds" / POOL_CRD_FILE
    assert path.is_file(), f"{path} is missing: run `make tools`"
    return path


def crd_present(cluster_api: Any) -> bool:
    try:
        client.ApiextensionsV1Api(cluster_api).read_custom_resource_definition(POOL_CRD)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def install_crd(cluster: Cluster) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd_file(cluster)))
    wait_established(cluster, [f"crd/{POOL_CRD}"], timeout=60)


def test_routing_needs_the_pool_crd_and_goes_away_with_routing_off(
    operator: OperatorProcess,
    cluster: Cluster,
    cluster_api: Any,
    kube: client.CustomObjectsApi,
    raw: Kube,
    namespace: str,
) -> None:
    crd_file(cluster)
    if crd_present(cluster_api):  # the harness installs it; this test needs a cluster without it first
        cluster.kubectl("delete", "crd", POOL_CRD, "--wait=true")
    try:
        create(kube, "routed", namespace, replicas=1, routing=ROUTING)
        degraded = wait_until(
            lambda: (
                (c := condition(get(kube, "routed", namespace), "Degraded")).get("reason")
                == "ApiNotInstalled"
                and c
            ),
            "Degraded ApiNotInstalled",
            90,
        )
        assert "InferencePool" in degraded["message"] and "spec.routing" in degraded["message"]
        # The rest is applied all the same: the picker waits for its pool, the runtime serves via its Service.
        for api_version, plural in PICKER_KINDS:
            assert raw.get(api_version, plural, namespace, "routed-epp") is not None, plural

        install_crd(cluster)
        pool = wait_until(lambda: raw.get(*POOLS, namespace, "routed"), "the InferencePool", 120)
        assert pool["spec"]["selector"]["matchLabels"] == selector("routed")
        assert pool["spec"]["endpointPickerRef"]["name"] == "routed-epp"
        wait_until(
            lambda: condition(get(kube, "routed", namespace), "Degraded").get("status") == "False",
            "Degraded cleared once the CRD is installed",
            90,
        )
        config = raw.get("v1", "configmaps", namespace, "routed-epp")
        assert config is not None
        picker = yaml.safe_load(config["data"]["config.yaml"])
        assert picker["flowControl"]["defaultRequestTTL"] == "120s"
        role = raw.get("rbac.authorization.k8s.io/v1", "roles", namespace, "routed-epp")
        assert role is not None and {"inferencepools"} in [set(r["resources"]) for r in role["rules"]]

        patch(kube, "routed", namespace, {"routing": None})
        wait_until(lambda: raw.get(*POOLS, namespace, "routed") is None, "the InferencePool pruned", 90)
        wait_until(
            lambda: all(raw.get(a, p, namespace, "routed-epp") is None for a, p in PICKER_KINDS),
            "the picker's objects pruned",
            60,
        )
        assert raw.get("apps/v1", "deployments", namespace, "routed") is not None  # the runtime stays
    finally:
        install_crd(cluster)


def test_the_charts_cluster_role_replaces_the_pickers_own_role(
    operator: OperatorProcess, kube: client.CustomObjectsApi, raw: Kube, namespace: str
) -> None:
    """The upgrade to --picker-cluster-role (the chart's, issue #40 §8): the picker's RoleBinding to the
    shared ClusterRole is created under its own name (a roleRef cannot change), and the picker's own Role
    and RoleBinding are pruned after it, so the picker is never without its rights."""
    rbac = "rbac.authorization.k8s.io/v1"
    create(kube, "upgraded", namespace, replicas=1, routing=ROUTING)
    wait_until(
        lambda: raw.get(rbac, "rolebindings", namespace, "upgraded-epp"), "the picker's own binding", 90
    )
    operator.stop()
    operator.extra_args = ["--picker-cluster-role", "pagoda-endpoint-picker"]
    try:
        operator.start()
        binding = wait_until(
            lambda: raw.get(rbac, "rolebindings", namespace, "upgraded-epp-shared"),
            "the binding to the chart's ClusterRole",
            90,
        )
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "pagoda-endpoint-picker",
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "upgraded-epp", "namespace": namespace}
        ]
        wait_until(
            lambda: (
                raw.get(rbac, "roles", namespace, "upgraded-epp") is None
                and raw.get(rbac, "rolebindings", namespace, "upgraded-epp") is None
            ),
            "the picker's own Role and RoleBinding pruned",
            60,
        )
    finally:
        operator.stop()
        operator.extra_args = []
        operator.start()


def test_zero_replicas_are_ready_only_with_routing(
    operator: OperatorProcess,
    cluster: Cluster,
    cluster_api: Any,
    kube: client.CustomObjectsApi,
    raw: Kube,
    namespace: str,
) -> None:
    install_crd(cluster)
    autoscaling = {"minReplicas": 0, "maxReplicas": 2, "targetInFlight": 4}
    monitoring = {"serviceMonitor": {"enabled": True}}
    with pytest.raises(ApiException) as refused:
        create(kube, "zero", namespace, replicas=None, autoscaling=autoscaling, monitoring=monitoring)
    assert refused.value.status == 422 and rules.MSG_SCALE_FROM_ZERO in str(refused.value.body)

    create(
        kube,
        "zero",
        namespace,
        replicas=None,
        autoscaling=autoscaling,
        monitoring=monitoring,
        routing=ROUTING,
    )
    scaled = wait_until(
        lambda: raw.get("keda.sh/v1alpha1", "scaledobjects", namespace, "zero"), "ScaledObject"
    )
    assert scaled["spec"]["minReplicaCount"] == 0
    assert [t["name"] for t in scaled["spec"]["triggers"]] == ["in-flight", "picker-queue"]
    wait_until(lambda: raw.get("apps/v1", "deployments", namespace, "zero"), "the Deployment")
    # What KEDA does after the cooldown with no request held: scale the Deployment to zero.
    client.AppsV1Api(cluster_api).patch_namespaced_deployment_scale(
        "zero", namespace, {"spec": {"replicas": 0}}
    )
    ready = wait_until(
        lambda: (c := condition(get(kube, "zero", namespace), "Ready")).get("reason") == "ScaledToZero" and c,
        "Ready reason ScaledToZero",
        90,
    )
    assert ready["status"] == "True"
