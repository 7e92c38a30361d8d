"""The autoscaling scenario on the real stack, shared by the e2e test and `make autoscaling-timeline`:
a tiny-model InferenceService (min 1, max 3) whose pods run on the real node, a bounded load through its
Service's ClusterIP (kube-proxy) from clients that keep their connections alive and never retry (the runtime
closes a connection after --max-connection-age, so clients reach new replicas), and a timeline sampled every
second from the real components:

- signal: the ScaledObject trigger's own PromQL, evaluated by Prometheus (the runtime pods' series, found
  through the operator's ServiceMonitor);
- external: the same metric as KEDA's adapter serves it through the API server (external.metrics.k8s.io);
- desired / current: the HPA that KEDA manages; ready: the Deployment's ready replicas;
- in_flight: requests the load has open; and per request its time to first token (TTFT).

    python -m e2e.lab.autoscaling [--out docs/autoscaling]   # a whole run on a private cluster: JSON + PNG
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psutil
import yaml
from kubernetes.utils.quantity import parse_quantity

from e2e.lab import _objects
from e2e.lab.cluster import Cluster
from e2e.lab.observability import Load, PrometheusAt
from e2e.lab.processes import wait_until
from e2e.lab.realpods import condition, finished, get_json, ready_pods, service_url, wait_condition
from e2e.lab.samples import tiny_sample
from pagoda.operator.resources.scaledobject import queue_depth_query

NAME = "tiny"
MIN_REPLICAS, MAX_REPLICAS = 1, 3
TARGET_IN_FLIGHT = 4  # per replica; the load's 12 clients ask for 3 replicas
CLIENTS = 12
TAIL_CLIENTS = 2  # the light load during the scale-in
POLLING_SECONDS, COOLDOWN_SECONDS = 5, 30
EXTERNAL_METRICS = "/apis/external.metrics.k8s.io/v1beta1"


def autoscaled_sample(namespace: str) -> dict[str, Any]:
    """KEDA finds Prometheus at the default `prometheusAddress`, a Service name, as in a user's cluster."""
    sample = tiny_sample(namespace, NAME, real_pods=True)
    sample["spec"].pop("replicas")
    # New replicas start their engines beside a busy one on two shared cores: minutes, not seconds.
    sample["spec"]["runtime"]["startupTimeoutSeconds"] = 900
    sample["spec"]["monitoring"] = {"serviceMonitor": {"enabled": True, "interval": "2s"}}
    sample["spec"]["autoscaling"] = {
        "minReplicas": MIN_REPLICAS,
        "maxReplicas": MAX_REPLICAS,
        "metric": "InFlight",
        "targetInFlight": TARGET_IN_FLIGHT,
        "pollingInterval": POLLING_SECONDS,
        "cooldownPeriod": COOLDOWN_SECONDS,
    }
    return sample


@dataclass
class Sample:
    t: float
    signal: float | None  # the trigger's query: in-flight requests (running + waiting) over all pods
    waiting: float | None  # waiting requests only, what metric QueueDepth would scale on
    external: float | None
    desired: int | None
    current: int | None
    ready: int
    in_flight: int


