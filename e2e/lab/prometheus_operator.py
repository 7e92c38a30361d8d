"""Monitoring on the local cluster as users run it: the Prometheus Operator from its own manifests, and the
Prometheus it runs in a pod on the real node (test harness).

    monitoring = start_monitoring(cluster, ksm_address="HOST:PORT")   # returns once Prometheus is ready
    monitoring.url                  # http://<the Prometheus pod's IP>:9090, for the tests' own queries
    monitoring.pid()                # its prometheus process on this host, for the tests that hang it

What runs, and from where:
- The operator: its bundle.yaml (every monitoring.coreos.com CRD, its ClusterRole and the Deployment in
  namespace `default`), applied unchanged from the Go module e2e/lab/tools/prometheus-operator/go.mod pins
  (`make tools` copies it to <bin>/prometheus-operator-manifests/). Its images (the operator and the config
  reloader it adds to every Prometheus pod) are built from the same module (e2e/lab/images.py) under the
  names the bundle gives them, so the real node pulls them from the local registry like any other.
- One `Prometheus` object, `monitoring/pagoda`, with the example RBAC of the operator's repository: the
  operator turns it into the StatefulSet `prometheus-pagoda` and the headless Service `prometheus-operated`
  (port 9090: the address an InferenceService's ScaledObject queries by default). Its image is Prometheus as
  e2e/lab/tools/prometheus/go.mod pins it (Kubernetes service discovery included).
- It selects every ServiceMonitor, PodMonitor, PrometheusRule and ScrapeConfig in every namespace (as
  kube-prometheus-stack does with its selectors emptied): what the Pagoda operator and its chart write is what
  it scrapes and evaluates, with the operator's relabelling. kube-state-metrics runs as a host process
  (e2e/lab/addons.py); a ScrapeConfig names its address.

Settings that differ from the operator's defaults, each for the tests: a 1 s scrape and rule interval (the
tests wait on series and alerts), small resource requests (the real node has 2 CPUs), a liveness probe that
gives up after 5 minutes instead of 30 s, so that a test that hangs Prometheus (e2e/test_autoscaling.py,
e2e/test_scale_from_zero.py) sees a hang for as long as it holds it, not a restart, and a config reloader
that re-reads every 5 s (RELOADER_ARGS: v0.85.0's misses every change after the first for up to 3 minutes).
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from e2e.lab import images
from e2e.lab.addons import apply_objects, wait_established
from e2e.lab.cluster import Cluster
from e2e.lab.observability import SCRAPE_INTERVAL
from e2e.lab.processes import http_ok, wait_until
from e2e.lab.realpods import get_json, is_ready
from pagoda.operator.api.scaling import AutoscalingSpec

# Where a ScaledObject looks for Prometheus unless the InferenceService says otherwise: the operator's
# governing Service of every Prometheus in the namespace, <service>.<namespace>.svc:<port>.
DEFAULT_PROMETHEUS = urlsplit(AutoscalingSpec.model_fields["prometheus_address"].default)
SERVICE, NAMESPACE = DEFAULT_PROMETHEUS.hostname.split(".")[:2]  # type: ignore[union-attr]
PORT = DEFAULT_PROMETHEUS.port or 9090
NAME = "pagoda"  # the Prometheus object; its pod is prometheus-pagoda-0
POD = f"prometheus-{NAME}-0"
SERVICE_ACCOUNT = "prometheus"
OPERATOR_NAMESPACE = "default"  # where the bundle puts the operator
MANIFESTS = "prometheus-operator-manifests"  # in <bin>, from e2e/lab/tools/build.sh
RBAC = ("prometheus-service-account", "prometheus-cluster-role", "prometheus-cluster-role-binding")
CRDS = [
    f"crd/{kind}.monitoring.coreos.com"
    for kind in ("prometheuses", "servicemonitors", "podmonitors", "prometheusrules", "scrapeconfigs")
]
# Liveness: the operator's probe (/-/healthy every 5 s) with 60 failures allowed instead of 6.
LIVENESS_FAILURES = 60
# The config reloader's arguments as the operator (v0.85.0) writes them for this Prometheus, and one more:
# it re-reads the configuration every 5 s, not every 3 minutes. Its file watch ends at the first change (it
# watches the file, which the kubelet's update of the Secret volume replaces: thanos' pkg/reloader), so
# without this a second ServiceMonitor change reaches Prometheus up to 3 minutes late. A list in a
# container's patch replaces the operator's whole list, so all of it is here.
RELOADER_ARGS = [
    "--listen-address=:8080",
    f"--reload-url=http://localhost:{PORT}/-/reload",
    "--config-file=/etc/prometheus/config/prometheus.yaml.gz",
    "--config-envsubst-file=/etc/prometheus/config_out/prometheus.env.yaml",
    f"--watched-dir=/etc/prometheus/rules/prometheus-{NAME}-rulefiles-0",
    "--watch-interval=5s",
]


@dataclass
class Monitoring:
    cluster: Cluster
    address: str  # the Prometheus pod's IP

    @property
    def url(self) -> str:
        return f"http://{self.address}:{PORT}"

    def pid(self) -> int:
        """The prometheus container's main process on this host (the pod runs on this machine's kubelet)."""
        return container_pid(self.cluster, NAMESPACE, POD, "prometheus")

    def stop(self) -> None:
        """Keeps the operator's and Prometheus's logs in <cluster workdir>/logs, then deletes the Prometheus
        and the operator; their pods go without waiting (the cluster's own stop ends whatever is left)."""
        logs = self.cluster.workdir / "logs"
        for name, args in (
            ("prometheus-operator", ("-n", OPERATOR_NAMESPACE, "deployment/prometheus-operator")),
            ("prometheus", ("-n", NAMESPACE, f"pod/{POD}", "-c", "prometheus")),
            ("prometheus-config-reloader", ("-n", NAMESPACE, f"pod/{POD}", "-c", "config-reloader")),
        ):
            try:
                got = self.cluster.kubectl("logs", *args, check=False, timeout=30)
            except subprocess.TimeoutExpired:  # a pod on a node that is gone (e2e/test_two_nodes.py)
                continue
            (logs / f"{name}.log").write_text(got.stdout + got.stderr)
        for args in (
            ("-n", NAMESPACE, "prometheus", NAME),
            ("-n", OPERATOR_NAMESPACE, "deployment", "prometheus-operator"),
        ):
            self.cluster.kubectl("delete", "--ignore-not-found", "--wait=false", *args, check=False)


def manifest(bin_dir: Path, name: str) -> Path:
    path = bin_dir / MANIFESTS / f"{name}.yaml"
    if not path.is_file():
        raise AssertionError(f"{path} is missing: run `make tools`")
    return path


def manifests(bin_dir: Path, name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(manifest(bin_dir, name).read_text()) if doc]


def prometheus_rbac(bin_dir: Path) -> list[dict[str, Any]]:
    """The operator repository's example RBAC for a Prometheus, its ServiceAccount in NAMESPACE."""
    objects = [doc for name in RBAC for doc in manifests(bin_dir, name)]  # fresh from the files
    for obj in objects:
        if obj["kind"] == "ServiceAccount":
            obj["metadata"]["namespace"] = NAMESPACE
        for subject in obj.get("subjects", []):
            subject["namespace"] = NAMESPACE
    return objects


def prometheus_object() -> dict[str, Any]:
    everything: dict[str, Any] = {}  # an empty selector: every object, every namespace
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Prometheus",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "version": f"v{images.prometheus_release()}",
            "replicas": 1,
            "serviceAccountName": SERVICE_ACCOUNT,
            "scrapeInterval": SCRAPE_INTERVAL,
            "evaluationInterval": SCRAPE_INTERVAL,
            "serviceMonitorSelector": everything,
            "serviceMonitorNamespaceSelector": everything,
            "podMonitorSelector": everything,
            "podMonitorNamespaceSelector": everything,
            "ruleSelector": everything,
            "ruleNamespaceSelector": everything,
            "scrapeConfigSelector": everything,
            "scrapeConfigNamespaceSelector": everything,
            "retention": "2h",
            "resources": {"requests": {"cpu": "50m", "memory": "200Mi"}},
            "containers": [
                {"name": "prometheus", "livenessProbe": {"failureThreshold": LIVENESS_FAILURES}},
                {"name": "config-reloader", "args": RELOADER_ARGS},
            ],
        },
    }


