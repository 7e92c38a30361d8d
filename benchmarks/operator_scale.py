"""Operator benchmark: N InferenceServices at once against the local control plane, beside a floor.

Floor: the same child objects (Deployment, Service, PDB from the same builders) created by a bare client,
no operator. Then: the operator running, N InferenceServices created at once; time until every child is
applied and every InferenceService reports Ready (watched); per-object latency p50/p99; the operator's RSS;
its API writes per object by kind, and during an idle period (target 0); the ratios of the two phases and
the machine's load average during each (the machine is shared: compare phases that ran at similar load).

    make bench-operator   # = PAGODA_BIN=.pagoda-dev/bin .venv/bin/python benchmarks/operator_scale.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from servers import ROOT

sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "integration")]

from harness import OperatorProcess  # noqa: E402

from e2e.lab import _objects  # noqa: E402
from e2e.lab.addons import wait_established  # noqa: E402
from e2e.lab.cluster import GPU_PRODUCT, Cluster, start_private  # noqa: E402
from pagoda.operator.api import InferenceServiceSpec  # noqa: E402
from pagoda.operator.kube.client import Kube, KubeError, resource_path  # noqa: E402
from pagoda.operator.resources import CHILD_KINDS, desired_children  # noqa: E402

SPEC: dict[str, Any] = {
    "model": {"uri": "hf://pagoda-bench/tiny", "servedName": "tiny"},
    "resources": {"gpu": {"count": 1}},
    "replicas": 1,
}
PLURALS = {kind: plural for _, kind, plural in CHILD_KINDS}
COUNTED_KINDS = ("Deployment", "Service", "PodDisruptionBudget")  # every service has one of each
Check = Callable[[dict[str, Any]], bool]
GPUS_PER_NODE = 8


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def ensure_nodes(kube: Kube, pods: int) -> int:
    """Enough fake GPU nodes (kwok) for `pods` one-GPU pods plus what the cluster already has."""
    nodes = kube.list("v1", "nodes", None)
    want = -(-pods // GPUS_PER_NODE) + len(nodes)
    for index in range(len(nodes), want):
        ip = f"10.253.{index // 250}.{index % 250 + 1}"
        _objects.create_fake_gpu_node(kube.api, f"bench-gpu-{index}", GPU_PRODUCT, ip=ip)
    deadline = time.monotonic() + 300
    while True:
        ready = [
            n
            for n in kube.list("v1", "nodes", None)
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n.get("status", {}).get("conditions", [])
            )
        ]
        if len(ready) >= want:
            return want
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(ready)}/{want} fake nodes became Ready")
        time.sleep(1.0)


def create_namespace(kube: Kube, name: str) -> None:
    try:
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}, "namespaces")
    except KubeError as exc:
        if exc.status != 409:
            raise
    deadline = time.monotonic() + 60
    while kube.get("v1", "serviceaccounts", name, "default") is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no default ServiceAccount in {name}")
        time.sleep(0.2)


class Watch(threading.Thread):
    """Streams one collection's watch events from the API server and notes, per object name, the first time
    `done(obj)` held. A watch costs the API server one encoding per change, where polling a list every half
    second would re-send every object each time (and load the API server the operator is measured on)."""

    def __init__(self, kube: Kube, api_version: str, plural: str, namespace: str, done: Check) -> None:
        super().__init__(daemon=True)
        self.kube, self.path, self.done = kube, resource_path(api_version, plural, namespace), done
        self.seen: dict[str, float] = {}
        self.changed = threading.Condition()
        self.failed: BaseException | None = None
        self.version = self.kube._call("GET", self.path, query=[("limit", "1")])["metadata"][
            "resourceVersion"
        ]
        self.start()

    def run(self) -> None:
        try:
            while True:  # the API server ends a watch after a while: resume from the last version seen
                self._stream()
        except BaseException as exc:  # noqa: BLE001 - reported by `wait`
            with self.changed:
                self.failed = exc
                self.changed.notify_all()

    def _stream(self) -> None:
        query = [("watch", "1"), ("resourceVersion", self.version), ("timeoutSeconds", "600")]
        request = self.kube.api.param_serialize(
            "GET",
            self.path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self.kube.api.call_api(*request, _request_timeout=(5.0, 660.0))
        if response.status != 200:
            raise RuntimeError(f"watch {self.path}: HTTP {response.status}")
        for line in response.response:
            event = json.loads(line)
            obj = event["object"]
            if event["type"] == "ERROR":
                raise RuntimeError(f"watch {self.path}: {obj.get('message')}")
            self.version = obj["metadata"]["resourceVersion"]
            name = obj["metadata"]["name"]
            if event["type"] != "DELETED" and name not in self.seen and self.done(obj):
                with self.changed:
                    self.seen[name] = time.monotonic()
                    self.changed.notify_all()

    def check(self) -> None:
        if self.failed is not None:
            raise RuntimeError(f"watch {self.path} failed") from self.failed

    def wait(self, count: int, timeout: float, what: str) -> dict[str, float]:
        """The first time each name was done, once `count` names are."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while len(self.seen) < count:
                self.check()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"timed out: {len(self.seen)}/{count} {what} after {timeout:.0f}s")
                self.changed.wait(min(left, 1.0))
            return dict(self.seen)


