"""e2e/lab/prometheus_sd.py: the operator's ServiceMonitor becomes the scrape config the Prometheus Operator
would write, and its relabel rules keep exactly this service's runtime pods with the expected labels.

The rules are applied here to the labels Prometheus' `endpointslice` discovery attaches to a target (built
from the Service and pod template the operator's builders make); `promtool check config` checks the whole
configuration.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.lab.prometheus_sd import (
    TlsFiles,
    endpointslice_targets,
    sanitize_label_name,
    scrape_configs,
    with_file_sd,
)
from pagoda.operator.api import InferenceServiceSpec
from pagoda.operator.resources import desired_children

API_SERVER = "https://127.0.0.1:6443"
TLS = TlsFiles(Path("/pki/ca.crt"), Path("/pki/admin.crt"), Path("/pki/admin.key"))
POD = "llama-7d9f8c-abcde"


def _children(spec: dict[str, Any], name: str = "llama", namespace: str = "team-a") -> dict[str, Any]:
    children = desired_children(name, namespace, InferenceServiceSpec.model_validate(spec))
    return {child["kind"]: child for child in children}


def _discovered(children: dict[str, Any], port_name: str = "http", phase: str = "Running") -> dict[str, str]:
    """The meta labels `role: endpointslice` discovery gives the target of one ready runtime pod."""
    service, deployment = children["Service"], children["Deployment"]
    meta = service["metadata"]
    labels = {
        "__address__": "10.0.0.7:8000",
        "__meta_kubernetes_namespace": meta["namespace"],
        "__meta_kubernetes_endpointslice_name": f"{meta['name']}-x2k9q",
        "__meta_kubernetes_endpointslice_port_name": port_name,
        "__meta_kubernetes_endpointslice_port": "8000",
        "__meta_kubernetes_endpointslice_address_target_kind": "Pod",
        "__meta_kubernetes_endpointslice_address_target_name": POD,
        "__meta_kubernetes_endpointslice_endpoint_conditions_ready": "true",
        "__meta_kubernetes_service_name": meta["name"],
        "__meta_kubernetes_pod_name": POD,
        "__meta_kubernetes_pod_container_name": "runtime",
        "__meta_kubernetes_pod_phase": phase,
    }
    for key, value in meta["labels"].items():
        labels[f"__meta_kubernetes_service_label_{sanitize_label_name(key)}"] = value
        labels[f"__meta_kubernetes_service_labelpresent_{sanitize_label_name(key)}"] = "true"
    for key, value in deployment["spec"]["template"]["metadata"]["labels"].items():
        labels[f"__meta_kubernetes_pod_label_{sanitize_label_name(key)}"] = value
        labels[f"__meta_kubernetes_pod_labelpresent_{sanitize_label_name(key)}"] = "true"
    return labels


def _expand(template: str, match: re.Match[str]) -> str:
    return re.sub(
        r"\$\{(\w+)\}|\$(\w+)", lambda m: match.group(int(m.group(1) or m.group(2))) or "", template
    )


def relabel(config: dict[str, Any], discovered: dict[str, str]) -> dict[str, str] | None:
    """Prometheus' target relabelling (replace, keep, drop; anchored RE2-compatible regexes): the target's
    public labels, or None when a rule drops it."""
    labels = {"job": config["job_name"], **discovered}
    for rule in config["relabel_configs"]:
        action = rule.get("action", "replace")
        value = rule.get("separator", ";").join(labels.get(s, "") for s in rule.get("source_labels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if action == "keep" and match is None or action == "drop" and match is not None:
            return None
        if action == "replace" and match is not None:
            result = _expand(rule.get("replacement", "$1"), match)
            if result:
                labels[rule["target_label"]] = result
            else:
                labels.pop(rule["target_label"], None)
        assert action in ("replace", "keep", "drop"), action
    return {key: value for key, value in labels.items() if not key.startswith("__")}


@pytest.fixture
def children(llama_spec: dict[str, Any]) -> dict[str, Any]:
    llama_spec["monitoring"] = {"serviceMonitor": {"enabled": True, "interval": "30s"}}
    return _children(llama_spec)


def test_one_job_per_endpoint_named_like_the_prometheus_operator(children: dict[str, Any]) -> None:
    (config,) = scrape_configs([children["ServiceMonitor"]], API_SERVER, TLS)
    assert config["job_name"] == "serviceMonitor/team-a/llama/0"
    assert config["honor_labels"] is False
    assert config["kubernetes_sd_configs"] == [
        {
            "role": "endpointslice",
            "namespaces": {"names": ["team-a"]},
            "api_server": API_SERVER,
            "tls_config": {
                "ca_file": "/pki/ca.crt",
                "cert_file": "/pki/admin.crt",
                "key_file": "/pki/admin.key",
            },
        }
    ]
    assert (config["scrape_interval"], config["metrics_path"]) == ("30s", "/metrics")
    assert config.get("scheme", "http") == "http"  # the operator says http (resources/tls.py)


def test_selector_rules_use_sanitised_service_labels_and_their_presence(children: dict[str, Any]) -> None:
    (config,) = scrape_configs([children["ServiceMonitor"]], API_SERVER, TLS)
    keeps = [rule for rule in config["relabel_configs"] if rule.get("action") == "keep"]
    assert keeps == [
        {
            "action": "keep",
            "source_labels": [
                "__meta_kubernetes_service_label_app_kubernetes_io_name",
                "__meta_kubernetes_service_labelpresent_app_kubernetes_io_name",
            ],
            "regex": "(pagoda-runtime);true",
        },
        {
            "action": "keep",
            "source_labels": [
                "__meta_kubernetes_service_label_pagoda_dev_inferenceservice",
                "__meta_kubernetes_service_labelpresent_pagoda_dev_inferenceservice",
            ],
            "regex": "(llama);true",
        },
        {"action": "keep", "source_labels": ["__meta_kubernetes_endpointslice_port_name"], "regex": "http"},
    ]


def test_the_runtime_pod_gets_the_target_labels_queries_use(children: dict[str, Any]) -> None:
    (config,) = scrape_configs([children["ServiceMonitor"]], API_SERVER, TLS)
    assert relabel(config, _discovered(children)) == {
        "namespace": "team-a",
        "service": "llama",
        "pod": POD,
        "container": "runtime",
        "endpoint": "http",
        "job": "llama",
    }


def test_other_targets_are_dropped(llama_spec: dict[str, Any], children: dict[str, Any]) -> None:
    (config,) = scrape_configs([children["ServiceMonitor"]], API_SERVER, TLS)
    assert relabel(config, _discovered(_children(llama_spec, name="llama-2"))) is None  # regex is anchored
    assert relabel(config, _discovered(children, port_name="metrics")) is None
    assert relabel(config, _discovered(children, phase="Succeeded")) is None  # a finished pod
    unlabelled = {
        key: value for key, value in _discovered(children).items() if "pagoda_dev_inferenceservice" not in key
    }
    assert relabel(config, unlabelled) is None


def test_selector_expressions_job_label_and_target_labels() -> None:
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "web", "namespace": "b"},
        "spec": {
            "selector": {
                "matchLabels": {"app": "web"},
                "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["front", "edge"]},
                    {"key": "canary", "operator": "DoesNotExist"},
                ],
            },
            "namespaceSelector": {"matchNames": ["b", "c"]},
            "jobLabel": "app.kubernetes.io/part-of",
            "targetLabels": ["team"],
            "endpoints": [
                {"port": "web", "scheme": "https", "path": "/m", "interval": "5s"},
                {"port": "admin"},
            ],
        },
    }
    first, second = scrape_configs([monitor], API_SERVER, TLS, role="endpoints")
    assert (first["job_name"], second["job_name"]) == ("serviceMonitor/b/web/0", "serviceMonitor/b/web/1")
    assert first["kubernetes_sd_configs"][0]["namespaces"] == {"names": ["b", "c"]}
    assert (first["scheme"], first["metrics_path"], first["scrape_interval"]) == ("https", "/m", "5s")
    target = {
        "__meta_kubernetes_namespace": "c",
        "__meta_kubernetes_service_name": "web-svc",
        "__meta_kubernetes_endpoint_port_name": "web",
        "__meta_kubernetes_endpoint_address_target_kind": "Pod",
        "__meta_kubernetes_endpoint_address_target_name": "web-1",
        "__meta_kubernetes_pod_name": "web-1",
        "__meta_kubernetes_pod_container_name": "main",
    }
    for key, value in {
        "app": "web",
        "tier": "edge",
        "team": "ml",
        "app.kubernetes.io/part-of": "shop",
    }.items():
        target[f"__meta_kubernetes_service_label_{sanitize_label_name(key)}"] = value
        target[f"__meta_kubernetes_service_labelpresent_{sanitize_label_name(key)}"] = "true"
    assert relabel(first, target) == {
        "namespace": "c",
        "service": "web-svc",
        "pod": "web-1",
        "container": "main",
        "team": "ml",
        "job": "shop",
        "endpoint": "web",
    }
    assert relabel(second, target) is None  # another port
    canary = {**target, "__meta_kubernetes_service_labelpresent_canary": "true"}
    assert relabel(first, canary) is None
    assert relabel(first, {**target, "__meta_kubernetes_service_label_tier": "back"}) is None


def test_fields_it_cannot_honour_are_refused(children: dict[str, Any]) -> None:
    monitor = copy.deepcopy(children["ServiceMonitor"])
    monitor["spec"]["endpoints"][0]["tlsConfig"] = {"insecureSkipVerify": True}
    with pytest.raises(ValueError, match=r"endpoints\[0\]\.tlsConfig"):
        scrape_configs([monitor], API_SERVER, TLS)


def _endpoint_slice(children: dict[str, Any], ready: bool = True) -> dict[str, Any]:
    """The EndpointSlice the endpoint-slice controller writes for the operator's Service and one pod."""
    meta = children["Service"]["metadata"]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{meta['name']}-x2k9q",
            "namespace": meta["namespace"],
            "labels": {**meta["labels"], "kubernetes.io/service-name": meta["name"]},
        },
        "addressType": "IPv4",
        "endpoints": [
            {
                "addresses": ["10.0.0.7"],
                "conditions": {"ready": ready, "serving": ready, "terminating": False},
                "nodeName": "gpu-node-0",
                "targetRef": {"kind": "Pod", "name": POD, "namespace": meta["namespace"]},
            }
        ],
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
    }


