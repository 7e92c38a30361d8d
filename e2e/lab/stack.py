"""The add-ons on top of a running local cluster, as `make cluster-up` and the e2e tests that need them run
them: KEDA and kube-state-metrics (e2e/lab/addons.py) and Prometheus kept in step with the cluster's
ServiceMonitors (e2e/lab/monitoring.py), which also scrapes kube-state-metrics.

    stack = start_stack(cluster)     # returns once KEDA's APIService is Available and Prometheus is ready
    stack.prometheus_url             # http://HOST:PORT, for the tests' own queries
    stack.stop()

With a real node, Prometheus is also where a user's cluster has it: the Service `prometheus-operated` in
namespace `monitoring`, port 9090 (what the Prometheus Operator names it, and so the default
`spec.autoscaling.prometheusAddress`). Prometheus listens on the node's address, which the Service's
EndpointSlice names (a selectorless Service: the process is not a pod), and KEDA's operator resolves the name
through the cluster DNS (e2e/lab/clusterdns.py). ScaledObjects then need no address of the harness's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from e2e.lab import images
from e2e.lab.addons import Addons, apply_objects, start_addons, wait_established
from e2e.lab.cluster import Cluster, start_private
from e2e.lab.processes import (
    REPO_ROOT,
    ComponentProcess,
    OperatorProcess,
    free_port,
    http_ok,
    wait_while_running,
)
from pagoda.operator.api.scaling import AutoscalingSpec

MONITORING = "monitoring"
START_TIMEOUT = 180.0
# Where a ScaledObject looks for Prometheus unless the InferenceService says otherwise.
DEFAULT_PROMETHEUS = urlsplit(AutoscalingSpec.model_fields["prometheus_address"].default)
# Its Service: <name>.<namespace>.svc.
PROMETHEUS_SERVICE, PROMETHEUS_NAMESPACE = DEFAULT_PROMETHEUS.hostname.split(".")[:2]  # type: ignore[union-attr]


@dataclass
class Stack:
    cluster: Cluster
    addons: Addons
    monitoring: ComponentProcess
    prometheus_host: str
    prometheus_port: int

    @property
    def prometheus_url(self) -> str:
        return f"http://{self.prometheus_host}:{self.prometheus_port}"

    @property
    def pids(self) -> dict[str, int]:
        pids = dict(self.addons.pids)
        if self.monitoring.pid is not None:
            pids[MONITORING] = self.monitoring.pid
        return pids

    def stop(self) -> None:
        self.monitoring.stop()
        self.addons.stop()


def start_monitoring(
    cluster: Cluster, *, detach: bool, ksm_address: str, timeout: float
) -> tuple[ComponentProcess, str, int]:
    """`python -m e2e.lab.monitoring` (Prometheus and its ServiceMonitor sync) against `cluster`; returns it
    and the address Prometheus listens on (the real node's, or loopback without one)."""
    host, port = ("127.0.0.1" if cluster.node is None else cluster.node.address), free_port()
    process = ComponentProcess(MONITORING, cluster.bin_dir, cluster.workdir / "logs", detach=detach)
    args = [f"--kubeconfig={cluster.kubeconfig}", f"--workdir={cluster.workdir / 'prometheus'}"]
    args += [f"--host={host}", f"--port={port}", f"--static=kube-state-metrics={ksm_address}"]
    process.start(args, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    deadline, ready = time.monotonic() + timeout, f"http://{host}:{port}/-/ready"
    try:
        wait_while_running(lambda: http_ok(ready), f"Prometheus at {ready}", [process], deadline)
    except BaseException:
        process.stop()
        raise
    return process, host, port


def prometheus_service(host: str, port: int) -> list[dict[str, Any]]:
    """The namespace, Service and EndpointSlice that make DEFAULT_PROMETHEUS lead to Prometheus at host:port.
    A ClusterIP Service, where the Prometheus Operator's is headless: the Service maps port 9090 to the
    process's free port, which a headless name could not."""
    name, namespace = PROMETHEUS_SERVICE, PROMETHEUS_NAMESPACE
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"ports": [{"name": "web", "port": DEFAULT_PROMETHEUS.port, "targetPort": port}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {
                    "kubernetes.io/service-name": name,
                    "endpointslice.kubernetes.io/managed-by": "e2e.pagoda.dev",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [host], "conditions": {"ready": True}}],
            "ports": [{"name": "web", "port": port, "protocol": "TCP"}],
        },
    ]


def start_stack(cluster: Cluster, *, detach: bool = False, timeout: float = START_TIMEOUT) -> Stack:
    addons = start_addons(cluster, detach=detach, timeout=timeout)
    try:
        ksm = addons.kube_state_metrics.metrics_url.removeprefix("http://").removesuffix("/metrics")
        monitoring, host, port = start_monitoring(cluster, detach=detach, ksm_address=ksm, timeout=timeout)
    except BaseException:
        addons.stop()
        raise
    if cluster.node is not None:
        apply_objects(cluster, prometheus_service(host, port))
    return Stack(cluster, addons, monitoring, host, port)


def run_operator(cluster: Cluster, log: Path) -> OperatorProcess:
    """Installs the InferenceService CRD from crds/ and starts `pagoda-operator` (as in production); on a
    cluster with a real node its pods run the CPU runtime image (`make images`)."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO_ROOT / "crds"))
    wait_established(cluster, ["crd/inferenceservices.pagoda.dev"], timeout=60)
    runtime_image = images.runtime_cpu_image() if cluster.node is not None else None
    return OperatorProcess(cluster.kubeconfig, log, runtime_image=runtime_image).start()


@contextmanager
def private_stack(bin_dir: Path | None = None) -> Iterator[Stack]:
    """A private cluster with the real node and the add-ons, for scripts (`python -m e2e.lab.autoscaling`);
    all stop on exit."""
    cluster = start_private(bin_dir, real_node=True)
    try:
        stack = start_stack(cluster)
        try:
            yield stack
        finally:
            stack.stop()
    finally:
        cluster.stop()
