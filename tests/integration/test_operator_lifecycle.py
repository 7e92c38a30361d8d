"""Create -> children with the right fields and Ready status; spec change -> rollout; delete -> GC."""

from __future__ import annotations

from typing import Any

from harness import OperatorProcess, wait_until
from isvc import (
    condition,
    create,
    create_ready,
    get,
    managed_fields_of,
    patch,
    wait_ready,
)
from kubernetes import client

from pagoda.operator.api import CONDITION_TYPES
from pagoda.operator.kube.client import Kube
from pagoda.operator.resources.meta import OWNER_LABEL

CHILD_LABELS = {
    "app.kubernetes.io/name": "pagoda-runtime",
    "app.kubernetes.io/managed-by": "pagoda-operator",
}


def children(kube: Kube, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    found = {}
    for api_version, plural, kind in [
        ("apps/v1", "deployments", "Deployment"),
        ("v1", "services", "Service"),
        ("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget"),
        ("keda.sh/v1alpha1", "scaledobjects", "ScaledObject"),
        ("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy"),
    ]:
        obj = kube.get(api_version, plural, namespace, name)
        if obj is not None:
            found[kind] = obj
    return found


def test_create_builds_children_and_reports_ready(
    operator: OperatorProcess, kube: client.CustomObjectsApi, cluster_api: Any, raw: Kube, namespace: str
) -> None:
    owner = create(kube, "llm", namespace)
    found = wait_until(
        lambda: (
            (c := children(raw, namespace, "llm"))
            and {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"} <= set(c)
            and c
        ),
        "the Deployment, Service, PDB and NetworkPolicy",
    )
    assert "ScaledObject" not in found  # fixed replicas: no autoscaler
    for kind, obj in found.items():
        meta = obj["metadata"]
        assert (
            meta["labels"].items()
            >= {**CHILD_LABELS, OWNER_LABEL: "llm", "app.kubernetes.io/instance": "llm"}.items()
        ), kind
        (ref,) = meta["ownerReferences"]
        assert (ref["uid"], ref["kind"], ref["controller"], ref["blockOwnerDeletion"]) == (
            owner["metadata"]["uid"],
            "InferenceService",
            True,
            True,
        ), kind
        assert managed_fields_of(obj, "pagoda-operator"), (
            f"{kind} is not applied by the pagoda-operator manager"
        )

    deployment = found["Deployment"]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "pagoda-runtime",
        OWNER_LABEL: "llm",
    }
    pod = deployment["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "runtime"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] in ("1", 1)
    args = container.get("args", []) + container.get("command", [])
    assert "hf://pagoda-test/tiny-llama" in args and "--max-model-len" in args
    assert {"name": "http", "containerPort": 8000}.items() <= next(
        p for p in container["ports"] if p["name"] == "http"
    ).items()
    service = found["Service"]
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("http", 8000, "http")
    assert found["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1
    # The NetworkPolicy (accepted by the real API server's validation) admits the runtime port only.
    policy = found["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert [rule["ports"] for rule in policy["ingress"]] == [[{"protocol": "TCP", "port": 8000}]]

    # Status: Ready once kwok's pods are Ready; everything the scale subresource and kubectl need.
    obj = wait_ready(kube, "llm", namespace)
    status = obj["status"]
    assert (status["replicas"], status["readyReplicas"]) == (2, 2)
    assert status["url"] == f"http://llm.{namespace}.svc:8000"
    assert status["selector"] == f"app.kubernetes.io/name=pagoda-runtime,{OWNER_LABEL}=llm"
    for type_ in CONDITION_TYPES:
        cond = condition(obj, type_)
        assert cond["observedGeneration"] == obj["metadata"]["generation"] and cond["lastTransitionTime"], (
            type_
        )
    # kopf wrote nothing onto the user's object: no finalizer, no annotations of its own.
    assert not obj["metadata"].get("finalizers")
    assert not [a for a in obj["metadata"].get("annotations") or {} if "kopf" in a]
    # One Kubernetes Event for the pass that created the children, naming each.
    events = client.CoreV1Api(cluster_api).list_namespaced_event(namespace).items
    messages = [e.message for e in events if e.involved_object.name == "llm" and e.reason == "Created"]
    assert messages == [
        "Created NetworkPolicy llm, ConfigMap llm-management, Deployment llm, Service llm, "
        "PodDisruptionBudget llm"
    ]


def test_spec_change_rolls_out(
    operator: OperatorProcess, kube: client.CustomObjectsApi, raw: Kube, namespace: str
) -> None:
    create_ready(kube, "roll", namespace, replicas=1)
    before = raw.get("apps/v1", "deployments", namespace, "roll")
    assert before is not None
    patch(kube, "roll", namespace, {"engine": {"maxModelLen": 4096}})

    def rolled() -> bool:
        dep = raw.get("apps/v1", "deployments", namespace, "roll")
        args = dep["spec"]["template"]["spec"]["containers"][0].get("args", []) if dep else []
        return "4096" in args

    wait_until(rolled, "the Deployment's template to carry --max-model-len 4096")

    def replica_sets() -> list[dict[str, Any]] | None:
        found = raw.list("apps/v1", "replicasets", namespace, f"{OWNER_LABEL}=roll")
        return found if len(found) >= 2 else None

    sets = wait_until(replica_sets, "a second ReplicaSet (a rollout)")
    # Both belong to the one Deployment and run different pod templates: the old spec and the new one.
    assert {ref["uid"] for rs in sets for ref in rs["metadata"]["ownerReferences"]} == {
        before["metadata"]["uid"]
    }
    assert len({rs["metadata"]["labels"]["pod-template-hash"] for rs in sets}) == len(sets)
    obj = wait_ready(kube, "roll", namespace, "Ready again")
    assert obj["status"]["observedGeneration"] == 2
    after = raw.get("apps/v1", "deployments", namespace, "roll")
    assert after is not None and after["metadata"]["uid"] == before["metadata"]["uid"]  # updated in place


def test_delete_removes_children_by_garbage_collection(
    operator: OperatorProcess, kube: client.CustomObjectsApi, raw: Kube, namespace: str
) -> None:
    autoscaling = {"minReplicas": 1, "maxReplicas": 3, "metricsSource": "External"}
    create(kube, "gone", namespace, replicas=None, autoscaling=autoscaling)
    wait_until(lambda: len(children(raw, namespace, "gone")) == 5, "all five children")
    kube.delete_namespaced_custom_object("pagoda.dev", "v1alpha1", namespace, "inferenceservices", "gone")
    wait_until(
        lambda: not children(raw, namespace, "gone"), "the garbage collector to delete every child", 90
    )
    assert get(kube, "gone", namespace) is None


def test_network_policy_opt_out_deletes_it_and_opting_in_brings_it_back(
    operator: OperatorProcess, kube: client.CustomObjectsApi, raw: Kube, namespace: str
) -> None:
    create(kube, "open", namespace, replicas=1)

    def policy() -> dict[str, Any] | None:
        return raw.get("networking.k8s.io/v1", "networkpolicies", namespace, "open")

    wait_until(policy, "the NetworkPolicy")
    patch(kube, "open", namespace, {"networkPolicy": {"enabled": False}})
    wait_until(lambda: policy() is None, "the operator to delete the NetworkPolicy")
    assert raw.get("apps/v1", "deployments", namespace, "open") is not None  # nothing else went
    allow = [{"namespace": "apps", "podLabels": {"app": "chat"}}]
    patch(kube, "open", namespace, {"networkPolicy": {"enabled": True, "allowFrom": allow}})
    back = wait_until(policy, "the NetworkPolicy again")
    peers = back["spec"]["ingress"][0]["from"]
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}},
        "podSelector": {"matchLabels": {"app": "chat"}},
    } in peers
