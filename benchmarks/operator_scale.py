"""Operator benchmark: N InferenceServices at once against the local control plane, beside a floor.

Floor: what the operator's first pass of each service must write at the least, written by a bare client
with no operator: the same children from the same builders under the operator's settings (NetworkPolicy,
the management key's ConfigMap, Deployment, Service, PDB), server-side applied in the same order, with as
many threads as the operator has workers. Then: the operator running, N InferenceServices created at once;
time until every child is applied and every InferenceService reports Ready (watched); per-object latency
p50/p99; the operator's RSS; its API writes per object by kind, and during an idle period (target 0); the
ratios of the two phases and the machine's load average during each (the machine is shared: compare phases
that ran at similar load). The operator's extra writes (an Event and the status per service) and its
reads of the watch streams are what the ratio charges it for.

    make bench-operator   # = PAGODA_BIN=.pagoda-dev/bin .venv/bin/python benchmarks/operator_scale.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
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
from pagoda.contract.management import Signer, new_private_key  # noqa: E402
from pagoda.operator.api import InferenceServiceSpec  # noqa: E402
from pagoda.operator.kube.client import Kube, KubeError, resource_path  # noqa: E402
from pagoda.operator.resources import (  # noqa: E402
    CHILD_KINDS,
    ChildInputs,
    OperatorSettings,
    desired_children,
)

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


class CpuMeter:
    """CPU seconds (user + system) each process used since the meter started: the control plane's
    components and the operator, so that a phase says what it cost the API server and etcd, not only how
    long it took (two phases can take the same time on a machine with a free core and not on a busy one)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)
        self.start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def used(self) -> dict[str, float]:
        return {name: round(cpu_seconds(pid) - self.start[name], 1) for name, pid in self.pids.items()}


