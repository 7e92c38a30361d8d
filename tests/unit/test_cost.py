"""spec.cost on its way to Prometheus: kube-state-metrics' custom-resource-state config (one file, shipped
in the chart and run by the e2e harness) reads fields the CRD has, and the cost rules read only what it and
the runtime export. The rules' arithmetic is unit-tested by promtool (charts/pagoda/tests/alerts_test.yaml);
e2e/test_observability.py checks it against a real runtime's measured token rate."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from metric_contract import RUNTIME_METRICS

from e2e.lab.addons import KSM_CUSTOM_RESOURCE_STATE, KubeStateMetrics
from tests.unit.test_alerts import rule_spec
from tests.unit.test_chart import CHART, find, only, render

CONFIG = CHART / "files" / "kube-state-metrics" / "inferenceservice.yaml"


def config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    return loaded


def resource() -> dict[str, Any]:
    (only_resource,) = config()["spec"]["resources"]
    found: dict[str, Any] = only_resource
    return found


def exported() -> dict[str, dict[str, Any]]:
    """Metric name -> its gauge config."""
    prefix = resource()["metricNamePrefix"]
    return {f"{prefix}_{metric['name']}": metric["each"]["gauge"] for metric in resource()["metrics"]}


def schema_at(root: dict[str, Any], path: list[str]) -> dict[str, Any]:
    node = root
    for part in path:
        if node.get("type") == "array":  # a list (status.conditions): one series per item
            node = node["items"]
        node = node["properties"][part]
    return node


def read_as_number(path: list[str], field: dict[str, Any]) -> bool:
    """A number, or a string kube-state-metrics reads as one: a condition's status (True 1, False and Unknown
    0) and an RFC 3339 time (Unix seconds)."""
    if field["type"] in {"number", "integer"}:
        return True
    statuses = set(field.get("enum") or []) == {"True", "False", "Unknown"}
    return field["type"] == "string" and (statuses or path[-1] == "lastTransitionTime")


def test_config_names_the_inferenceservice_crd() -> None:
    from pagoda.operator.api import GROUP, KIND, VERSION

    assert config()["kind"] == "CustomResourceStateMetrics"
    assert resource()["groupVersionKind"] == {"group": GROUP, "version": VERSION, "kind": KIND}
    # The labels the runtime's series carry (ServiceMonitor targets), so that the rules join on them.
    assert resource()["labelsFromPath"] == {
        "namespace": ["metadata", "namespace"],
        "service": ["metadata", "name"],
    }


def test_every_path_is_a_field_of_the_crd(crd_root_schema: dict[str, Any]) -> None:
    for name, gauge in exported().items():
        base = gauge["path"]
        value = schema_at(crd_root_schema, base + gauge.get("valueFrom", []))
        if "labelFromKey" in gauge:  # an object of numbers: one series per key, the key as a label
            assert value["type"] == "object" and value["properties"], name
            assert {field["type"] for field in value["properties"].values()} <= {"number", "integer"}, name
        else:
            assert read_as_number(base + gauge.get("valueFrom", []), value), name
        for label_path in gauge.get("labelsFromPath", {}).values():
            assert schema_at(crd_root_schema, base + label_path)["type"] == "string", name
    assert set(exported()) == {
        "pagoda_inferenceservice_spec_gpu_count",
        "pagoda_inferenceservice_spec_cost_gpu_hour_price",
        "pagoda_inferenceservice_spec_cost_api_price_per_million_tokens",
        "pagoda_inferenceservice_status_startup_typical_phase_seconds",
        "pagoda_inferenceservice_status_startup_last_seconds",
        "pagoda_inferenceservice_status_profile_concurrency",
        "pagoda_inferenceservice_status_profile_output_tokens_per_second",
        "pagoda_inferenceservice_status_profile_requests_per_second",
        "pagoda_inferenceservice_status_sizing_target_per_replica",
        "pagoda_inferenceservice_status_condition",
        "pagoda_inferenceservice_status_condition_last_transition_time",
    }


def test_cost_rules_read_only_exported_series() -> None:
    (group,) = [g for g in rule_spec()["groups"] if g["name"] == "pagoda.cost"]
    recorded = {rule["record"] for rule in group["rules"] if "record" in rule}
    available = set(exported()) | RUNTIME_METRICS | {"vllm:generation_tokens_total"}
    for rule in group["rules"]:
        names = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", rule["expr"]))
        names = {n for n in names if "_" in n or ":" in n}  # metric names, not keywords or label names
        names -= {"namespace", "service", "currency", "group_left"}
        assert names <= available | recorded, (rule.get("record") or rule["alert"], names - available)
        if "record" in rule:
            available.add(rule["record"])  # rules of a group see the ones above them


def test_the_e2e_harness_runs_the_same_file(tmp_path: Path) -> None:
    assert KSM_CUSTOM_RESOURCE_STATE.resolve() == CONFIG.resolve()
    cluster = SimpleNamespace(bin_dir=tmp_path, kubeconfig=tmp_path / "kubeconfig", node=None)
    args = KubeStateMetrics(cluster, tmp_path, detach=False).args()  # type: ignore[arg-type]
    assert f"--custom-resource-state-config-file={CONFIG.resolve()}" in args


def test_chart_ships_the_file_and_read_access_for_a_users_kube_state_metrics() -> None:
    assert not find(render(), "ClusterRole", "pagoda-kube-state-metrics")  # opt-in
    docs = render("--set", "kubeStateMetrics.enabled=true", "--set", "kubeStateMetrics.namespace=monitoring")
    (configmap,) = find(docs, "ConfigMap", "pagoda-kube-state-metrics")
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["data"]["inferenceservice.yaml"] == CONFIG.read_text().strip()
    (role,) = find(docs, "ClusterRole", "pagoda-kube-state-metrics")
    grants = {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert grants == {
        ("pagoda.dev", "inferenceservices"): {"list", "watch"},
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    }
    assert not find(docs, "ClusterRoleBinding", "pagoda-kube-state-metrics")  # no ServiceAccount named

    bound = render(
        "--set", "kubeStateMetrics.enabled=true", "--set", "kubeStateMetrics.serviceAccountName=ksm"
    )
    binding = only(
        [d for d in bound if d["metadata"]["name"] == "pagoda-kube-state-metrics"], "ClusterRoleBinding"
    )
    assert binding["roleRef"]["name"] == "pagoda-kube-state-metrics"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ksm", "namespace": "pagoda-system"}]
