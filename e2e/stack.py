"""The add-ons on top of a running local cluster, as `make cluster-up` and the e2e tests that need them run
them: KEDA and kube-state-metrics (e2e/addons.py) and Prometheus kept in step with the cluster's
ServiceMonitors (e2e/monitoring.py), which also scrapes kube-state-metrics.

    stack = start_stack(cluster)     # returns once KEDA's APIService is Available and Prometheus is ready
    stack.prometheus_url             # http://127.0.0.1:PORT, what a ScaledObject's serverAddress names
    stack.stop()
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from e2e import _procs, images
from e2e.addons import AddonProcess, Addons, start_addons
from e2e.cluster import Cluster, start_private
from e2e.processes import OperatorProcess, free_port, http_ok

MONITORING = "monitoring"
START_TIMEOUT = 180.0


@dataclass
class Stack:
    cluster: Cluster
    addons: Addons
    monitoring: AddonProcess
    prometheus_port: int

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

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
) -> tuple[AddonProcess, int]:
    """`python -m e2e.monitoring` (Prometheus and its ServiceMonitor sync) against `cluster`."""
    port = free_port()
    process = AddonProcess(MONITORING, cluster.bin_dir, cluster.workdir / "logs", detach=detach)
    process.exe = _procs.program(cluster.bin_dir, MONITORING)
    args = ["-m", _procs.PYTHON_COMPONENTS[MONITORING], f"--kubeconfig={cluster.kubeconfig}"]
    args += [f"--workdir={cluster.workdir / 'prometheus'}", f"--port={port}"]
    args += [f"--static=kube-state-metrics={ksm_address}"]
    process.start(args, env={**os.environ, "PYTHONPATH": str(_procs.REPO_ROOT)})
    deadline = time.monotonic() + timeout
    while not http_ok(f"http://127.0.0.1:{port}/-/ready"):
        process.check_alive()
        if time.monotonic() > deadline:
            process.stop()
            raise _procs.StartError(f"Prometheus did not get ready in {timeout:.0f}s:\n{process.excerpt()}")
        time.sleep(0.2)
    return process, port


def start_stack(cluster: Cluster, *, detach: bool = False, timeout: float = START_TIMEOUT) -> Stack:
    addons = start_addons(cluster, detach=detach, timeout=timeout)
    try:
        ksm = addons.kube_state_metrics.metrics_url.removeprefix("http://").removesuffix("/metrics")
        monitoring, port = start_monitoring(cluster, detach=detach, ksm_address=ksm, timeout=timeout)
    except BaseException:
        addons.stop()
        raise
    return Stack(cluster, addons, monitoring, port)


def run_operator(cluster: Cluster, log: Path) -> OperatorProcess:
    """Installs the InferenceService CRD from crds/ and starts `pagoda-operator` (as in production); on a
    cluster with a real node its pods run the CPU runtime image (`make images`)."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(_procs.REPO_ROOT / "crds"))
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "crd/inferenceservices.pagoda.dev"
    )
    runtime_image = images.runtime_cpu_image() if cluster.node is not None else None
    return OperatorProcess(cluster.kubeconfig, log, runtime_image=runtime_image).start()


@contextmanager
def private_stack(bin_dir: Path | None = None) -> Iterator[Stack]:
    """A private cluster with the real node and the add-ons, for scripts (`python -m e2e.autoscaling`); all
    stop on exit."""
    cluster = start_private(bin_dir, real_node=True)
    try:
        stack = start_stack(cluster)
        try:
            yield stack
        finally:
            stack.stop()
    finally:
        cluster.stop()