def pin(pid: int, cpu: int) -> None:
    """Every thread of `pid` on `cpu` alone (threads it starts later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), {cpu})
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (and of its threads), from /proc; 0 once it has exited."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def floor_settings() -> OperatorSettings:
    """The settings the operator builds every first pass's children with: a management key (the operator
    always has one), so the floor writes the same ConfigMap."""
    return OperatorSettings(management_key=Signer(new_private_key()).public_pem)


def run_floor(kube: Kube, count: int, workers: int, timeout: float, pids: dict[str, int]) -> dict[str, Any]:
    namespace = "bench-floor"
    create_namespace(kube, namespace)
    spec = InferenceServiceSpec.model_validate(SPEC)
    inputs = ChildInputs(settings=floor_settings())
    ready_watch = Watch(kube, "apps/v1", "deployments", namespace, deployment_ready)
    cpu = CpuMeter(pids)
    started = time.monotonic()
    created_at: dict[str, float] = {}

    def one(i: int) -> None:
        name = f"svc-{i:04d}"
        created_at[name] = time.monotonic()
        for manifest in desired_children(name, namespace, spec, inputs):
            kube.apply(manifest, PLURALS[manifest["kind"]])

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(count)))
    applied = time.monotonic() - started
    cpu_applied = cpu.used()
    ready = ready_watch.wait(count, timeout, "Deployments ready")
    latencies = [ready[name] - created_at[name] for name in ready]
    return {
        "workers": workers,
        "children_applied_s": round(applied, 2),
        "all_ready_s": round(max(ready.values()) - started, 2),
        "p50_s": round(statistics.median(latencies), 2),
        "p99_s": round(percentile(latencies, 0.99), 2),
        "writes_per_object_total": len(desired_children("x", namespace, spec, inputs)),
        "cpu_s_until_applied": cpu_applied,
    }


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def start_profile(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling the operator until it is stopped, only the thread that holds the GIL at each sample
    (`--gil`): where the operator's own CPU goes, and which thread keeps the others waiting for the GIL
    (threads waiting on the API server's answers drop out). `--nonblocking`: the operator is not paused to
    be sampled, so the run's times stay comparable. py-spy is not a dependency of the project:
    `.venv/bin/uv pip install py-spy`."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("--profile: py-spy is not installed (.venv/bin/uv pip install py-spy)")
    return subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--gil", "--nonblocking", "--rate", "100"]
        + ["--format", "speedscope", "--output", str(out)],
        stdout=subprocess.DEVNULL,
    )


def stop_profile(spy: subprocess.Popen[bytes] | None) -> None:
    if spy is not None:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        spy.wait(timeout=60)


def run_operator(
    cluster: Cluster,
    kube: Kube,
    count: int,
    idle: float,
    timeout: float,
    workers: int,
    profile: Path | None = None,
    pinned: int | None = None,
) -> dict[str, Any]:
    """`pinned`: the CPU the operator runs on (None: any)."""
    namespace = "bench-operator"
    create_namespace(kube, namespace)
    workdir = Path(tempfile.mkdtemp(prefix="pagoda-bench-operator-"))
    operator = OperatorProcess(cluster.kubeconfig, workdir, resync_seconds=300, workers=workers)
    operator.start()
    assert operator.proc is not None
    pid = operator.proc.pid
    if pinned is not None:
        pin(pid, pinned)
    peak = rss_mib(pid)
    spy = start_profile(pid, profile) if profile is not None else None
    try:
        ready_watch = Watch(kube, "pagoda.dev/v1alpha1", "inferenceservices", namespace, service_ready)
        load = LoadAverage()
        cpu = CpuMeter({**cluster.pids, "operator": pid})
        cpu_applied: dict[str, float] = {}
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
                cpu_applied = cpu.used()
            if time.monotonic() - started > timeout:
                raise RuntimeError(
                    f"timed out: children applied after {applied}, {len(ready_watch.seen)} Ready"
                )
            ready_watch.check()
            time.sleep(0.5)
        ready = ready_watch.wait(count, timeout, "InferenceServices Ready")
        load_average = load.result()
        stop_profile(spy)
        spy = None
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
            "cpu_s_until_applied": cpu_applied,
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
        stop_profile(spy)
        operator.stop()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=500, help="InferenceServices (and floor objects)")
    parser.add_argument("--idle-seconds", type=float, default=300.0, help="idle period for the write count")
    parser.add_argument(
        "--workers", type=int, default=8, help="the operator's --workers; the floor's threads"
    )
    parser.add_argument("--timeout", type=float, default=1200.0, help="per-phase deadline in seconds")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="leave every process free to run on any CPU (default: the control plane on one CPU, the API "
        "server's client of each phase, this script's floor or the operator, on another: as on a cluster, "
        "where the operator does not share the API server's machine)",
    )
    parser.add_argument(
        "--profile", type=Path, help="py-spy the operator until all are Ready; a speedscope JSON file here"
    )
    args = parser.parse_args()
    if args.count < 1:
        parser.error("--count: must be at least 1")
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin and len(cpus) < 2:
        parser.error(f"pinning needs two CPUs, this process may use {cpus} (use --no-pin)")
    control_plane_cpu, client_cpu = (cpus[0], cpus[1]) if args.pin else (None, None)
    if client_cpu is not None:  # this process (the floor's client, the watches) and every thread it starts
        pin(os.getpid(), client_cpu)
    cluster = start_private()
    try:
        if control_plane_cpu is not None:
            for component in cluster.pids.values():
                pin(component, control_plane_cpu)
        kube = Kube(cluster.api_client())
        cluster.kubectl(
            "apply", "--server-side", "-f", str(ROOT / "crds" / "pagoda.dev_inferenceservices.yaml")
        )
        wait_established(cluster, ["crd/inferenceservices.pagoda.dev"], timeout=60)
        nodes = ensure_nodes(kube, 2 * args.count)
        print(f"Prepared fake GPU nodes count={nodes}", flush=True)
        load = LoadAverage()
        floor = run_floor(kube, args.count, args.workers, args.timeout, cluster.pids)
        floor["load_average"] = load.result()
        print(f"Measured floor {json.dumps(floor)}", flush=True)
        operated = run_operator(
            cluster, kube, args.count, args.idle_seconds, args.timeout, args.workers, args.profile, client_cpu
        )
        print(f"Measured operator {json.dumps(operated)}", flush=True)
    finally:
        cluster.stop()
    result = {
        "count": args.count,
        "pinned": args.pin,
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
