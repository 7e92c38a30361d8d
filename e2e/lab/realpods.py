"""Helpers for e2e tests whose InferenceService pods really run (on the real node, e2e/lab/realnode.py):
reading an InferenceService's conditions and pods, and spreading requests over the Ready endpoints of its
Service's EndpointSlices, as a Service (kube-proxy) would."""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpx
import yaml

from e2e.lab import _objects
from e2e.lab.cluster import Cluster
from e2e.lab.podnet import REAL_SUBNETS
from e2e.lab.processes import free_ports, http_ok, wait_until
from pagoda.contract import HTTP_PORT
from pagoda.operator.resources.meta import OWNER_LABEL


def get_json(cluster: Cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    found = [c for c in obj.get("status", {}).get("conditions") or [] if c.get("type") == kind]
    return found[0] if found else {}


def isvc(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = get_json(cluster, "-n", namespace, "inferenceservice", name)
    return result


def patch_spec(cluster: Cluster, namespace: str, name: str, spec: dict[str, Any]) -> None:
    """Merge `spec` into the InferenceService's spec (kubectl patch --type=merge; None removes a field)."""
    patch = json.dumps({"spec": spec})
    cluster.kubectl("patch", "inferenceservice", name, "-n", namespace, "--type=merge", "-p", patch)


def wait_condition(
    cluster: Cluster, namespace: str, name: str, kind: str, status: str = "True", timeout: float = 420
) -> dict[str, Any]:
    """Waits until the InferenceService's condition `kind` has `status`; returns the condition."""

    def probe() -> dict[str, Any] | None:
        found = condition(isvc(cluster, namespace, name), kind)
        return found if found.get("status") == status else None

    return wait_until(probe, f"{namespace}/{name} {kind}={status}", timeout=timeout, interval=1.0)


def all_pods(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """The service's pods, terminating ones too."""
    items: list[dict[str, Any]] = get_json(cluster, "-n", namespace, "pods", "-l", f"{OWNER_LABEL}={name}")[
        "items"
    ]
    return items


def pods_matching(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    """The pods of label `selector` that are not terminating."""
    found = get_json(cluster, "-n", namespace, "pods", "-l", selector)["items"]
    return [p for p in found if not p["metadata"].get("deletionTimestamp")]


def is_ready(pod: dict[str, Any]) -> bool:
    return condition(pod, "Ready").get("status") == "True"


def pods(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """The service's pods that are not terminating."""
    return pods_matching(cluster, namespace, f"{OWNER_LABEL}={name}")


def ready_pods(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return [p for p in pods(cluster, namespace, name) if is_ready(p)]


def is_real_pod_ip(address: str) -> bool:
    import ipaddress

    return ipaddress.ip_address(address) in REAL_SUBNETS


FINISHED = "vllm:request_success_total"  # vLLM's own count of finished requests, per pod


def samples(url: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample at the Prometheus endpoint `url`: (name, labels, value)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url, timeout=10).text
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def finished(ip: str) -> float:
    """The pod's count of finished requests, as vLLM counts them."""
    return sum(v for n, _, v in samples(f"http://{ip}:{HTTP_PORT}/metrics") if n == FINISHED)


def service_url(cluster: Cluster, namespace: str, name: str, timeout: float = 60) -> str:
    """http://CLUSTER-IP:PORT of the service's Service, once kube-proxy leads its ClusterIP to a Ready pod
    (the runtime's /readyz answers 200 through it)."""
    service = get_json(cluster, "-n", namespace, "service", name)
    url = f"http://{service['spec']['clusterIP']}:{HTTP_PORT}"

    wait_until(
        lambda: http_ok(f"{url}/readyz"), f"{url}/readyz through the Service", timeout=timeout, interval=0.5
    )
    return url


@contextlib.contextmanager
def port_forward(cluster: Cluster, namespace: str, target: str, port: int) -> Iterator[str]:
    """`kubectl port-forward` to `target` (e.g. service/tiny) on a free local port; yields its http:// URL
    once the runtime's /readyz answers through it."""
    (local,) = free_ports(1)
    argv = [str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", "-n", namespace]
    argv += ["port-forward", "--address=127.0.0.1", target, f"{local}:{port}"]
    # Its output (a line per connection) is not read: DEVNULL, so that it can never fill a pipe and block.
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{local}"
        wait_until(
            lambda: proc.poll() is None and http_ok(f"{url}/readyz") or None, "port-forward", timeout=30
        )
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


class Terminations:
    """How the containers of a service's pods ended, as the kubelet reported it before each pod was removed:
    pod uid -> [(exit code, reason)], from a watch on the pods (a thread) for as long as it runs."""

    def __init__(self, cluster: Cluster, namespace: str, name: str) -> None:
        self.cluster, self.namespace, self.selector = cluster, namespace, f"{OWNER_LABEL}={name}"
        self.ended: dict[str, list[tuple[int, str]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        from kubernetes import client, watch

        api = self.cluster.api_client()
        core = client.CoreV1Api(api)
        try:
            while not self._stop.is_set():
                stream = watch.Watch().stream(
                    core.list_namespaced_pod, self.namespace, label_selector=self.selector, timeout_seconds=5
                )
                for event in stream:
                    pod = event["object"]
                    ended = [
                        (c.state.terminated.exit_code, c.state.terminated.reason or "")
                        for c in pod.status.container_statuses or []
                        if c.state and c.state.terminated
                    ]
                    if ended:
                        self.ended[pod.metadata.uid] = ended
                    if self._stop.is_set():
                        break
        finally:
            api.close()

    def of(self, uid: str, timeout: float = 120) -> list[tuple[int, str]]:
        """How pod `uid`'s containers ended; waits until the kubelet has reported it."""
        return wait_until(lambda: self.ended.get(uid), f"the end of pod {uid}'s containers", timeout=timeout)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


class Holding(threading.Thread):
    """Every second: each of `services`' pods that hold a GPU (not Succeeded or Failed: Pending and
    terminating ones count) and its ScaledObject's maxReplicaCount (None without one), from the API server;
    `times[i]` is when `samples[i]` was taken (monotonic). e2e/test_budget.py, benchmarks/bench_budget.py."""

    def __init__(self, cluster: Cluster, namespace: str, services: Iterable[str]) -> None:
        super().__init__(daemon=True)
        self.api = cluster.api_client()
        self.namespace, self.services = namespace, tuple(services)
        self.samples: list[dict[str, tuple[int, int | None]]] = []
        self.times: list[float] = []
        # Beside each sample: each service's status.budget (demand, allocated), as its last pass wrote it.
        self.shares: list[dict[str, tuple[int | None, int | None]]] = []
        self.stopping = threading.Event()

    def sample(self) -> dict[str, tuple[int, int | None]]:
        out = {}
        for name in self.services:
            path = f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={OWNER_LABEL}%3D{name}"
            _, found = _objects.request(self.api, "GET", path)
            holding = [p for p in found["items"] if p["status"].get("phase") not in ("Succeeded", "Failed")]
            scaled_path = f"/apis/keda.sh/v1alpha1/namespaces/{self.namespace}/scaledobjects/{name}"
            status, scaled = _objects.request(self.api, "GET", scaled_path)
            limit = int(scaled["spec"]["maxReplicaCount"]) if status == 200 else None
            out[name] = (len(holding), limit)
        return out

    def share(self) -> dict[str, tuple[int | None, int | None]]:
        out = {}
        for name in self.services:
            path = f"/apis/pagoda.dev/v1alpha1/namespaces/{self.namespace}/inferenceservices/{name}"
            status, found = _objects.request(self.api, "GET", path)
            budget = ((found.get("status") or {}).get("budget") or {}) if status == 200 else {}
            out[name] = (budget.get("demand"), budget.get("allocated"))
        return out

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            try:
                sample, shares = self.sample(), self.share()
                self.samples.append(sample)
                self.times.append(time.monotonic())
                self.shares.append(shares)
            except Exception as exc:  # noqa: BLE001 - one lost sample is not a failed run
                print(f"sample failed: {exc!r}", flush=True)

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)
        self.api.close()

    def last(self, name: str) -> tuple[int, int | None]:
        return self.samples[-1][name] if self.samples else (0, None)

    def gpu_seconds(self, start: float, end: float, service: str | None = None) -> int:
        """Pods holding a GPU (of `service`, or of all), summed over the samples between `start` and `end`
        (one a second)."""
        return sum(
            count
            for at, sample in zip(self.times, self.samples, strict=True)
            if start <= at <= end
            for name, (count, _) in sample.items()
            if service in (None, name)
        )


class ServiceEndpoints:
    """The Ready endpoints of a Service, from its EndpointSlices (refreshed every `interval` seconds by a
    thread), handed out round-robin: `pick()` returns a base URL such as http://10.244.128.2:8000."""

    def __init__(self, cluster: Cluster, namespace: str, service: str, interval: float = 0.5) -> None:
        self.cluster, self.namespace, self.service, self.interval = cluster, namespace, service, interval
        self.addresses: list[str] = []
        self._cycle: Any = iter(())
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.refresh()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def refresh(self) -> None:
        slices = get_json(
            self.cluster,
            "-n",
            self.namespace,
            "endpointslices",
            "-l",
            f"kubernetes.io/service-name={self.service}",
        )["items"]
        ready = sorted(
            address
            for endpoint_slice in slices
            for endpoint in endpoint_slice.get("endpoints") or []
            if endpoint.get("conditions", {}).get("ready")
            for address in endpoint["addresses"]
        )
        with self._lock:
            if ready != self.addresses:
                self.addresses = ready
                self._cycle = itertools.cycle(ready)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - a transient API error: keep the last view
                continue

    def pick(self) -> str:
        def next_address() -> str | None:
            with self._lock:
                return next(self._cycle, None)

        address = wait_until(
            next_address, f"a Ready endpoint of Service {self.service}", timeout=120, interval=0.2
        )
        return f"http://{address}:{HTTP_PORT}"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def apply(cluster: Cluster, obj: dict[str, Any]) -> None:
    """`kubectl apply` of one object."""
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))


def wait_ready_replicas(
    cluster: Cluster, namespace: str, name: str, count: int, timeout: float = 480
) -> None:
    """Waits until the Deployment `name` has `count` replicas, all updated and Ready."""

    def settled() -> bool:
        deployment = get_json(cluster, "-n", namespace, "deployment", name)
        status = deployment.get("status", {})
        return (
            status.get("observedGeneration") == deployment["metadata"]["generation"]
            and status.get("updatedReplicas") == count
            and status.get("readyReplicas") == count
            and status.get("replicas") == count
        )

    wait_until(settled, f"{count} updated Ready replicas of {namespace}/{name}", timeout=timeout, interval=1)


def hpa_target(cluster: Cluster, namespace: str, name: str) -> str | None:
    """The in-flight target per replica of the HPA KEDA made for the service's ScaledObject (None until KEDA
    has made it)."""
    found = cluster.kubectl("get", "hpa", f"keda-hpa-{name}", "-n", namespace, "-o", "json", check=False)
    if found.returncode != 0:
        return None
    metrics = (json.loads(found.stdout).get("spec") or {}).get("metrics") or []
    return str(metrics[0]["external"]["target"]["averageValue"]) if metrics else None


def finished_profile(cluster: Cluster, namespace: str, name: str, timeout: float) -> dict[str, Any]:
    """status.profile once its Job has ended (Succeeded or Failed)."""

    def ended() -> dict[str, Any] | None:
        profile: dict[str, Any] = isvc(cluster, namespace, name).get("status", {}).get("profile", {})
        return profile if profile.get("state") in ("Succeeded", "Failed") else None

    done: dict[str, Any] = wait_until(ended, "the profile Job to end", timeout=timeout, interval=2)
    return done