def kube_state_metrics_scrape(address: str) -> dict[str, Any]:
    """A ScrapeConfig for kube-state-metrics at `address` (HOST:PORT), job `kube-state-metrics`, its
    series' own namespace labels kept (honorLabels, as kube-prometheus-stack scrapes it)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1alpha1",
        "kind": "ScrapeConfig",
        "metadata": {"name": "kube-state-metrics", "namespace": NAMESPACE},
        "spec": {
            "honorLabels": True,
            "staticConfigs": [{"targets": [address], "labels": {"job": "kube-state-metrics"}}],
        },
    }


def container_pid(cluster: Cluster, namespace: str, pod: str, container: str) -> int:
    """The PID on this host of `container`'s first process: the process in the container's cgroup (named
    after its ID) whose parent is not (the runtime shim's child)."""
    status = get_json(cluster, "-n", namespace, "pod", pod)["status"]
    (found,) = [s for s in status.get("containerStatuses", []) if s["name"] == container]
    container_id = found["containerID"].split("://", 1)[1]
    members: dict[int, int] = {}  # pid -> parent pid
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if container_id not in (proc / "cgroup").read_text():
                continue
            members[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    roots = [pid for pid, parent in members.items() if parent not in members]
    if len(roots) != 1:
        raise AssertionError(f"{namespace}/{pod} {container}: processes {members} in its cgroup")
    return roots[0]


def prometheus_pod_ip(cluster: Cluster) -> str | None:
    """The Prometheus pod's IP once it is Ready and answers /-/ready (None before)."""
    got = cluster.kubectl("get", "-n", NAMESPACE, "pod", POD, "-o", "json", check=False)
    pod = json.loads(got.stdout) if got.returncode == 0 else {}
    ip = (pod.get("status") or {}).get("podIP")
    return ip if ip and is_ready(pod) and http_ok(f"http://{ip}:{PORT}/-/ready") else None


def start_monitoring(cluster: Cluster, *, ksm_address: str, timeout: float) -> Monitoring:
    """The operator from its bundle, then the Prometheus; returns once Prometheus answers /-/ready."""
    if cluster.node is None:
        raise AssertionError("Prometheus runs in a pod here: start the cluster with a real node")
    deadline = time.monotonic() + timeout
    # As its README says to install it (kubectl reads the file; it holds YAML that PyYAML cannot load).
    bundle = manifest(cluster.bin_dir, "bundle")
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(bundle), timeout=120)
    wait_established(cluster, CRDS, timeout=max(1.0, deadline - time.monotonic()))
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    objects = [namespace, *prometheus_rbac(cluster.bin_dir), prometheus_object()]
    apply_objects(cluster, [*objects, kube_state_metrics_scrape(ksm_address)])
    address = wait_until(
        lambda: prometheus_pod_ip(cluster),
        f"{NAMESPACE}/{POD} ready (the Prometheus Operator's Prometheus)",
        timeout=max(1.0, deadline - time.monotonic()),
        interval=1,
    )
    return Monitoring(cluster, address)
