"""The e2e add-ons as local processes beside a running local control plane (e2e.lab.cluster): KEDA (operator
and metrics adapter, the adapter serving external.metrics.k8s.io through the API server's aggregation layer)
and kube-state-metrics. Binaries and CRDs come from the cluster's bin_dir (built by e2e/lab/tools/build.sh).

    addons = start_addons(cluster)              # returns once all are up, the APIService Available
    addons.kube_state_metrics.metrics_url       # http://HOST:PORT/metrics
    addons.stop()                               # or: with start_addons(cluster) as addons: ...

Each process logs to <cluster workdir>/logs/NAME.log and is stopped by PID. Unless `detach`, it also dies
with the process that started it (like the control plane's components). A detached start records
`addons.pids` with the cluster's own (`cluster.pids.update(addons.pids); cluster.save_state()`), so that
`Cluster.stop()` ends them by PID and executable like the rest.

How KEDA runs out of cluster: the operator and the adapter talk gRPC over mutual TLS on loopback, with
one certificate (ca.crt, tls.crt, tls.key in a --cert-dir); the adapter serves the external metrics API
with the same certificate. The APIService names the ExternalName Service keda/keda-metrics-apiserver ->
localhost, and the API server (aggregator routing off) dials localhost:<adapter port> and verifies the
adapter's certificate against the APIService's caBundle for keda-metrics-apiserver.keda.svc.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import yaml
from prometheus_client.parser import text_string_to_metric_families

from e2e.lab._objects import request
from e2e.lab._pki import TlsDir, write_tls_dir
from e2e.lab.processes import (
    REPO_ROOT,
    ComponentProcess,
    StartError,
    free_ports,
    http_ok,
    listens,
    wait_until,
    wait_while_running,
)
from e2e.lab.realnode import NodePaths

if TYPE_CHECKING:  # not at run time: e2e.lab.cluster may import this module to start the add-ons
    from e2e.lab.cluster import Cluster

ADDON_BINARIES = ("keda-operator", "keda-adapter", "kube-state-metrics")
KEDA_NAMESPACE = "keda"
KEDA_CRD_FILES = (
    "keda.sh_scaledobjects.yaml",
    "keda.sh_scaledjobs.yaml",
    "keda.sh_triggerauthentications.yaml",
    "keda.sh_clustertriggerauthentications.yaml",
    "eventing.keda.sh_cloudeventsources.yaml",
    "eventing.keda.sh_clustercloudeventsources.yaml",
)
# The Gateway API Inference Extension's InferencePool (v1.5.0): what the operator writes for spec.routing and
# the endpoint picker (e2e/lab/gateway.py) reads. Installed with the add-ons, as a cluster running GIE has it.
GATEWAY_CRD_FILES = ("inference.networking.k8s.io_inferencepools.yaml",)
ADAPTER_SERVICE = "keda-metrics-apiserver"
EXTERNAL_METRICS_GROUP = "external.metrics.k8s.io"
EXTERNAL_METRICS_APISERVICE = f"v1beta1.{EXTERNAL_METRICS_GROUP}"
# Server-side: KEDA's CRDs are too large for client-side apply's annotation. Idempotent: a restarted
# cluster's old objects get the new ports and CA.
APPLY = ("apply", "--server-side", "--force-conflicts", "--field-manager=pagoda-e2e-addons")
START_TIMEOUT = 120.0
GRPC_CONNECTED = "Connection to KEDA Metrics Service gRPC server has been successfully established"
# The chart's custom-resource-state config (spec.cost and the GPU count of each InferenceService), the very
# file users hand to their kube-state-metrics.
KSM_CUSTOM_RESOURCE_STATE = REPO_ROOT / "charts/pagoda/files/kube-state-metrics/inferenceservice.yaml"


class AddonsMissingError(StartError):
    """The add-ons' binaries or CRDs are not in the cluster's bin_dir."""


def check_addon_files(bin_dir: Path) -> None:
    missing = [name for name in ADDON_BINARIES if not os.access(bin_dir / name, os.X_OK)]
    missing += [
        f"crds/{name}"
        for name in (*KEDA_CRD_FILES, *GATEWAY_CRD_FILES)
        if not (bin_dir / "crds" / name).is_file()
    ]
    if missing:
        raise AddonsMissingError(
            f"The add-ons' files are missing from {bin_dir} (PAGODA_BIN): {', '.join(missing)}. "
            "Run `make tools` (it runs e2e/lab/tools/build.sh .pagoda-dev/bin)."
        )


def _pids(*procs: ComponentProcess) -> dict[str, int]:
    return {p.name: p.pid for p in procs if p.pid is not None}


def _kubectl(cluster: Cluster, *args: str, input: str | None = None) -> str:
    proc = cluster.kubectl(*args, check=False, input=input, timeout=120)
    if proc.returncode != 0:
        raise StartError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def apply_objects(cluster: Cluster, docs: list[dict[str, Any]]) -> None:
    """Server-side apply of the add-ons' objects, under the add-ons' field manager."""
    _kubectl(cluster, *APPLY, "--filename=-", input=yaml.safe_dump_all(docs))


# --- KEDA ---------------------------------------------------------------------------------------------


@dataclass
class Keda:
    """KEDA's operator and metrics adapter, running. Ports are on 127.0.0.1 except `adapter_metrics_port`
    (KEDA's adapter binds its own /metrics on all interfaces; it has no flag for the host)."""

    operator: ComponentProcess
    adapter: ComponentProcess
    tls: TlsDir
    grpc_port: int  # operator's metrics service (gRPC, mutual TLS), dialled by the adapter
    operator_metrics_port: int
    health_port: int  # operator's /healthz and /readyz
    adapter_port: int  # adapter's HTTPS: the external metrics API, the APIService's service port
    adapter_metrics_port: int

    @property
    def operator_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.operator_metrics_port}/metrics"

    @property
    def adapter_url(self) -> str:
        return f"https://127.0.0.1:{self.adapter_port}"

    @property
    def pids(self) -> dict[str, int]:
        return _pids(self.operator, self.adapter)

    def stop(self) -> None:
        self.adapter.stop()
        self.operator.stop()


