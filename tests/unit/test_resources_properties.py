"""Properties every set of children keeps, over the examples and variants of them."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
from fakekube import deployment_of

from pagoda.contract import IMAGE_MODEL_DIR
from pagoda.operator.api import InferenceServiceSpec
from pagoda.operator.resources import (
    CHILD_KINDS,
    ChildInputs,
    OperatorSettings,
    desired_children,
    labels,
    selector,
    selector_string,
)
from pagoda.operator.resources.pod import termination_grace_seconds
from pagoda.runtime.models.sources import parse_model_uri

OWNER_LABELS = {
    "app.kubernetes.io/name": "pagoda-runtime",
    "app.kubernetes.io/managed-by": "pagoda-operator",
}


def _variants(base: dict[str, Any]) -> list[dict[str, Any]]:
    """The base spec with scaling, monitoring and credentials switched on and off."""
    out = []
    scalings = [{"autoscaling": {"maxReplicas": 3}}, {"replicas": 2}, {}]
    for scaling, monitor, secret in itertools.product(scalings, (True, False), (True, False)):
        spec = copy.deepcopy(base)
        spec.pop("autoscaling", None)
        spec.pop("replicas", None)
        spec.update(copy.deepcopy(scaling))
        spec["monitoring"] = {"serviceMonitor": {"enabled": monitor}}
        if "autoscaling" in spec and not monitor:
            spec["autoscaling"]["metricsSource"] = "External"  # autoscaling needs a metrics source
        if not secret:
            spec["model"].pop("credentialsSecret", None)
        out.append(spec)
    return out


def _children(name: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    return desired_children(name, "ns-1", InferenceServiceSpec.model_validate(spec))


def _by_kind(children: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The runtime's child of each kind: the first (with spec.routing the endpoint picker's Deployment,
    Service and ServiceMonitor come later, see test_resources_routing.py)."""
    by_kind: dict[str, dict[str, Any]] = {}
    for child in children:
        by_kind.setdefault(child["kind"], child)
    return by_kind


def test_labels_and_selector_contract() -> None:
    assert labels("a") == {
        "app.kubernetes.io/name": "pagoda-runtime",
        "app.kubernetes.io/instance": "a",
        "app.kubernetes.io/managed-by": "pagoda-operator",
        "pagoda.dev/inferenceservice": "a",
    }
    assert selector("a") == {"app.kubernetes.io/name": "pagoda-runtime", "pagoda.dev/inferenceservice": "a"}
    assert selector_string("a") == "app.kubernetes.io/name=pagoda-runtime,pagoda.dev/inferenceservice=a"


def test_every_variant_keeps_the_properties(example: dict[str, Any]) -> None:
    name = example["metadata"]["name"]
    for spec in _variants(example["spec"]):
        children = _children(name, spec)
        keys = [(child["apiVersion"], child["kind"], child["metadata"]["name"]) for child in children]
        assert len(set(keys)) == len(keys)
        assert {key[:2] for key in keys} <= {(api, kind) for api, kind, _ in CHILD_KINDS}
        owner_labels = {k: v for k, v in labels(name).items() if k != "app.kubernetes.io/name"}
        for child in children:
            meta = child["metadata"]
            # The runtime's children are named like the service; the endpoint picker's (spec.routing) -epp;
            # the capacity profile's Job (spec.slo) -profile-<digest of its template>.
            if child["kind"] == "Job":
                assert meta["name"].startswith(f"{name}-profile-")
            else:
                assert meta["name"] in (name, f"{name}-epp")
            assert meta["namespace"] == "ns-1"
            expected = labels(name) if meta["name"] == name or child["kind"] == "Job" else owner_labels
            assert expected.items() <= meta["labels"].items(), child["kind"]
            assert "ownerReferences" not in meta
        by_kind = _by_kind(children)
        _check_selectors(name, by_kind)
        _check_scaling(spec, by_kind)
        assert ("ServiceMonitor" in by_kind) is spec["monitoring"]["serviceMonitor"]["enabled"]


