"""ServiceMonitors -> Prometheus `scrape_configs`, the way the Prometheus Operator generates them.

The harness has no Prometheus Operator, but it can give a real Prometheus the same scrape configuration
the operator would write for the ServiceMonitors Pagoda creates: Kubernetes service discovery against the
local API server (role `endpointslice`, one job per ServiceMonitor endpoint), the same `keep` rules on the
Service's labels and the endpoint's port name, and the same target labels (`namespace`, `service`, `pod`,
`container`, `endpoint`, `job` = the Service's name). Queries, dashboards and KEDA triggers then see the
series exactly as in a cluster.

Modelled on `generateServiceMonitorConfig` in prometheus-operator's pkg/prometheus/promcfg.go (one shard,
no scrape classes, no enforced namespace label). Endpoint settings that would need Secrets (TLS, auth) are
refused rather than ignored.

Debian's Prometheus has no Kubernetes discovery; `endpointslice_targets` and `with_file_sd` (below) keep the
same jobs and relabel rules and do the discovery here, into a file_sd file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Role = Literal["endpointslice", "endpoints"]
ScrapeConfig = dict[str, Any]

_INVALID_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_]")
# Endpoint fields this generator understands; any other one is refused (a silent gap would make the harness
# scrape differently from a cluster).
_ENDPOINT_FIELDS = frozenset(
    {
        "port",
        "targetPort",
        "path",
        "scheme",
        "interval",
        "scrapeTimeout",
        "honorLabels",
        "honorTimestamps",
        "params",
        "filterRunning",
        "relabelings",
        "metricRelabelings",
    }
)
_SPEC_FIELDS = frozenset(
    {"selector", "endpoints", "namespaceSelector", "jobLabel", "targetLabels", "podTargetLabels"}
)


@dataclass(frozen=True)
class TlsFiles:
    """How Prometheus authenticates to the API server: its CA bundle and a client certificate and key
    (PEM files), e.g. `TlsFiles(pki.ca_cert, pki.admin_cert, pki.admin_key)`."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def sanitize_label_name(name: str) -> str:
    """A Kubernetes label key as Prometheus' service discovery names it (`app.kubernetes.io/name` ->
    `app_kubernetes_io_name`)."""
    return _INVALID_LABEL_CHARS.sub("_", name)


def scrape_configs(
    service_monitors: Iterable[Mapping[str, Any]],
    api_server: str,
    tls_files: TlsFiles,
    role: Role = "endpointslice",
) -> list[ScrapeConfig]:
    """One scrape config per endpoint of each ServiceMonitor (dicts as read from the API server), ordered
    by namespace/name as the Prometheus Operator orders them; job names `serviceMonitor/<ns>/<name>/<i>`."""
    monitors = sorted(service_monitors, key=lambda m: (m["metadata"]["namespace"], m["metadata"]["name"]))
    return [
        _endpoint_config(monitor, endpoint, index, api_server, tls_files, role)
        for monitor in monitors
        for index, endpoint in enumerate(monitor["spec"]["endpoints"])
    ]


def _endpoint_config(
    monitor: Mapping[str, Any],
    endpoint: Mapping[str, Any],
    index: int,
    api_server: str,
    tls_files: TlsFiles,
    role: Role,
) -> ScrapeConfig:
    namespace, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    spec = monitor["spec"]
    unknown = sorted(set(spec) - _SPEC_FIELDS) + [
        f"endpoints[{index}].{key}" for key in sorted(set(endpoint) - _ENDPOINT_FIELDS)
    ]
    if unknown:
        raise ValueError(f"ServiceMonitor {namespace}/{name}: unsupported fields {', '.join(unknown)}")
    config: ScrapeConfig = {
        "job_name": f"serviceMonitor/{namespace}/{name}/{index}",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
    }
    if "honorTimestamps" in endpoint:
        config["honor_timestamps"] = bool(endpoint["honorTimestamps"])
    config["kubernetes_sd_configs"] = [_sd_config(spec, namespace, api_server, tls_files, role)]
    for source, target in (
        ("interval", "scrape_interval"),
        ("scrapeTimeout", "scrape_timeout"),
        ("path", "metrics_path"),
        ("params", "params"),
        ("scheme", "scheme"),
    ):
        if endpoint.get(source):
            config[target] = endpoint[source]
    config["relabel_configs"] = _relabelings(spec, endpoint, role)
    if endpoint.get("metricRelabelings"):
        config["metric_relabel_configs"] = [_relabel(rule) for rule in endpoint["metricRelabelings"]]
    return config