def keda_env() -> dict[str, str]:
    """KEDA's namespaces: it watches all (WATCH_NAMESPACE must be set, empty means all), and keeps its
    cluster-wide objects' Secrets in `keda`."""
    env = dict(os.environ)
    env.update(WATCH_NAMESPACE="", KEDA_CLUSTER_OBJECT_NAMESPACE=KEDA_NAMESPACE, POD_NAMESPACE=KEDA_NAMESPACE)
    return env


def write_keda_certs(directory: Path) -> TlsDir:
    """One CA and one certificate, for the gRPC link between operator and adapter (both ends, dialled on
    127.0.0.1) and for the adapter's HTTPS (verified by the API server as <service>.<namespace>.svc)."""
    names = ["localhost"]
    for service in (ADAPTER_SERVICE, "keda-operator"):
        names += [service, f"{service}.{KEDA_NAMESPACE}", f"{service}.{KEDA_NAMESPACE}.svc"]
        names.append(f"{service}.{KEDA_NAMESPACE}.svc.cluster.local")
    return write_tls_dir(directory, "keda", names, ["127.0.0.1"])


def install_keda_crds(cluster: Cluster, timeout: float = 60.0) -> None:
    """Applies all six KEDA CRDs and the `keda` namespace; waits until the CRDs are Established."""
    apply_objects(cluster, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KEDA_NAMESPACE}}])
    install_crds(cluster, KEDA_CRD_FILES, timeout)


def install_gateway_crds(cluster: Cluster, timeout: float = 60.0) -> None:
    """Applies the InferencePool CRD; waits until it is Established."""
    install_crds(cluster, GATEWAY_CRD_FILES, timeout)


def install_crds(cluster: Cluster, files: tuple[str, ...], timeout: float) -> None:
    """Applies the CRD files (from the cluster's bin_dir/crds); waits until they are Established."""
    crd_dir = cluster.bin_dir / "crds"
    _kubectl(cluster, *APPLY, *[f"--filename={crd_dir / name}" for name in files])
    names = []
    for name in files:
        names += [
            f"crd/{doc['metadata']['name']}"
            for doc in yaml.safe_load_all((crd_dir / name).read_text())
            if doc
        ]
    wait_established(cluster, names, timeout)


def wait_established(cluster: Cluster, names: list[str], timeout: float) -> None:
    """Polls each CRD (`crd/<name>`) until it is Established. Not `kubectl wait`: that exits 1 at once
    while the API server has not yet listed a CRD just applied (a busy machine: CI at 346655e)."""
    jsonpath = 'jsonpath={.status.conditions[?(@.type=="Established")].status}'
    deadline = time.monotonic() + timeout

    def established(name: str) -> bool:
        got = cluster.kubectl("get", name, "-o", jsonpath, check=False)
        return got.returncode == 0 and got.stdout.strip() == "True"

    for name in names:
        wait_until(
            lambda name=name: established(name),
            f"{name} to be Established",
            timeout=max(deadline - time.monotonic(), 1.0),
            interval=0.5,
            error=StartError,
        )


