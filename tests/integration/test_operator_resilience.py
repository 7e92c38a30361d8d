"""Drift repair, restart, no writes when idle, and Degraded for what the operator cannot act on."""

from __future__ import annotations

from typing import Any

from harness import OperatorProcess, wait_until
from isvc import condition, create, create_ready, get, wait_ready
from kubernetes import client

from e2e.lab.cluster import Cluster
from pagoda.operator.kube.client import Kube


def test_deleted_and_hand_edited_children_are_restored(
    operator: OperatorProcess,
    cluster: Cluster,
    kube: client.CustomObjectsApi,
    cluster_api: Any,
    raw: Kube,
    namespace: str,
) -> None:
    create_ready(kube, "drift", namespace, replicas=1)
    service = raw.get("v1", "services", namespace, "drift")
    assert service is not None

    cluster.kubectl("delete", "-n", namespace, "service/drift", "--wait=true")
    restored = wait_until(
        lambda: (
            (s := raw.get("v1", "services", namespace, "drift"))
            and s["metadata"]["uid"] != service["metadata"]["uid"]
            and s
        ),
        "the Service re-created",
    )
    assert restored["spec"]["ports"][0]["port"] == 8000

    # A hand edit of a field the operator owns (another field manager, e.g. kubectl edit) is reverted.
    cluster.kubectl(
        "patch",
        "-n",
        namespace,
        "deployment/drift",
        "--type=json",
        "-p",
        '[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":"evil:latest"}]',
    )
    wait_until(
        lambda: (
            (d := raw.get("apps/v1", "deployments", namespace, "drift"))
            and d["spec"]["template"]["spec"]["containers"][0]["image"] != "evil:latest"
        ),
        "the Deployment's image restored",
    )
    cluster.kubectl(
        "patch", "-n", namespace, "pdb/drift", "--type=merge", "-p", '{"spec":{"maxUnavailable":0}}'
    )
    wait_until(
        lambda: (
            (p := raw.get("policy/v1", "poddisruptionbudgets", namespace, "drift"))
            and p["spec"]["maxUnavailable"] == 1
        ),
        "the PDB's maxUnavailable restored",
    )
    core = client.CoreV1Api(cluster_api)

    def reasons() -> set[tuple[str, str]]:
        events = core.list_namespaced_event(namespace).items
        return {(e.reason, e.message) for e in events if e.involved_object.name == "drift"}

    wanted = {("Updated", "Updated Deployment drift"), ("Updated", "Updated PodDisruptionBudget drift")}
    wait_until(lambda: wanted <= reasons(), "an Updated Event per repaired child")


def test_no_api_writes_when_idle(
    operator: OperatorProcess, kube: client.CustomObjectsApi, cluster_api: Any, namespace: str
) -> None:
    create_ready(kube, "idle", namespace, replicas=1)
    # Earlier tests' namespaces being torn down are real changes (their status goes not-Ready): let them go.
    core = client.CoreV1Api(cluster_api)
    wait_until(
        lambda: (
            [n.metadata.name for n in core.list_namespace(label_selector="pagoda.dev/test=true").items]
            == [namespace]
        ),
        "other test namespaces to be deleted",
        120,
    )
    seen = operator.resyncs()
    wait_until(lambda: operator.resyncs() >= seen + 1, "a periodic resync", 30)
    writes = operator.writes()
    unchanged = operator.total("pagoda_operator_reconciles_total", result="unchanged")
    seen = operator.resyncs()
    wait_until(lambda: operator.resyncs() >= seen + 2, "two more resyncs", 30)
    assert operator.total("pagoda_operator_reconciles_total", result="unchanged") > unchanged
    assert operator.writes() == writes, "the operator wrote to the API server while nothing changed"


def test_restart_resumes_without_writes(
    operator: OperatorProcess, raw: Kube, kube: client.CustomObjectsApi, namespace: str
) -> None:
    create_ready(kube, "before", namespace, replicas=1)
    operator.kill()
    create(kube, "during", namespace, replicas=1)  # created while no operator runs
    operator.start()
    wait_ready(kube, "during", namespace, "the new object Ready after restart")
    wait_until(
        lambda: operator.total("pagoda_operator_reconciles_total", result="unchanged") >= 1,
        "the existing object re-checked",
    )
    # The fresh process wrote only for the object created while it was down.
    # The ConfigMap counts only the new object's management key: the restarted operator signs with the key
    # it stored, so "before" keeps its public key.
    for kind in ("Deployment", "Service", "PodDisruptionBudget", "ConfigMap"):
        assert operator.total("pagoda_operator_api_writes_total", kind=kind, verb="apply") == 1, kind
    assert raw.get("apps/v1", "deployments", namespace, "before") is not None


def test_missing_secret_is_degraded_until_created(
    operator: OperatorProcess, kube: client.CustomObjectsApi, cluster_api: Any, namespace: str
) -> None:
    create(kube, "secret", namespace, replicas=1, model={"credentialsSecret": "hf-token"})

    def degraded() -> dict[str, Any]:
        cond = condition(get(kube, "secret", namespace), "Degraded")
        return cond if cond.get("status") == "True" else {}

    cond = wait_until(degraded, "Degraded=True")
    assert cond["reason"] == "SecretNotFound" and "hf-token" in cond["message"]
    core = client.CoreV1Api(cluster_api)
    wait_until(
        lambda: any(
            e.type == "Warning" and e.reason == "SecretNotFound"
            for e in core.list_namespaced_event(namespace).items
        ),
        "a Warning Event SecretNotFound",
    )
    client.CoreV1Api(cluster_api).create_namespaced_secret(
        namespace, {"metadata": {"name": "hf-token"}, "stringData": {"HF_TOKEN": "x"}}
    )
    # No watch on Secrets: the periodic resync notices.
    wait_ready(kube, "secret", namespace, "Degraded=False and Ready")
