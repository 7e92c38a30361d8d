"""Prometheus for the local cluster, configured as the Prometheus Operator would configure it (test harness).

    python -m e2e.lab.monitoring --kubeconfig K --workdir DIR [--host H] --port PORT [--static JOB=HOST:PORT
    ...]

Runs Debian's `prometheus` as a child on HOST:PORT (default 127.0.0.1; e2e/lab/stack.py gives a real node's
address, where the `prometheus-operated` Service sends cluster traffic) and keeps its configuration in step
with the cluster: every 2 seconds it lists the ServiceMonitors and turns them into the scrape configs the
Prometheus Operator would write (e2e/lab/prometheus_sd.py: one job per endpoint, its relabelling), adds the
static jobs (kube-state-metrics), and reloads Prometheus when the result changed. The series of a runtime pod
so carry the `namespace`, `service` and `pod` labels that the operator's ScaledObject queries and the
dashboards select, without a hand-written target per test.

Discovery: Debian builds Prometheus without Kubernetes service discovery (its NEWS: "Kubernetes support has
been completely removed"), so this process is the discovery. It lists EndpointSlices, Services and Pods from
the API server and writes, per job, a file_sd file with the same `__meta_kubernetes_*` labels that
`kubernetes_sd_configs` (role endpointslice) would give; Prometheus applies the job's unchanged relabel
rules to them.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from e2e.lab._objects import request
from e2e.lab.observability import SCRAPE_INTERVAL, prometheus_binary
from e2e.lab.processes import die_with_parent
from e2e.lab.prometheus_sd import TlsFiles, endpointslice_targets, scrape_configs, with_file_sd

SYNC_SECONDS = 2.0
# Harness processes that stand in for a pod but listen on loopback (the endpoint picker, e2e/lab/gateway.py)
# each write a file_sd file into <workdir>/local-targets/ with the labels their ServiceMonitor would give
# (namespace, service, ...); one job reads them all, and Prometheus picks up new files by itself.
LOCAL_TARGETS_JOB = "local-targets"


def local_targets_dir(workdir: Path) -> Path:
    return workdir / LOCAL_TARGETS_JOB


def api_server_tls(kubeconfig: Path) -> tuple[str, TlsFiles]:
    """The API server URL and the CA and client certificate files of the kubeconfig's current context."""
    config = yaml.safe_load(kubeconfig.read_text())
    context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    tls = TlsFiles(
        Path(cluster["certificate-authority"]), Path(user["client-certificate"]), Path(user["client-key"])
    )
    return cluster["server"], tls


def list_all(api: Any, path: str) -> list[dict[str, Any]] | None:
    """Every object at a cluster-wide list path (None when the API server did not answer)."""
    try:
        status, body = request(api, "GET", path)
    except Exception:  # noqa: BLE001 - the API server restarting: try again next round
        return None
    if status != 200:
        return None
    items: list[dict[str, Any]] = body["items"]
    return items


def discover(api: Any, kubeconfig: Path, workdir: Path, static: dict[str, str]) -> str | None:
    """Writes each ServiceMonitor job's file_sd targets; returns the Prometheus config that reads them
    (None when the cluster could not be read)."""
    monitors = list_all(api, "/apis/monitoring.coreos.com/v1/servicemonitors")
    slices = list_all(api, "/apis/discovery.k8s.io/v1/endpointslices")
    services = list_all(api, "/api/v1/services")
    pods = list_all(api, "/api/v1/pods")
    if monitors is None or slices is None or services is None or pods is None:
        return None
    server, tls = api_server_tls(kubeconfig)
    jobs: list[dict[str, Any]] = [
        {"job_name": job, "static_configs": [{"targets": [address]}]}
        for job, address in sorted(static.items())
    ]
    try:
        generated = scrape_configs(monitors, server, tls)
    except ValueError as exc:  # a ServiceMonitor this harness cannot express: say so, scrape the rest
        print(f"skipping ServiceMonitors: {exc}", file=sys.stderr, flush=True)
        generated = []
    for config in generated:
        path = workdir / "targets" / (re.sub(r"[^A-Za-z0-9_.-]", "_", config["job_name"]) + ".json")
        write_if_changed(
            path, json.dumps(endpointslice_targets(config, slices, services, pods), sort_keys=True)
        )
        jobs.append(with_file_sd(config, path))
    local = {"files": [str(local_targets_dir(workdir) / "*.json")], "refresh_interval": "1s"}
    jobs.append({"job_name": LOCAL_TARGETS_JOB, "file_sd_configs": [local]})
    settings = {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL}
    return yaml.safe_dump({"global": settings, "scrape_configs": jobs}, sort_keys=False)


def write_if_changed(path: Path, text: str) -> bool:
    """Atomic (Prometheus never reads half a file) and only on a change."""
    if path.is_file() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return True


def run(kubeconfig: Path, workdir: Path, host: str, port: int, static: dict[str, str]) -> int:
    from kubernetes import config as kube_config

    api = kube_config.new_client_from_config(config_file=str(kubeconfig))
    local_targets_dir(workdir).mkdir(parents=True, exist_ok=True)
    config_path = workdir / "prometheus.yml"
    write_if_changed(config_path, discover(api, kubeconfig, workdir, static) or "")
    args = [
        prometheus_binary(),
        f"--config.file={config_path}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address={host}:{port}",
        "--web.enable-lifecycle",
        "--storage.tsdb.retention.time=2h",
        "--log.level=warn",
    ]
    with (workdir / "prometheus.log").open("ab") as log:
        prometheus = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    signal.signal(signal.SIGTERM, lambda *_: prometheus.terminate())
    print(f"prometheus (pid {prometheus.pid}) on {host}:{port}", flush=True)
    while prometheus.poll() is None:
        wanted = discover(api, kubeconfig, workdir, static)
        if wanted is not None and write_if_changed(config_path, wanted):
            try:
                reload = urllib.request.Request(f"http://{host}:{port}/-/reload", method="POST")
                urllib.request.urlopen(reload, timeout=10).close()
                print(
                    f"reloaded: jobs {[job['job_name'] for job in yaml.safe_load(wanted)['scrape_configs']]}",
                    flush=True,
                )
            except OSError as exc:
                print(f"reload failed: {exc!r}", file=sys.stderr, flush=True)
        time.sleep(SYNC_SECONDS)
    return int(prometheus.wait())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.lab.monitoring", description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", required=True, type=Path)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--static", action="append", default=[], help="JOB=HOST:PORT, scraped as is")
    args = parser.parse_args(argv)
    static = dict(item.split("=", 1) for item in args.static)
    return run(args.kubeconfig, args.workdir, args.host, args.port, static)


if __name__ == "__main__":
    sys.exit(main())