def _pod(children: dict[str, Any]) -> dict[str, Any]:
    template = children["Deployment"]["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": POD, "namespace": "team-a", "uid": "u-1"},
        "spec": {**template["spec"], "nodeName": "gpu-node-0"},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.7",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_endpointslice_targets_carry_the_labels_kubernetes_discovery_gives(children: dict[str, Any]) -> None:
    (config,) = scrape_configs([children["ServiceMonitor"]], API_SERVER, TLS)
    (group,) = endpointslice_targets(
        config, [_endpoint_slice(children)], [children["Service"]], [_pod(children)]
    )
    assert group["targets"] == ["10.0.0.7:8000"]
    documented = _discovered(children)
    del documented["__address__"]
    assert documented.items() <= group["labels"].items()
    assert relabel(config, {"__address__": group["targets"][0], **group["labels"]}) == relabel(
        config, _discovered(children)
    )


def test_endpointslice_targets_stay_in_the_jobs_namespaces(children: dict[str, Any]) -> None:
    (config,) = scrape_configs([children["ServiceMonitor"]], API_SERVER, TLS)
    elsewhere = _endpoint_slice(children)
    elsewhere["metadata"]["namespace"] = "team-b"
    assert endpointslice_targets(config, [elsewhere], [children["Service"]], [_pod(children)]) == []