def external_metrics_objects(adapter_port: int, ca_cert: Path) -> list[dict[str, Any]]:
    """The ExternalName Service keda/keda-metrics-apiserver -> localhost and the APIService that routes
    external.metrics.k8s.io to it, verified with `ca_cert` (no insecureSkipTLSVerify)."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": ADAPTER_SERVICE, "namespace": KEDA_NAMESPACE},
        "spec": {
            "type": "ExternalName",
            "externalName": "localhost",
            "ports": [{"name": "https", "port": adapter_port, "protocol": "TCP"}],
        },
    }
    apiservice = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": EXTERNAL_METRICS_APISERVICE},
        "spec": {
            "group": EXTERNAL_METRICS_GROUP,
            "version": "v1beta1",
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
            "service": {"name": ADAPTER_SERVICE, "namespace": KEDA_NAMESPACE, "port": adapter_port},
            "caBundle": base64.b64encode(ca_cert.read_bytes()).decode(),
        },
    }
    return [service, apiservice]


def apiservice_condition(api: Any, name: str = EXTERNAL_METRICS_APISERVICE) -> dict[str, str]:
    """The APIService's Available condition ({} while it has none); `api`: a kubernetes ApiClient."""
    status, obj = request(api, "GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{name}")
    if status != 200:
        return {}
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Available":
            return {k: str(v) for k, v in cond.items()}
    return {}


def _operator_args(keda: Keda, kubeconfig: Path) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        f"--metrics-bind-address=127.0.0.1:{keda.operator_metrics_port}",
        f"--health-probe-bind-address=127.0.0.1:{keda.health_port}",
        f"--metrics-service-bind-address=127.0.0.1:{keda.grpc_port}",
        f"--cert-dir={keda.tls.directory}",
        "--enable-cert-rotation=false",
        "--leader-elect=false",
        "--zap-encoder=console",
    ]


def _adapter_args(keda: Keda, kubeconfig: Path) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        f"--lister-kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={keda.adapter_port}",
        f"--tls-cert-file={keda.tls.cert}",
        f"--tls-private-key-file={keda.tls.key}",
        f"--cert-dir={keda.tls.directory}",  # its gRPC client certificate and CA
        f"--metrics-service-address=127.0.0.1:{keda.grpc_port}",
        f"--port={keda.adapter_metrics_port}",  # its default, 8080, would collide
        "--zap-encoder=console",
    ]


def start_keda(
    cluster: Cluster, *, detach: bool = False, timeout: float = START_TIMEOUT, log_dir: Path | None = None
) -> Keda:
    """Installs KEDA's CRDs, starts its operator and adapter, registers the external metrics API and waits
    until the APIService is Available. On any failure, stops what it started and raises StartError."""
    check_addon_files(cluster.bin_dir)
    deadline = time.monotonic() + timeout
    log_dir = log_dir or cluster.workdir / "logs"
    grpc, operator_metrics, health, adapter, adapter_metrics = free_ports(5)
    keda = Keda(
        operator=ComponentProcess("keda-operator", cluster.bin_dir, log_dir, detach=detach),
        adapter=ComponentProcess("keda-adapter", cluster.bin_dir, log_dir, detach=detach),
        tls=write_keda_certs(cluster.workdir / "addons" / "keda-certs"),
        grpc_port=grpc,
        operator_metrics_port=operator_metrics,
        health_port=health,
        adapter_port=adapter,
        adapter_metrics_port=adapter_metrics,
    )
    procs = [keda.operator, keda.adapter]
    api = cluster.api_client()
    try:
        install_keda_crds(cluster, timeout=max(deadline - time.monotonic(), 1))
        # The operator first: the adapter dials its gRPC port once at start, then only after a back-off.
        # With a real node, the operator resolves names as a pod does: a ScaledObject's default Prometheus
        # address (prometheus-operated.monitoring.svc) is a Service name.
        resolv_conf = None if cluster.node is None else NodePaths.under(cluster.workdir).resolv_conf
        keda.operator.start(_operator_args(keda, cluster.kubeconfig), env=keda_env(), resolv_conf=resolv_conf)
        operator_ready = f"http://127.0.0.1:{health}/readyz"
        wait_while_running(lambda: http_ok(operator_ready), "keda-operator's /readyz", procs[:1], deadline)
        wait_while_running(lambda: listens(grpc), "keda-operator's gRPC port", procs[:1], deadline)
        keda.adapter.start(_adapter_args(keda, cluster.kubeconfig), env=keda_env())
        adapter_tls = ssl.create_default_context(cafile=str(keda.tls.ca_cert))
        adapter_ready = f"{keda.adapter_url}/readyz"
        wait_while_running(
            lambda: http_ok(adapter_ready, context=adapter_tls), "keda-adapter's /readyz", procs, deadline
        )
        # Its only sign that the mutual TLS with the operator works is this line of its log.
        wait_while_running(
            lambda: GRPC_CONNECTED in keda.adapter.log(), "keda-adapter's gRPC connection", procs, deadline
        )

        apply_objects(cluster, external_metrics_objects(adapter, keda.tls.ca_cert))
        last: dict[str, str] = {}

        def available() -> bool:
            nonlocal last
            last = apiservice_condition(api)
            return last.get("status") == "True"

        try:
            wait_while_running(
                available, f"APIService {EXTERNAL_METRICS_APISERVICE} to be Available", procs, deadline
            )
        except StartError as exc:
            raise StartError(f"{exc}\nIts Available condition: {json.dumps(last)}") from None
    except BaseException:
        keda.stop()
        raise
    finally:
        api.close()
    return keda


