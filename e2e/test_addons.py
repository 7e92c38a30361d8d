"""The e2e add-ons (e2e/lab/addons.py) against the real local control plane: KEDA's metrics adapter serves the
external metrics API through the API server's aggregation layer (TLS verified against the APIService's
caBundle), and kube-state-metrics reports the objects' state."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import pytest

from e2e.lab._objects import request
from e2e.lab.addons import EXTERNAL_METRICS_APISERVICE, EXTERNAL_METRICS_GROUP, Addons, apiservice_condition
from e2e.lab.cluster import Cluster
from e2e.lab.processes import wait_until
from e2e.lab.stack import Stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def addons(stack: Stack) -> Addons:
    return stack.addons


def test_external_metrics_apiservice_is_available(cluster: Cluster, cluster_api: Any, addons: Addons) -> None:
    condition = apiservice_condition(cluster_api)
    assert condition.get("status") == "True", condition
    apiservice = json.loads(
        cluster.kubectl("get", "apiservice", EXTERNAL_METRICS_APISERVICE, "-o", "json").stdout
    )
    assert apiservice["spec"]["caBundle"]
    assert not apiservice["spec"].get("insecureSkipTLSVerify")
    assert apiservice["spec"]["service"]["port"] == addons.keda.adapter_port


def test_external_metrics_api_answers_through_the_api_server(cluster: Cluster, addons: Addons) -> None:
    groups = json.loads(cluster.kubectl("get", "--raw", "/apis").stdout)["groups"]
    assert EXTERNAL_METRICS_GROUP in [group["name"] for group in groups]
    resources = json.loads(cluster.kubectl("get", "--raw", f"/apis/{EXTERNAL_METRICS_GROUP}/v1beta1").stdout)
    assert resources["kind"] == "APIResourceList"
    assert resources["groupVersion"] == f"{EXTERNAL_METRICS_GROUP}/v1beta1"


def _deployment(name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                # kwok's fake nodes only: nothing runs.
                "spec": {"nodeSelector": {"type": "kwok"}, "containers": [{"name": "app", "image": "pause"}]},
            },
        },
    }


def test_kube_state_metrics_reports_deployment_spec_replicas(
    cluster: Cluster, cluster_api: Any, namespace: str, addons: Addons
) -> None:
    ksm = addons.kube_state_metrics
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    status, created = request(cluster_api, "POST", path, _deployment("web", 3))
    assert status == 201, created

    def replicas() -> float | None:
        return ksm.value("kube_deployment_spec_replicas", namespace=namespace, deployment="web")

    wait_until(lambda: replicas() == 3, "kube_deployment_spec_replicas == 3", timeout=60)
    cluster.kubectl("scale", "deployment/web", "--replicas=1", f"--namespace={namespace}")
    wait_until(lambda: replicas() == 1, "kube_deployment_spec_replicas == 1 after scaling", timeout=60)


def _scaled_object(name: str) -> dict[str, Any]:
    """A ScaledObject whose one trigger is a cron window that is closed unless it is 29 February between
    00:00 and 01:00 UTC: its metric is 0, and KEDA needs nothing outside the cluster to compute it."""
    window = {"timezone": "Etc/UTC", "start": "0 0 29 2 *", "end": "0 1 29 2 *", "desiredReplicas": "3"}
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"name": name},
            "minReplicaCount": 1,
            "maxReplicaCount": 4,
            "pollingInterval": 5,
            "triggers": [{"type": "cron", "metadata": window}],
        },
    }


def _conditions(obj: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}


def test_a_scaled_objects_metric_flows_from_keda_through_the_api_server_to_the_hpa(
    cluster: Cluster, cluster_api: Any, namespace: str, addons: Addons
) -> None:
    """operator (scaler) -> gRPC, mutual TLS -> adapter -> aggregation layer -> HPA controller."""
    status, created = request(
        cluster_api, "POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", _deployment("web", 2)
    )
    assert status == 201, created
    so_path = f"/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects"
    status, created = request(cluster_api, "POST", so_path, _scaled_object("web"))
    assert status == 201, created
    wait_until(
        lambda: _conditions(request(cluster_api, "GET", f"{so_path}/web")[1]).get("Ready") == "True",
        "the ScaledObject to be Ready",
        timeout=60,
    )
    hpa_path = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/keda-hpa-web"
    status, hpa = request(cluster_api, "GET", hpa_path)
    assert status == 200, hpa
    metric = hpa["spec"]["metrics"][0]["external"]["metric"]
    selector = ",".join(f"{k}={v}" for k, v in metric["selector"]["matchLabels"].items())

    raw = cluster.kubectl(
        "get",
        "--raw",
        f"/apis/{EXTERNAL_METRICS_GROUP}/v1beta1/namespaces/{namespace}/{metric['name']}"
        f"?labelSelector={urllib.parse.quote(selector)}",
    ).stdout
    values = json.loads(raw)
    assert values["kind"] == "ExternalMetricValueList"
    assert [(v["metricName"], v["value"]) for v in values["items"]] == [(metric["name"], "0")]

    def hpa_reads_the_metric() -> bool:
        status = request(cluster_api, "GET", hpa_path)[1].get("status") or {}
        current = [m["external"]["current"] for m in status.get("currentMetrics") or [] if "external" in m]
        return (
            current == [{"averageValue": "0"}]
            and _conditions({"status": status}).get("ScalingActive") == "True"
        )

    wait_until(hpa_reads_the_metric, "the HPA controller to read the external metric", timeout=60)