class LoadAverage(threading.Thread):
    """The machine's 1-minute load average, sampled every 2 s while a phase runs (mean and max), so that a
    run says how busy the shared machine was during each phase: a phase that ran during someone else's
    burst is not comparable with one that did not."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[float] = []
        self.stopped = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.stopped.wait(0.0 if not self.samples else 2.0):
            self.samples.append(float(Path("/proc/loadavg").read_text().split()[0]))

    def result(self) -> dict[str, float]:
        self.stopped.set()
        self.join()
        return {"mean": round(statistics.fmean(self.samples), 1), "max": round(max(self.samples), 1)}


def deployment_ready(obj: dict[str, Any]) -> bool:
    return int((obj.get("status") or {}).get("readyReplicas") or 0) >= 1


def service_ready(obj: dict[str, Any]) -> bool:
    conds = {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}
    return conds.get("Ready") == "True"


def children_count(kube: Kube, namespace: str) -> int:
    """How many Deployments, Services and PDBs the namespace holds, from one-item lists (the API server
    counts the rest: `remainingItemCount`), so that polling does not load the API server under test with
    three full lists every half second."""
    total = 0
    for api_version, kind, plural in CHILD_KINDS:
        if kind not in COUNTED_KINDS:
            continue
        page = kube._call("GET", resource_path(api_version, plural, namespace), query=[("limit", "1")])
        total += len(page.get("items") or []) + int(page["metadata"].get("remainingItemCount") or 0)
    return total


def run_floor(kube: Kube, count: int, workers: int, timeout: float) -> dict[str, Any]:
    namespace = "bench-floor"
    create_namespace(kube, namespace)
    spec = InferenceServiceSpec.model_validate(SPEC)
    ready_watch = Watch(kube, "apps/v1", "deployments", namespace, deployment_ready)
    started = time.monotonic()
    created_at: dict[str, float] = {}

    def one(i: int) -> None:
        name = f"svc-{i:04d}"
        created_at[name] = time.monotonic()
        for manifest in desired_children(name, namespace, spec):
            kube.create(manifest, PLURALS[manifest["kind"]])

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(count)))
    applied = time.monotonic() - started
    ready = ready_watch.wait(count, timeout, "Deployments ready")
    latencies = [ready[name] - created_at[name] for name in ready]
    return {
        "children_applied_s": round(applied, 2),
        "all_ready_s": round(max(ready.values()) - started, 2),
        "p50_s": round(statistics.median(latencies), 2),
        "p99_s": round(percentile(latencies, 0.99), 2),
        "writes_per_object_total": len(desired_children("x", namespace, spec)),
    }


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run_operator(
    cluster: Cluster, kube: Kube, count: int, idle: float, timeout: float, workers: int
) -> dict[str, Any]:
    namespace = "bench-operator"
    create_namespace(kube, namespace)
    workdir = Path(tempfile.mkdtemp(prefix="pagoda-bench-operator-"))
    operator = OperatorProcess(cluster.kubeconfig, workdir, resync_seconds=300, workers=workers)
    operator.start()
    assert operator.proc is not None
    pid = operator.proc.pid
    peak = rss_mib(pid)
    try:
        ready_watch = Watch(kube, "pagoda.dev/v1alpha1", "inferenceservices", namespace, service_ready)
        load = LoadAverage()
        started = time.monotonic()
        created_at: dict[str, float] = {}

        def one(i: int) -> None:
            name = f"svc-{i:04d}"
            created_at[name] = time.monotonic()
            body = {
                "apiVersion": "pagoda.dev/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": name, "namespace": namespace},
                "spec": SPEC,
            }
            kube.create(body, "inferenceservices")

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(one, range(count)))
        owners_created = time.monotonic() - started
        applied: float | None = None
        while applied is None or len(ready_watch.seen) < count:  # the RSS and the children count, polled
            peak = max(peak, rss_mib(pid))
            if applied is None and children_count(kube, namespace) >= 3 * count:
                applied = time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise RuntimeError(
                    f"timed out: children applied after {applied}, {len(ready_watch.seen)} Ready"
                )
            ready_watch.check()
            time.sleep(0.5)
        ready = ready_watch.wait(count, timeout, "InferenceServices Ready")
        load_average = load.result()
        latencies = [ready[name] - created_at[name] for name in ready]
        # Let the last status writes land, then measure an idle period.
        time.sleep(5)
        before = operator.writes()
        idle_started = time.monotonic()
        while time.monotonic() - idle_started < idle:
            peak = max(peak, rss_mib(pid))
            time.sleep(min(5.0, idle))
        idle_writes = operator.writes() - before
        metrics = operator.metrics()
        writes_by_kind = {
            raw: value for (name, raw), value in metrics.items() if name == "pagoda_operator_api_writes_total"
        }
        duration_sum = metrics.get(("pagoda_operator_reconcile_duration_seconds_sum", ""), 0.0)
        duration_count = metrics.get(("pagoda_operator_reconcile_duration_seconds_count", ""), 1.0)
        return {
            "owners_created_s": round(owners_created, 2),
            "children_applied_s": round(applied, 2),
            "all_ready_s": round(max(ready.values()) - started, 2),
            "p50_s": round(statistics.median(latencies), 2),
            "p99_s": round(percentile(latencies, 0.99), 2),
            "load_average": load_average,
            "rss_peak_mib": round(peak, 1),
            "rss_end_mib": round(rss_mib(pid), 1),
            "idle_seconds": idle,
            "idle_api_writes": idle_writes,
            "api_writes_total": operator.writes(),
            "reconcile_mean_s": round(duration_sum / max(duration_count, 1.0), 4),
            "writes_by_kind": writes_by_kind,
            "writes_per_object": {
                raw: round(value / count, 2) for raw, value in writes_by_kind.items() if value
            },
            "writes_per_object_total": round(sum(writes_by_kind.values()) / count, 2),
            "reconciles": {
                raw: value
                for (name, raw), value in metrics.items()
                if name == "pagoda_operator_reconciles_total"
            },
        }
    finally:
        operator.stop()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=500, help="InferenceServices (and floor objects)")
    parser.add_argument("--idle-seconds", type=float, default=300.0, help="idle period for the write count")
    parser.add_argument("--floor-workers", type=int, default=16, help="parallel creators for the floor")
    parser.add_argument("--workers", type=int, default=8, help="the operator's --workers")
    parser.add_argument("--timeout", type=float, default=1200.0, help="per-phase deadline in seconds")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args()
    if args.count < 1:
        parser.error("--count: must be at least 1")
    cluster = start_private()
    try:
        kube = Kube(cluster.api_client())
        cluster.kubectl(
            "apply", "--server-side", "-f", str(ROOT / "crds" / "pagoda.dev_inferenceservices.yaml")
        )
        wait_established(cluster, ["crd/inferenceservices.pagoda.dev"], timeout=60)
        nodes = ensure_nodes(kube, 2 * args.count)
        print(f"Prepared fake GPU nodes count={nodes}", flush=True)
        load = LoadAverage()
        floor = run_floor(kube, args.count, args.floor_workers, args.timeout)
        floor["load_average"] = load.result()
        print(f"Measured floor {json.dumps(floor)}", flush=True)
        operated = run_operator(cluster, kube, args.count, args.idle_seconds, args.timeout, args.workers)
        print(f"Measured operator {json.dumps(operated)}", flush=True)
    finally:
        cluster.stop()
    result = {
        "count": args.count,
        "floor": floor,
        "operator": operated,
        "ratio_children_applied": round(operated["children_applied_s"] / floor["children_applied_s"], 2),
        "ratio_all_ready": round(operated["all_ready_s"] / floor["all_ready_s"], 2),
        "ratio_p50": round(operated["p50_s"] / floor["p50_s"], 2),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