def _sd_config(
    spec: Mapping[str, Any], namespace: str, api_server: str, tls_files: TlsFiles, role: Role
) -> dict[str, Any]:
    selector = spec.get("namespaceSelector") or {}
    sd: dict[str, Any] = {"role": role}
    if not selector.get("any", False):
        sd["namespaces"] = {"names": list(selector.get("matchNames") or [namespace])}
    sd["api_server"] = api_server
    sd["tls_config"] = {
        "ca_file": str(tls_files.ca_file),
        "cert_file": str(tls_files.cert_file),
        "key_file": str(tls_files.key_file),
    }
    return sd


def _relabelings(spec: Mapping[str, Any], endpoint: Mapping[str, Any], role: Role) -> list[dict[str, Any]]:
    meta = "__meta_kubernetes_endpointslice" if role == "endpointslice" else "__meta_kubernetes_endpoint"
    rules: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    rules += _selector_rules(spec.get("selector") or {})
    port = endpoint.get("port")
    target_port = endpoint.get("targetPort")
    if port:
        rules.append({"action": "keep", "source_labels": [f"{meta}_port_name"], "regex": port})
    elif isinstance(target_port, str) and target_port:
        rules.append(
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": target_port,
            }
        )
    elif isinstance(target_port, int) and target_port:
        rules.append(
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_pod_container_port_number"],
                "regex": str(target_port),
            }
        )
    target = [f"{meta}_address_target_kind", f"{meta}_address_target_name"]
    for kind, label in (("Node", "node"), ("Pod", "pod")):
        rules.append(
            {
                "source_labels": list(target),  # a list of its own: no YAML anchors when dumped
                "separator": ";",
                "regex": f"{kind};(.*)",
                "replacement": "${1}",
                "target_label": label,
            }
        )
    for source, label in (
        ("__meta_kubernetes_namespace", "namespace"),
        ("__meta_kubernetes_service_name", "service"),
        ("__meta_kubernetes_pod_name", "pod"),
        ("__meta_kubernetes_pod_container_name", "container"),
    ):
        rules.append({"source_labels": [source], "target_label": label})
    if endpoint.get("filterRunning", True):
        rules.append(
            {
                "action": "drop",
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "(Failed|Succeeded)",
            }
        )
    for prefix, names in (
        ("__meta_kubernetes_service_label_", spec.get("targetLabels") or []),
        ("__meta_kubernetes_pod_label_", spec.get("podTargetLabels") or []),
    ):
        for label in names:
            rules.append(_copy_label(prefix + sanitize_label_name(label), sanitize_label_name(label)))
    # job: the Service's name, unless jobLabel names a Service label that has a value.
    rules.append(
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"}
    )
    if spec.get("jobLabel"):
        source = "__meta_kubernetes_service_label_" + sanitize_label_name(spec["jobLabel"])
        rules.append(_copy_label(source, "job"))
    endpoint_name = port or (str(target_port) if target_port else "")
    if endpoint_name:
        rules.append({"target_label": "endpoint", "replacement": endpoint_name})
    rules += [_relabel(rule) for rule in endpoint.get("relabelings") or []]
    return rules