@dataclass
class Timeline:
    samples: list[Sample] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)  # t, ttft, duration, endpoint, failure
    marks: dict[str, float] = field(default_factory=dict)  # load_start, second_ready, load_end, back_to_min

    def reaction_times(self) -> dict[str, float]:
        m = self.marks
        asked = [s.t for s in self.samples if s.t >= m["load_start"] and (s.desired or 0) > MIN_REPLICAS]
        decided = asked[0]
        return {
            "load start -> HPA asks for more replicas (s)": round(decided - m["load_start"], 1),
            "load start -> second replica Ready (s)": round(m["second_ready"] - m["load_start"], 1),
            "load start -> max replicas Ready (s)": round(m["max_ready"] - m["load_start"], 1),
            "load end -> back to min replicas (s)": round(m["back_to_min"] - m["load_end"], 1),
        }

    def phases(self) -> dict[str, dict[str, float | int | None]]:
        """Per phase of the run: requests, TTFT p50/p95 (s), and the peak in-flight and waiting signals."""
        m = self.marks
        bounds = {
            "one replica under load": (m["load_start"], m["second_ready"]),
            "all replicas under load": (m["max_ready"], m["load_end"]),
            "scale-in under light load": (m["load_end"], m["back_to_min"]),
        }
        out: dict[str, dict[str, float | int | None]] = {}
        for phase, (start, end) in bounds.items():
            ttfts = sorted(
                r["ttft"] for r in self.requests if start <= r["t"] < end and r["ttft"] is not None
            )
            samples = [s for s in self.samples if start <= s.t < end]
            out[phase] = {
                "requests": len(ttfts),
                "ttft_p50_s": _percentile(ttfts, 0.5),
                "ttft_p95_s": _percentile(ttfts, 0.95),
                "peak_in_flight": max((s.signal or 0 for s in samples), default=None),
                "peak_waiting": max((s.waiting or 0 for s in samples), default=None),
            }
        return out

    def to_json(self) -> str:
        return json.dumps(
            {
                "marks": self.marks,
                "reaction_times": self.reaction_times(),
                "phases": self.phases(),
                "samples": [asdict(s) for s in self.samples],
                "requests": self.requests,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> Timeline:
        data = json.loads(text)
        return cls([Sample(**s) for s in data["samples"]], data["requests"], data["marks"])


class Sampler(threading.Thread):
    """Samples the timeline every second from Prometheus, the API server (KEDA's metric, the HPA, the
    Deployment) and the load."""

    def __init__(
        self, cluster: Cluster, namespace: str, prometheus_url: str, load: Load | None, t0: float
    ) -> None:
        super().__init__(daemon=True)
        self.cluster, self.namespace, self.prometheus_url, self.load, self.t0 = (
            cluster,
            namespace,
            prometheus_url,
            load,
            t0,
        )
        self.api = cluster.api_client()
        self.samples: list[Sample] = []
        self.stopping = threading.Event()

    def get(self, path: str) -> Any:
        status, body = _objects.request(self.api, "GET", path)
        return body if status == 200 else None

    def trigger_query(self) -> str:
        obj = self.get(f"/apis/keda.sh/v1alpha1/namespaces/{self.namespace}/scaledobjects/{NAME}")
        return str(obj["spec"]["triggers"][0]["metadata"]["query"])

    def prometheus(self, query: str) -> float | None:
        result = PrometheusAt(self.prometheus_url).query(query)
        return float(result[0]["value"][1]) if result else None

    def external(self, hpa: Any) -> float | None:
        if not hpa:
            return None
        metric = hpa["spec"]["metrics"][0]["external"]["metric"]["name"]
        selector = quote(f"scaledobject.keda.sh/name={NAME}")
        body = self.get(f"{EXTERNAL_METRICS}/namespaces/{self.namespace}/{metric}?labelSelector={selector}")
        items = (body or {}).get("items") or []
        return _quantity(items[0]["value"]) if items else None

    def sample(self, query: str) -> Sample:
        hpa = self.get(
            f"/apis/autoscaling/v2/namespaces/{self.namespace}/horizontalpodautoscalers/keda-hpa-{NAME}"
        )
        deployment = self.get(f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{NAME}") or {}
        in_flight = self.load.in_flight if self.load else 0
        return Sample(
            t=round(time.monotonic() - self.t0, 2),
            signal=self.prometheus(query),
            waiting=self.prometheus(queue_depth_query(NAME, self.namespace)),
            external=self.external(hpa),
            desired=(hpa or {}).get("status", {}).get("desiredReplicas"),
            current=(hpa or {}).get("status", {}).get("currentReplicas"),
            ready=int(deployment.get("status", {}).get("readyReplicas") or 0),
            in_flight=in_flight,
        )

    def run(self) -> None:
        query = self.trigger_query()
        while not self.stopping.wait(1.0):
            try:
                self.samples.append(self.sample(query))
            except Exception as exc:  # noqa: BLE001 - one lost sample is not a failed run
                print(f"sample failed: {exc!r}", flush=True)

    def stop(self) -> list[Sample]:
        self.stopping.set()
        self.join(timeout=30)
        self.api.close()
        return self.samples


def _percentile(values: list[float], q: float) -> float | None:
    return round(values[min(len(values) - 1, int(q * len(values)))], 3) if values else None


def _quantity(value: str) -> float:
    """A Kubernetes quantity as KEDA's adapter writes metric values (`12`, `3500m`)."""
    return float(parse_quantity(value))  # type: ignore[no-untyped-call]


def run_scenario(
    cluster: Cluster,
    namespace: str,
    prometheus_url: str,
    *,
    load_seconds_after_max: float = 20,
    at_peak: Callable[[Sampler], None] | None = None,
) -> tuple[Timeline, Load]:
    """Applies the autoscaled service, loads it until all replicas are Ready (plus a while), stops the
    load and waits until it is back to its minimum. Returns the timeline and the load (its records).
    `at_peak`: called under the peak load once every replica serves, instead of waiting
    `load_seconds_after_max` (a fault to inject then); the peak ends when it returns."""
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(autoscaled_sample(namespace)))
    wait_condition(cluster, namespace, NAME, "Ready")
    url = service_url(cluster, namespace, NAME)
    load = Load(url, NAME, clients=CLIENTS, max_tokens=32, max_seconds=900)
    tail = Load(url, NAME, clients=TAIL_CLIENTS, max_tokens=32, max_seconds=900)
    t0 = time.monotonic()
    sampler = Sampler(cluster, namespace, prometheus_url, load, t0)
    timeline = Timeline()
    try:
        wait_until(lambda: sampler_ready(sampler), "the ScaledObject", timeout=60)
        sampler.start()
        time.sleep(5)  # a few quiet samples before the load
        timeline.marks["load_start"] = time.monotonic() - t0
        load.start()

        def ready_at_least(count: int) -> bool:
            return bool(sampler.samples) and sampler.samples[-1].ready >= count

        wait_until(lambda: ready_at_least(2), "a second Ready replica", timeout=600, interval=0.5)
        timeline.marks["second_ready"] = time.monotonic() - t0
        wait_until(lambda: ready_at_least(MAX_REPLICAS), "all replicas Ready", timeout=600, interval=0.5)
        timeline.marks["max_ready"] = time.monotonic() - t0
        # Clients move to the new replicas as their connections age out (kube-proxy picks an endpoint per
        # connection): wait until each Ready replica has finished requests of the load.
        wait_until(
            lambda: all(finished(p["status"]["podIP"]) > 0 for p in ready_pods(cluster, namespace, NAME)),
            "the load to reach every Ready replica",
            timeout=180,
            interval=1,
        )
        timeline.marks["spread"] = time.monotonic() - t0
        if at_peak is not None:
            at_peak(sampler)
            timeline.marks["at_peak_done"] = time.monotonic() - t0
        else:
            time.sleep(load_seconds_after_max)
        # The peak ends; a light load (below one replica's target) goes on while replicas are removed,
        # so that the scale-in itself is shown to lose nothing.
        tail.start()
        load.stop()
        sampler.load = tail
        timeline.marks["load_end"] = time.monotonic() - t0

        def back_to_min() -> bool:
            last = sampler.samples[-1]
            return (
                last.desired == MIN_REPLICAS and last.current == MIN_REPLICAS and last.ready == MIN_REPLICAS
            )

        wait_until(back_to_min, "replicas back to the minimum", timeout=COOLDOWN_SECONDS + 300, interval=0.5)
        timeline.marks["back_to_min"] = time.monotonic() - t0
        time.sleep(5)
    finally:
        load.stop()
        tail.stop()
        sampler.stop()
    load.records += tail.records
    timeline.samples = sampler.samples
    timeline.requests = [
        {
            "t": round(r.started - t0, 3),
            "ttft": None if r.first_token is None else round(r.first_token - r.started, 3),
            "duration": round(r.ended - r.started, 3),
            "endpoint": r.endpoint,
            "failure": r.failure,
        }
        for r in load.records
    ]
    return timeline, load


@contextmanager
def frozen(pid: int) -> Iterator[None]:
    """The process `pid` and its children stopped (SIGSTOP) for the block, then resumed: alive to every
    process check and holding its connections, answering nothing, as a hung or partitioned server."""
    parent = psutil.Process(pid)
    processes = [parent, *parent.children(recursive=True)]
    for process in processes:
        process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for process in processes:
            process.send_signal(signal.SIGCONT)


def scaled_object_condition(sampler: Sampler, kind: str) -> str | None:
    """The status ("True", "False") of the ScaledObject's condition `kind` (Ready, Active, Fallback)."""
    obj = sampler.get(f"/apis/keda.sh/v1alpha1/namespaces/{sampler.namespace}/scaledobjects/{NAME}") or {}
    status = condition(obj, kind).get("status")
    return None if status is None else str(status)


def sampler_ready(sampler: Sampler) -> bool:
    return (
        sampler.get(f"/apis/keda.sh/v1alpha1/namespaces/{sampler.namespace}/scaledobjects/{NAME}") is not None
    )


def plot(timeline: Timeline, path: Path) -> None:
    """A PNG: the signal and replica counts over time above, each request's TTFT below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    t = [s.t for s in timeline.samples]
    top.plot(t, [s.signal for s in timeline.samples], label="in-flight requests (Prometheus, all pods)")
    top.plot(t, [s.waiting for s in timeline.samples], label="waiting requests (Prometheus, all pods)")
    top.plot(t, [s.in_flight for s in timeline.samples], ":", label="in-flight requests (client side)")
    top.set_ylabel("requests")
    replicas = top.twinx()
    replicas.step(t, [s.desired for s in timeline.samples], where="post", color="C3", label="desired (HPA)")
    replicas.step(t, [s.ready for s in timeline.samples], where="post", color="C2", label="ready")
    replicas.set_ylabel("replicas")
    replicas.set_ylim(0, MAX_REPLICAS + 0.5)
    lines = top.get_legend_handles_labels()[0] + replicas.get_legend_handles_labels()[0]
    top.legend(lines, [ln.get_label() for ln in lines], loc="center left", fontsize=7)
    done = [r for r in timeline.requests if r["ttft"] is not None]
    bottom.scatter([r["t"] for r in done], [r["ttft"] for r in done], s=4)
    bottom.set_ylabel("TTFT (s)")
    bottom.set_xlabel("seconds")
    for ax in (top, bottom):
        for name, at in timeline.marks.items():
            ax.axvline(at, color="grey", linewidth=0.6)
            if ax is top:
                ax.text(at, ax.get_ylim()[1], name, fontsize=7, rotation=90, va="top")
    top.set_title("KEDA scaling a tiny-model InferenceService on in-flight requests (real pods)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.lab.autoscaling", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="docs/autoscaling", help="writes OUT.json and OUT.png")
    parser.add_argument("--replot", action="store_true", help="only redraw OUT.png from OUT.json")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.replot:
        timeline = Timeline.from_json(out.with_suffix(".json").read_text())
        plot(timeline, out.with_suffix(".png"))
        print(
            json.dumps({"reaction_times": timeline.reaction_times(), "phases": timeline.phases()}, indent=1)
        )
        return 0
    from e2e.lab.stack import private_stack, run_operator

    with private_stack() as stack, run_operator(stack.cluster, stack.cluster.workdir / "operator.log"):
        namespace = "autoscaling"
        stack.cluster.kubectl("create", "namespace", namespace)
        timeline, load = run_scenario(stack.cluster, namespace, stack.prometheus_url)
    out.with_suffix(".json").write_text(timeline.to_json() + "\n")
    plot(timeline, out.with_suffix(".png"))
    print(json.dumps({"reaction_times": timeline.reaction_times(), "phases": timeline.phases()}, indent=1))
    print(f"{load.completed} requests completed, {len(load.failures)} failed; wrote {out}.json and {out}.png")
    return 0 if not load.failures else 1


if __name__ == "__main__":
    raise SystemExit(main())


@dataclass
class Prewarm:
    """What the pre-warm window did (UTC wall-clock times)."""

    opens: float  # the window's start
    closes: float  # its end
    warm_up: float  # seconds early the cron trigger asks for the replicas
    triggers: list[dict[str, Any]] = field(default_factory=list)  # the ScaledObject's, as applied
    created: float | None = None  # the warm replica's pod
    ready: float | None = None  # ... Ready
    ready_in_window: int = 0  # Ready replicas a little after the window opened
    served: int | None = None  # the HTTP status of a chat request through the Service then
    released: float | None = None  # back to MIN_REPLICAS Ready and desired


# The warm-up: the service's typical cold start as status.startup measured it in the scenario (a replica was
# Ready 22 s after its pod was created here; a slower machine takes longer, and a fixed minute would not do),
# plus the time from the trigger opening to the pod's creation (KEDA's poll, 5 s here, and the HPA's sync,
# 5 s: 10-20 s seen), in whole minutes (cron's resolution).
PREWARM_TRIGGER_LAG_SECONDS = 20


def prewarm_warm_up(cluster: Cluster, namespace: str) -> int:
    """Seconds of warm-up that let a replica be Ready by the window's start on this machine."""
    startup = get_json(cluster, "-n", namespace, "inferenceservice", NAME)["status"].get("startup") or {}
    typical = (startup.get("typical") or {}).get("seconds")
    assert typical is not None, f"no status.startup.typical after the scenario's replicas: {startup}"
    return 60 * math.ceil((float(typical) + PREWARM_TRIGGER_LAG_SECONDS) / 60)


def run_prewarm(cluster: Cluster, namespace: str) -> Prewarm:
    """A one-minute spec.autoscaling.schedule window for 2 replicas on the autoscaled service (at its minimum,
    1, with no load): the second replica must start during the warm-up before the window, serve in it, and
    go after it. The window opens at the first whole minute at least the warm-up and 5 s away."""
    warm_up = prewarm_warm_up(cluster, namespace)
    now = datetime.now(UTC)
    # KEDA's cron trigger is active whenever its next end comes before its next start, so one applied a few
    # seconds after its start minute is active at once: no margin needed for the operator and KEDA.
    soonest = now + timedelta(seconds=warm_up + 5)
    opens = soonest.replace(second=0, microsecond=0) + timedelta(minutes=1 if soonest.second else 0)
    closes = opens + timedelta(minutes=1)
    window = {"start": opens.strftime("%H:%M"), "end": closes.strftime("%H:%M"), "minReplicas": 2}
    before = {p["metadata"]["name"] for p in ready_pods(cluster, namespace, NAME)}
    spec = {"autoscaling": {"schedule": [window], "warmUpSeconds": warm_up}}
    cluster.kubectl(
        "-n", namespace, "patch", "inferenceservice", NAME, "--type=merge", "-p", json.dumps({"spec": spec})
    )
    result = Prewarm(opens.timestamp(), closes.timestamp(), warm_up)

    def scaled_object_triggers() -> list[dict[str, Any]] | None:
        found = get_json(cluster, "-n", namespace, "scaledobject", NAME)["spec"]["triggers"]
        return found if any(t["type"] == "cron" for t in found) else None

    result.triggers = wait_until(scaled_object_triggers, "the cron trigger", timeout=60, interval=1)

    def warm_pod() -> dict[str, Any] | None:
        new = [p for p in ready_pods(cluster, namespace, NAME) if p["metadata"]["name"] not in before]
        return new[0] if new else None

    # Ready before the window opens, if the warm-up is long enough; the wait allows the window's minute too.
    pod = wait_until(warm_pod, "the warm replica Ready", timeout=opens.timestamp() - time.time() + 60)
    result.created = _epoch(pod["metadata"]["creationTimestamp"])
    result.ready = _epoch(condition(pod, "Ready")["lastTransitionTime"])
    time.sleep(max(0.0, opens.timestamp() + 10 - time.time()))
    result.ready_in_window = len(ready_pods(cluster, namespace, NAME))
    url = service_url(cluster, namespace, NAME)
    body = {"model": NAME, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    result.served = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code

    def back_to_min() -> bool:
        deployment = get_json(cluster, "-n", namespace, "deployment", NAME)
        status = deployment.get("status") or {}
        return (
            deployment["spec"].get("replicas") == MIN_REPLICAS
            and status.get("readyReplicas") == MIN_REPLICAS
            and status.get("replicas") == MIN_REPLICAS
        )

    left = closes.timestamp() - time.time()
    wait_until(back_to_min, "the floor released after the window", timeout=left + 240, interval=1)
    result.released = time.time()
    return result


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