# --- kube-state-metrics -------------------------------------------------------------------------------


class KubeStateMetrics(ComponentProcess):
    """kube-state-metrics: object metrics at `metrics_url` (the built-in ones, and the InferenceServices'
    from the chart's custom-resource-state config), its own at `telemetry_url` (loopback). The metrics listen
    on the real node's address when there is one, where the Prometheus pod scrapes them (a pod cannot reach
    the host's loopback), else on loopback."""

    def __init__(self, cluster: Cluster, log_dir: Path, *, detach: bool) -> None:
        super().__init__("kube-state-metrics", cluster.bin_dir, log_dir, detach=detach)
        self.kubeconfig = cluster.kubeconfig
        self.host = "127.0.0.1" if cluster.node is None else cluster.node.address
        self.port, self.telemetry_port = free_ports(2)

    @property
    def address(self) -> str:
        """HOST:PORT of the metrics, a scrape target."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    @property
    def telemetry_url(self) -> str:
        return f"http://127.0.0.1:{self.telemetry_port}"

    def args(self) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--host={self.host}",
            f"--port={self.port}",
            "--telemetry-host=127.0.0.1",
            f"--telemetry-port={self.telemetry_port}",
            # Discovers the InferenceService CRD when it appears (every 3 s), also after the start.
            f"--custom-resource-state-config-file={KSM_CUSTOM_RESOURCE_STATE}",
        ]

    def wait_ready(self, deadline: float) -> None:
        """Both servers answer (/readyz: its own registry has metrics)."""
        healthz, readyz = f"{self.url}/healthz", f"{self.telemetry_url}/readyz"
        wait_while_running(lambda: http_ok(healthz), "kube-state-metrics' /healthz", [self], deadline)
        wait_while_running(lambda: http_ok(readyz), "kube-state-metrics' /readyz", [self], deadline)

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """The current samples of metric `name`: (labels, value) pairs."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            text = response.read().decode()
        return [
            (dict(sample.labels), sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        ]

    def value(self, name: str, **labels: str) -> float | None:
        """The value of the one sample of `name` that carries all of `labels` (None: no such sample)."""
        found = [v for got, v in self.samples(name) if all(got.get(k) == w for k, w in labels.items())]
        if len(found) > 1:
            raise AssertionError(f"{len(found)} samples of {name} match {labels}")
        return found[0] if found else None


def start_kube_state_metrics(
    cluster: Cluster, *, detach: bool = False, timeout: float = START_TIMEOUT, log_dir: Path | None = None
) -> KubeStateMetrics:
    """Starts kube-state-metrics against `cluster` and waits until it answers."""
    check_addon_files(cluster.bin_dir)
    ksm = KubeStateMetrics(cluster, log_dir or cluster.workdir / "logs", detach=detach)
    ksm.start(ksm.args())
    try:
        ksm.wait_ready(time.monotonic() + timeout)
    except BaseException:
        ksm.stop()
        raise
    return ksm


# --- both ---------------------------------------------------------------------------------------------


@dataclass
class Addons:
    keda: Keda
    kube_state_metrics: KubeStateMetrics

    @property
    def pids(self) -> dict[str, int]:
        """Binary name -> PID, for a detached cluster's state file."""
        return {**self.keda.pids, **_pids(self.kube_state_metrics)}

    def stop(self) -> None:
        self.kube_state_metrics.stop()
        self.keda.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


def start_addons(cluster: Cluster, *, detach: bool = False, timeout: float = START_TIMEOUT) -> Addons:
    """Starts kube-state-metrics and KEDA against `cluster` (kube-state-metrics comes up while KEDA starts);
    returns once all answer and the external metrics APIService is Available."""
    check_addon_files(cluster.bin_dir)
    deadline = time.monotonic() + timeout
    ksm = KubeStateMetrics(cluster, cluster.workdir / "logs", detach=detach)
    ksm.start(ksm.args())
    try:
        install_gateway_crds(cluster, timeout=timeout)
        keda = start_keda(cluster, detach=detach, timeout=timeout)
        try:
            ksm.wait_ready(deadline)
        except BaseException:
            keda.stop()
            raise
    except BaseException:
        ksm.stop()
        raise
    return Addons(keda, ksm)