def _selector_rules(selector: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`keep`/`drop` rules equivalent to a label selector on the Service (the `_labelpresent_` label
    tells an empty value from a missing label)."""
    rules: list[dict[str, Any]] = []

    def value_and_presence(key: str) -> list[str]:
        name = sanitize_label_name(key)
        return [f"__meta_kubernetes_service_label_{name}", f"__meta_kubernetes_service_labelpresent_{name}"]

    def presence(key: str) -> list[str]:
        return [f"__meta_kubernetes_service_labelpresent_{sanitize_label_name(key)}"]

    for key, value in sorted((selector.get("matchLabels") or {}).items()):
        rules.append({"action": "keep", "source_labels": value_and_presence(key), "regex": f"({value});true"})
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = "|".join(expression.get("values") or [])
        if operator == "In":
            rules.append(
                {"action": "keep", "source_labels": value_and_presence(key), "regex": f"({values});true"}
            )
        elif operator == "NotIn":
            rules.append(
                {"action": "drop", "source_labels": value_and_presence(key), "regex": f"({values});true"}
            )
        elif operator == "Exists":
            rules.append({"action": "keep", "source_labels": presence(key), "regex": "true"})
        elif operator == "DoesNotExist":
            rules.append({"action": "drop", "source_labels": presence(key), "regex": "true"})
        else:
            raise ValueError(f"unknown label selector operator {operator!r}")
    return rules


def _copy_label(source: str, target: str) -> dict[str, Any]:
    return {"source_labels": [source], "target_label": target, "regex": "(.+)", "replacement": "${1}"}


_RELABEL_KEYS = {
    "sourceLabels": "source_labels",
    "separator": "separator",
    "targetLabel": "target_label",
    "regex": "regex",
    "modulus": "modulus",
    "replacement": "replacement",
    "action": "action",
}


def _relabel(rule: Mapping[str, Any]) -> dict[str, Any]:
    """A ServiceMonitor RelabelConfig (camelCase) as a Prometheus relabel_config."""
    unknown = set(rule) - set(_RELABEL_KEYS)
    if unknown:
        raise ValueError(f"unknown relabeling fields {sorted(unknown)}")
    out = {_RELABEL_KEYS[key]: value for key, value in rule.items()}
    if "action" in out:
        out["action"] = str(out["action"]).lower()
    return out


# Debian's `prometheus` package is built without Kubernetes service discovery (its NEWS.Debian: "Kubernetes
# support has been completely removed"), so `kubernetes_sd_configs` is unknown to it. For such a Prometheus
# the harness can do the discovery itself: `endpointslice_targets` gives each target the meta labels that
# `role: endpointslice` discovery would, `with_file_sd` points the same job (same relabel rules) at a
# file_sd file holding them.


def with_file_sd(config: ScrapeConfig, path: Path, refresh_interval: str = "1s") -> ScrapeConfig:
    """`config` with its Kubernetes discovery replaced by the file_sd file `path` (write it with
    `endpointslice_targets`); everything else, the relabel rules included, unchanged."""
    out = {key: value for key, value in config.items() if key != "kubernetes_sd_configs"}
    out["file_sd_configs"] = [{"files": [str(path)], "refresh_interval": refresh_interval}]
    return out


def endpointslice_targets(
    config: ScrapeConfig,
    endpoint_slices: Iterable[Mapping[str, Any]],
    services: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """file_sd target groups for the job `config` (from `scrape_configs`, role endpointslice): one per
    endpoint address and port of the EndpointSlices in the job's namespaces, labelled as Prometheus'
    Kubernetes discovery labels them (endpoint slice, its Service, and the pod and container behind it).
    Objects are dicts as read from the API server."""
    (sd,) = config["kubernetes_sd_configs"]
    if sd["role"] != "endpointslice":
        raise ValueError(f"only role endpointslice is discovered here, not {sd['role']!r}")
    names = sd.get("namespaces", {}).get("names")
    by_name = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in services}
    pods_by_name = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
    groups = []
    for eps in endpoint_slices:
        namespace = eps["metadata"]["namespace"]
        if names is not None and namespace not in names:
            continue
        base = {
            "__meta_kubernetes_namespace": namespace,
            "__meta_kubernetes_endpointslice_name": eps["metadata"]["name"],
            "__meta_kubernetes_endpointslice_address_type": eps.get("addressType", ""),
            **_object_labels("endpointslice", eps["metadata"]),
        }
        service_name = (eps["metadata"].get("labels") or {}).get("kubernetes.io/service-name")
        service = by_name.get((namespace, service_name or ""))
        if service is not None:
            base["__meta_kubernetes_service_name"] = service["metadata"]["name"]
            base.update(_object_labels("service", service["metadata"]))
        for endpoint in eps.get("endpoints") or []:
            ref = endpoint.get("targetRef") or {}
            pod = pods_by_name.get((namespace, ref.get("name", ""))) if ref.get("kind") == "Pod" else None
            for port in eps.get("ports") or []:
                labels = {**base, **_endpoint_labels(endpoint, port)}
                if pod is not None:
                    labels.update(_pod_labels(pod, port))
                for address in endpoint.get("addresses") or []:
                    groups.append({"targets": [f"{address}:{port['port']}"], "labels": labels})
    return groups


def _object_labels(kind: str, meta: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for key, value in (meta.get("labels") or {}).items():
        out[f"__meta_kubernetes_{kind}_label_{sanitize_label_name(key)}"] = value
        out[f"__meta_kubernetes_{kind}_labelpresent_{sanitize_label_name(key)}"] = "true"
    return out


def _endpoint_labels(endpoint: Mapping[str, Any], port: Mapping[str, Any]) -> dict[str, str]:
    prefix = "__meta_kubernetes_endpointslice"
    ref = endpoint.get("targetRef") or {}
    conditions = endpoint.get("conditions") or {}
    out = {
        f"{prefix}_port": str(port["port"]),
        f"{prefix}_port_name": port.get("name", ""),
        f"{prefix}_port_protocol": port.get("protocol", "TCP"),
        f"{prefix}_address_target_kind": ref.get("kind", ""),
        f"{prefix}_address_target_name": ref.get("name", ""),
        f"{prefix}_endpoint_node_name": endpoint.get("nodeName", ""),
    }
    for condition in ("ready", "serving", "terminating"):
        if condition in conditions:
            out[f"{prefix}_endpoint_conditions_{condition}"] = str(bool(conditions[condition])).lower()
    return out


def _pod_labels(pod: Mapping[str, Any], port: Mapping[str, Any]) -> dict[str, str]:
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    ready = next((c["status"] for c in status.get("conditions") or [] if c.get("type") == "Ready"), "unknown")
    out = {
        "__meta_kubernetes_pod_name": meta["name"],
        "__meta_kubernetes_pod_uid": meta.get("uid", ""),
        "__meta_kubernetes_pod_ip": status.get("podIP", ""),
        "__meta_kubernetes_pod_node_name": spec.get("nodeName", ""),
        "__meta_kubernetes_pod_host_ip": status.get("hostIP", ""),
        "__meta_kubernetes_pod_phase": status.get("phase", ""),
        "__meta_kubernetes_pod_ready": str(ready).lower(),
        **_object_labels("pod", meta),
    }
    # The container whose port the endpoint port is (a Service's targetPort resolves to it).
    for container in spec.get("containers") or []:
        for container_port in container.get("ports") or []:
            if container_port.get("containerPort") == port["port"]:
                out["__meta_kubernetes_pod_container_name"] = container["name"]
                out["__meta_kubernetes_pod_container_image"] = container.get("image", "")
                out["__meta_kubernetes_pod_container_port_name"] = container_port.get("name", "")
                out["__meta_kubernetes_pod_container_port_number"] = str(container_port["containerPort"])
                out["__meta_kubernetes_pod_container_port_protocol"] = container_port.get("protocol", "TCP")
                out["__meta_kubernetes_pod_container_init"] = "false"
    return out