def _promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        pytest.fail("promtool not found: `make test` installs Debian's prometheus package", pytrace=False)
    return found


def _check_config(scrape: list[dict[str, Any]], folder: Path) -> subprocess.CompletedProcess[str]:
    text = yaml.safe_dump({"global": {"scrape_interval": "15s"}, "scrape_configs": scrape}, sort_keys=False)
    assert "&id" not in text  # no shared lists dumped as YAML anchors
    (folder / "prometheus.yml").write_text(text)
    command = [_promtool(), "check", "config", "prometheus.yml"]
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=60)


def _tls_files(folder: Path) -> TlsFiles:
    tls = TlsFiles(folder / "ca.crt", folder / "admin.crt", folder / "admin.key")
    for path in (tls.ca_file, tls.cert_file, tls.key_file):
        path.write_text("")  # promtool checks that they exist
    return tls


def test_promtool_accepts_the_file_sd_config(children: dict[str, Any], tmp_path: Path) -> None:
    """What Debian's Prometheus runs: the same jobs and relabel rules, targets from a file_sd file."""
    configs = scrape_configs([children["ServiceMonitor"]], API_SERVER, _tls_files(tmp_path))
    (tmp_path / "targets.json").write_text("[]")
    result = _check_config([with_file_sd(c, tmp_path / "targets.json") for c in configs], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
