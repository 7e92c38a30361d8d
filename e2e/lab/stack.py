"""The add-ons on top of a running local cluster, as `make cluster-up` and the e2e tests that need them run
them: KEDA and kube-state-metrics (e2e/lab/addons.py), and the Prometheus Operator with the Prometheus it runs
in a pod on the real node (e2e/lab/prometheus_operator.py), which scrapes what the cluster's ServiceMonitors,
PodMonitors and ScrapeConfigs name (kube-state-metrics among them) and evaluates its PrometheusRules.

    stack = start_stack(cluster)     # returns once KEDA's APIService is Available and Prometheus is ready
    stack.prometheus_url             # http://<pod IP>:9090, for the tests' own queries
    stack.stop()

Prometheus is where a user's cluster has it: the Service `prometheus-operated` in namespace `monitoring`, port
9090 (the Service the Prometheus Operator writes, and so the default `spec.autoscaling.prometheusAddress`).
KEDA's operator, a host process, resolves that name through the cluster DNS (e2e/lab/clusterdns.py).
ScaledObjects then need no address of the harness's. The stack needs the real node (its Prometheus is a pod).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from e2e.lab import images
from e2e.lab.addons import Addons, start_addons, wait_established
from e2e.lab.cluster import Cluster, start_private
from e2e.lab.processes import REPO_ROOT, OperatorProcess
from e2e.lab.prometheus_operator import NAMESPACE as PROMETHEUS_NAMESPACE
from e2e.lab.prometheus_operator import Monitoring, start_monitoring

START_TIMEOUT = 180.0
# The Prometheus pod's start: the operator's and Prometheus's images pulled from the local registry (a first
# pull of about 150 MB), the operator's first pass, the config reloader's init container.
MONITORING_TIMEOUT = 300.0


@dataclass
class Stack:
    cluster: Cluster
    addons: Addons
    monitoring: Monitoring

    @property
    def prometheus_url(self) -> str:
        return self.monitoring.url

    @property
    def pids(self) -> dict[str, int]:
        return dict(self.addons.pids)

    def stop(self) -> None:
        self.monitoring.stop()
        self.addons.stop()


def start_stack(cluster: Cluster, *, detach: bool = False, timeout: float = START_TIMEOUT) -> Stack:
    started = time.monotonic()
    addons = start_addons(cluster, detach=detach, timeout=timeout)
    try:
        ksm = addons.kube_state_metrics.address
        monitoring = start_monitoring(cluster, ksm_address=ksm, timeout=MONITORING_TIMEOUT)
    except BaseException:
        addons.stop()
        raise
    print(f"add-ons and Prometheus ready in {time.monotonic() - started:.0f} s", flush=True)
    return Stack(cluster, addons, monitoring)


def run_operator(cluster: Cluster, log: Path) -> OperatorProcess:
    """Installs the InferenceService CRD from crds/ and starts `pagoda-operator` (as in production); on a
    cluster with a real node its pods run the CPU runtime image (`make images`), and their NetworkPolicies
    admit Prometheus's namespace, as the chart's default `networkPolicy.allowFromNamespaces` does."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO_ROOT / "crds"))
    wait_established(cluster, ["crd/inferenceservices.pagoda.dev"], timeout=60)
    runtime_image = images.runtime_cpu_image() if cluster.node is not None else None
    operator = OperatorProcess(cluster.kubeconfig, log, runtime_image=runtime_image)
    operator.extra_args += ["--allow-from-namespace", PROMETHEUS_NAMESPACE]
    return operator.start()


@contextmanager
def private_stack(bin_dir: Path | None = None) -> Iterator[Stack]:
    """A private cluster with the real node and the add-ons, for scripts (`python -m e2e.lab.autoscaling`);
    all stop on exit. Its folder goes with it, unless the script failed: then its logs are kept, and named."""
    cluster = start_private(bin_dir, real_node=True)
    failed = True
    try:
        stack = start_stack(cluster)
        try:
            yield stack
            failed = False
        finally:
            stack.stop()
    finally:
        cluster.stop()
        cluster.discard(failed)