def _check_selectors(name: str, by_kind: dict[str, dict[str, Any]]) -> None:
    deployment = by_kind["Deployment"]
    for selected in (
        deployment["spec"]["selector"]["matchLabels"],
        by_kind["Service"]["spec"]["selector"],
        by_kind["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
    ):
        assert selected == selector(name)
        assert not any("version" in key or "revision" in key or "hash" in key for key in selected)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector(name).items() <= pod_labels.items()


def _check_scaling(spec: dict[str, Any], by_kind: dict[str, dict[str, Any]]) -> None:
    deployment = by_kind["Deployment"]["spec"]
    if "autoscaling" in spec:
        assert "replicas" not in deployment, "KEDA's HPA owns replicas of an autoscaled Deployment"
        target = by_kind["ScaledObject"]["spec"]["scaleTargetRef"]
        assert target == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": by_kind["Deployment"]["metadata"]["name"],
        }
    else:
        assert "ScaledObject" not in by_kind
        assert deployment["replicas"] == spec.get("replicas", 1)


def test_gpu_request_matches_tensor_parallelism(example: dict[str, Any]) -> None:
    spec = InferenceServiceSpec.model_validate(example["spec"])
    container = _by_kind(_children("x", example["spec"]))["Deployment"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    gpus = container["resources"]["limits"][spec.resources.gpu.resource_name]
    assert gpus == container["resources"]["requests"][spec.resources.gpu.resource_name]
    args = container["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == gpus == str(spec.resources.gpu.count)


def test_pod_is_restricted_and_drains(example: dict[str, Any]) -> None:
    spec = InferenceServiceSpec.model_validate(example["spec"])
    pod = _by_kind(_children("x", example["spec"]))["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"] == {"drop": ["ALL"]}
    assert security["runAsNonRoot"] is True and pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in security
    sleep = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = int(container["args"][container["args"].index("--drain-timeout") + 1])
    assert pod["terminationGracePeriodSeconds"] > sleep + drain
    assert pod["terminationGracePeriodSeconds"] == termination_grace_seconds(spec)
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= spec.runtime.startup_timeout_seconds
    assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert mounts["/var/cache/pagoda"] in volumes
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_service_and_pdb(example: dict[str, Any]) -> None:
    spec = InferenceServiceSpec.model_validate(example["spec"])
    by_kind = _by_kind(_children("x", example["spec"]))
    (port,) = by_kind["Service"]["spec"]["ports"]
    tls = {"appProtocol": "https"} if spec.runtime.tls is not None else {}
    assert port == {"name": "http", "port": spec.service.port, "targetPort": "http", "protocol": "TCP", **tls}
    assert by_kind["PodDisruptionBudget"]["spec"]["maxUnavailable"] == spec.disruption.max_unavailable


def _scaled_object(spec: dict[str, Any]) -> dict[str, Any]:
    children = desired_children("llama", "team-a", InferenceServiceSpec.model_validate(spec))
    scaled: dict[str, Any] = _by_kind(children)["ScaledObject"]["spec"]
    return scaled


def test_scaled_object_queries_only_this_service(llama_spec: dict[str, Any]) -> None:
    llama_spec["autoscaling"]["kvCacheUsage"] = {"targetRatio": 0.8}
    scaled = _scaled_object(llama_spec)
    queue, kv = scaled["triggers"]
    # targetQueueDepth without `metric` (the API before it existed) keeps scaling on the queue depth.
    assert queue["name"] == "queue-depth"
    assert queue["metadata"]["query"] == QUEUE_QUERY
    assert queue["metricType"] == "AverageValue" and queue["metadata"]["threshold"] == "5"
    assert kv["metadata"]["query"] == (
        '(max(pagoda_kv_cache_usage_ratio{namespace="team-a",service="llama"}))' + NO_TARGETS
    )
    assert kv["metadata"]["threshold"] == "0.8"
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (1, 4)
    behavior = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == scaled["cooldownPeriod"] == 300


def test_vanished_metrics_hold_the_replicas_instead_of_scaling_in(llama_spec: dict[str, Any]) -> None:
    """An empty answer (the scrape or Prometheus down) is a failure, not 0, on the replicas' triggers; KEDA's
    fallback then keeps the current replicas (at least the minimum) until the queries answer again."""
    llama_spec["autoscaling"]["kvCacheUsage"] = {"targetRatio": 0.8}
    llama_spec["routing"] = {}
    scaled = _scaled_object(llama_spec)
    assert len(scaled["triggers"]) == 3
    nulls = {t["name"]: t["metadata"].get("ignoreNullValues") for t in scaled["triggers"]}
    # The picker's queue has no series while nothing waits: that one reads as 0, or no scale to zero.
    assert nulls == {"queue-depth": "false", "picker-queue": None, "kv-cache-usage": "false"}, nulls
    assert scaled["fallback"] == {
        "failureThreshold": 3,
        "replicas": max(scaled["minReplicaCount"], 1),
        "behavior": "currentReplicasIfHigher",
    }
    # KEDA accepts a fallback only with a trigger of type AverageValue (not cpu or memory).
    assert any(t["metricType"] == "AverageValue" for t in scaled["triggers"])
    # Scale-to-zero services too: fallback replicas 0 would let KEDA scale them to zero while metrics fail.
    llama_spec["autoscaling"]["minReplicas"] = 0
    assert _scaled_object(llama_spec)["fallback"]["replicas"] == 1


def test_secrets_are_referenced_never_inlined(llama_spec: dict[str, Any]) -> None:
    llama_spec["runtime"] = {"apiKeySecret": {"name": "api"}}
    container = _by_kind(desired_children("l", "n", InferenceServiceSpec.model_validate(llama_spec)))[
        "Deployment"
    ]["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "hf-token"}}]
    assert {
        "name": "PAGODA_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "api", "key": "api-key"}},
    } in container["env"]


def test_pvc_model_is_mounted_where_the_runtime_looks(all_examples: dict[str, dict[str, Any]]) -> None:
    spec = all_examples["mixtral-pvc"]["spec"]
    pod = _by_kind(_children("m", spec))["Deployment"]["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["model-source"] == {
        "name": "model-source",
        "mountPath": "/mnt/models/models",
        "readOnly": True,
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-source"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert volumes["model-cache"]["persistentVolumeClaim"] == {"claimName": "vllm-cache"}


def test_oci_model_is_an_image_volume_mounted_where_the_runtime_looks(llama_spec: dict[str, Any]) -> None:
    reference = "registry.example/models/llama@sha256:" + "1" * 64
    llama_spec["model"] = {"uri": f"oci://{reference}"}
    pod = _by_kind(_children("m", llama_spec))["Deployment"]["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["model-source"] == {"name": "model-source", "mountPath": IMAGE_MODEL_DIR, "readOnly": True}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-source"] == {
        "name": "model-source",
        "image": {"reference": reference, "pullPolicy": "IfNotPresent"},
    }
    assert parse_model_uri(llama_spec["model"]["uri"]).location == IMAGE_MODEL_DIR


def test_pull_secrets_are_the_pods_for_the_runtime_image_and_an_oci_model(llama_spec: dict[str, Any]) -> None:
    """The kubelet pulls an image volume with the pod's imagePullSecrets, as it pulls the containers' images:
    one list serves a private runtime image and a private model image."""
    pod = _by_kind(_children("m", llama_spec))["Deployment"]["spec"]["template"]["spec"]
    assert "imagePullSecrets" not in pod  # unset: the ServiceAccount's, which Kubernetes adds to the pods
    llama_spec["model"] = {"uri": "oci://registry.example/models/llama:3.1"}
    secrets = [{"name": "runtime-pull"}, {"name": "models.pull"}]
    llama_spec["runtime"] = {"image": "registry.example/pagoda/runtime:dev", "imagePullSecrets": secrets}
    pod = _by_kind(_children("m", llama_spec))["Deployment"]["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == secrets
    assert pod["containers"][0]["image"] == "registry.example/pagoda/runtime:dev"
    assert {v["name"]: v for v in pod["volumes"]}["model-source"]["image"]["reference"] == (
        "registry.example/models/llama:3.1"
    )


def test_builders_are_pure(llama_spec: dict[str, Any]) -> None:
    spec = InferenceServiceSpec.model_validate(llama_spec)
    first = desired_children("a", "b", spec)
    deployment_of(first)["spec"]["template"]["spec"]["containers"][0]["args"].append("mutated")
    assert desired_children("a", "b", spec) != first
    assert desired_children("a", "b", spec) == desired_children("a", "b", spec)


@pytest.mark.parametrize("image", ["registry.local/pagoda/runtime:dev", None])
def test_image_override(llama_spec: dict[str, Any], image: str | None) -> None:
    if image:
        llama_spec["runtime"] = {"image": image}
    deployment = deployment_of(
        desired_children(
            "a",
            "b",
            InferenceServiceSpec.model_validate(llama_spec),
            ChildInputs(OperatorSettings(default_image="d:1")),
        )
    )
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == (image or "d:1")


# Each replica query answers 0 while Prometheus has no scrape target of the service (no pod), and nothing
# (a KEDA failure) while targets exist without the series.
NO_TARGETS = ' or on() (0 * absent(up{namespace="team-a",service="llama"}))'
IN_FLIGHT_QUERY = (
    '(sum(pagoda_running_requests{namespace="team-a",service="llama"})'
    ' + sum(pagoda_queue_depth{namespace="team-a",service="llama"}))' + NO_TARGETS
)
QUEUE_QUERY = '(sum(pagoda_queue_depth{namespace="team-a",service="llama"}))' + NO_TARGETS


@pytest.mark.parametrize(
    ("autoscaling", "name", "query", "threshold"),
    [
        ({}, "in-flight", IN_FLIGHT_QUERY, "32"),  # the default metric and target
        ({"metric": "InFlight"}, "in-flight", IN_FLIGHT_QUERY, "32"),
        ({"targetInFlight": 12}, "in-flight", IN_FLIGHT_QUERY, "12"),
        ({"metric": "InFlight", "targetInFlight": 12}, "in-flight", IN_FLIGHT_QUERY, "12"),
        (
            {"metric": "QueueDepth"},
            "queue-depth",
            QUEUE_QUERY,
            "5",
        ),
        (
            {"metric": "QueueDepth", "targetQueueDepth": 3},
            "queue-depth",
            QUEUE_QUERY,
            "3",
        ),
    ],
)
def test_main_trigger_follows_the_metric(
    llama_spec: dict[str, Any], autoscaling: dict[str, Any], name: str, query: str, threshold: str
) -> None:
    llama_spec["autoscaling"] = {"maxReplicas": 4, **autoscaling}
    (trigger,) = _scaled_object(llama_spec)["triggers"]
    assert trigger["name"] == name and trigger["type"] == "prometheus"
    assert trigger["metricType"] == "AverageValue"  # KEDA divides by the replica count: a per-replica target
    assert trigger["metadata"]["query"] == query
    assert trigger["metadata"]["threshold"] == threshold


@pytest.mark.parametrize(
    ("autoscaling", "measured", "threshold"),
    [
        ({}, 10, "8"),  # 0.8 of the measured concurrency, rounded down
        ({"sloTargetRatio": 1}, 10, "10"),
        ({"sloTargetRatio": 0.5}, 1, "1"),  # never below 1
        ({}, None, "32"),  # no profile yet: the InFlight default
        ({"targetInFlight": 6}, None, "6"),  # ... or the user's fallback target
        ({"targetInFlight": 6}, 20, "16"),  # a measurement wins over the fallback
    ],
)
def test_metric_slo_targets_a_share_of_the_measured_concurrency(
    llama_spec: dict[str, Any], autoscaling: dict[str, Any], measured: int | None, threshold: str
) -> None:
    llama_spec["autoscaling"] = {"maxReplicas": 4, "metric": "SLO", **autoscaling}
    llama_spec["slo"] = {"ttftMs": 500, "interTokenMs": 50}
    llama_spec["routing"] = {}
    spec = InferenceServiceSpec.model_validate(llama_spec)
    children = desired_children("llama", "team-a", spec, ChildInputs(slo_concurrency=measured))
    load, picker = _by_kind(children)["ScaledObject"]["spec"]["triggers"]
    assert load["name"] == "in-flight" and load["metadata"]["query"] == IN_FLIGHT_QUERY
    assert load["metadata"]["threshold"] == picker["metadata"]["threshold"] == threshold
