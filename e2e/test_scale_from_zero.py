"""Scale from zero, end to end on real components: a routed InferenceService (spec.routing) with
autoscaling.minReplicas 0 idles at zero replicas (Ready, reason ScaledToZero); ten requests arrive at once
through Envoy; the endpoint picker's flow control holds them all (its queue metric, scraped by Prometheus,
reads them); KEDA's picker-queue trigger activates and scales the Deployment to one; the pod starts a real
runtime and becomes Ready; the picker dispatches the held requests to it and all ten succeed. The cold start
(first request sent -> first token) is measured. With nothing in flight, KEDA takes the service back to zero
after the cooldown. The model is an OCI image in the local registry (`make package-model`, pinned by digest),
which the kubelet mounts as an image volume: the start downloads nothing (status.startup's fetchedBytes 0).

The other side of the waiting room: a routed service with no replica for longer than the picker holds a
request (spec.replicas 0, routing.endpointPicker.queueTimeoutSeconds 5) answers a burst with 503s that
name the reason, each after the waiting room and none later.

And when the metrics vanish: the same service idling at zero while Prometheus hangs (SIGSTOP) gets one
replica once KEDA's fallback starts, holds it while the hang lasts, and says so (ScalingMetricsUnavailable,
reason KedaFallback); once Prometheus answers, the condition ends and the service goes back to zero after the
cooldown (docs/autoscaling.md#when-the-metrics-vanish). Before it, the service idles at zero with Prometheus
up and nothing happens: its load query answers 0 while no pod is a scrape target (it once answered nothing,
which KEDA counted as a failure and so started a replica about once a minute)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from e2e.lab import modelimage
from e2e.lab.autoscaling import frozen
from e2e.lab.chartenv import ChartOperator
from e2e.lab.gateway import start_gateway
from e2e.lab.observability import PrometheusAt, dashboard, panel_queries
from e2e.lab.processes import VENV_BIN, http_ok, wait_until
from e2e.lab.realpods import apply, condition, get_json, isvc, pods
from e2e.lab.samples import tiny_sample
from e2e.lab.stack import Stack
from pagoda.operator.resources.scaledobject import FALLBACK_FAILURES, picker_queue_query
from pagoda.runtime.serving.startup import folder_bytes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
NAME = "zero"
REQUESTS = 10
POLLING_SECONDS, COOLDOWN_SECONDS = 5, 30
CLOSED, SHORT_WAIT_SECONDS = "closed", 5
PICKS = "inference_extension_scheduler_attempts_total"


@pytest.fixture(scope="module")
def model_image(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    """The tiny model as an OCI image in the local registry (`make package-model`): its oci:// URI, pinned by
    digest, and the model's bytes."""
    model = tmp_path_factory.mktemp("model-image") / "tiny"
    subprocess.run([str(VENV_BIN / "pagoda-runtime"), "make-tiny-model", str(model)], check=True)
    reference = f"{stack.cluster.urls['registry']}/pagoda-models/tiny:e2e"
    digest = modelimage.package(model, reference, tls_verify=False)
    return f"oci://{modelimage.without_tag(reference)}@{digest}", folder_bytes(model)


def routed_sample(namespace: str, model_uri: str) -> dict[str, Any]:
    """KEDA finds Prometheus at the default `prometheusAddress`, a Service name, as in a user's cluster. The
    model is an OCI image (spec.model.uri oci://...), which the kubelet mounts as an image volume."""
    sample = tiny_sample(namespace, NAME, real_pods=True)
    spec = sample["spec"]
    spec["model"]["uri"] = model_uri
    spec.pop("replicas")
    spec["runtime"]["startupTimeoutSeconds"] = 900
    spec["monitoring"] = {"serviceMonitor": {"enabled": True, "interval": "2s"}}
    spec["autoscaling"] = {
        "minReplicas": 0,
        "maxReplicas": 1,
        "metric": "InFlight",
        "targetInFlight": 4,
        "pollingInterval": POLLING_SECONDS,
        "cooldownPeriod": COOLDOWN_SECONDS,
    }
    # The real node has two cores: a small request for the picker (the default is a whole core).
    spec["routing"] = {"endpointPicker": {"queueTimeoutSeconds": 600, "cpu": "250m"}}
    return sample


def query_value(prometheus: PrometheusAt, expr: str) -> float | None:
    result = prometheus.query(expr)
    return float(result[0]["value"][1]) if result else None


def deployment_replicas(stack: Stack, namespace: str) -> int | None:
    """The Deployment's spec.replicas; None until the operator has created it."""
    found = stack.cluster.kubectl("get", "-n", namespace, "deployment", NAME, "-o", "json", check=False)
    if found.returncode != 0:
        assert "NotFound" in found.stderr, found.stderr
        return None
    return int(json.loads(found.stdout)["spec"].get("replicas", 1))


def at_zero(stack: Stack, namespace: str) -> bool:
    """KEDA scaled the Deployment to zero, no pod is left, and the service says so."""
    ready = condition(isvc(stack.cluster, namespace, NAME), "Ready")
    return (
        deployment_replicas(stack, namespace) == 0
        and not pods(stack.cluster, namespace, NAME)
        and (ready.get("status"), ready.get("reason")) == ("True", "ScaledToZero")
    )


class Request:
    """One streamed chat completion through Envoy, timed from when it was sent."""

    def __init__(self, url: str, n: int, t0: float) -> None:
        self.url, self.n, self.t0 = url, n, t0
        self.status: int | None = None
        self.first_token: float | None = None
        self.done: float | None = None
        self.text = ""
        self.error: str | None = None
        self.upstream: str | None = None

    def run(self) -> None:
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": f"request {self.n}: say something"}],
            "max_tokens": 8,
            "stream": True,
        }
        try:
            with httpx.Client(timeout=900) as client:
                with client.stream("POST", f"{self.url}/v1/chat/completions", json=body) as response:
                    self.status = response.status_code
                    self.upstream = response.headers.get("x-pagoda-upstream")
                    for line in response.iter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        for choice in json.loads(line[6:]).get("choices", []):
                            content = choice.get("delta", {}).get("content")
                            if content:
                                self.first_token = self.first_token or time.monotonic() - self.t0
                                self.text += content
            self.done = time.monotonic() - self.t0
        except httpx.HTTPError as exc:
            self.error = repr(exc)


def test_ten_requests_wake_a_service_at_zero_and_all_succeed(
    stack: Stack, operator: ChartOperator, namespace: str, model_image: tuple[str, int]
) -> None:
    cluster = stack.cluster
    model_uri, model_bytes = model_image
    apply(cluster, routed_sample(namespace, model_uri))
    # The Deployment is created at zero replicas (minReplicas 0: no engine starts only to be removed).
    wait_until(
        lambda: at_zero(stack, namespace), "the service at zero replicas, Ready ScaledToZero", 300, 1.0
    )
    scaled = get_json(cluster, "-n", namespace, "scaledobject", NAME)
    assert [t["name"] for t in scaled["spec"]["triggers"]] == ["in-flight", "picker-queue"]

    prometheus = PrometheusAt(stack.prometheus_url)
    t_start = time.time()
    with start_gateway(cluster, NAME, namespace) as gateway:
        t0 = time.monotonic()
        requests = [Request(gateway.url, n, t0) for n in range(REQUESTS)]
        threads = [threading.Thread(target=r.run) for r in requests]
        for thread in threads:
            thread.start()

        # Held by the picker, seen by Prometheus through the picker's ServiceMonitor labels.
        query = picker_queue_query(NAME, namespace)
        held = wait_until(
            lambda: (v := query_value(prometheus, query)) is not None and v >= 1 and v,
            "the picker's queue in Prometheus",
            120,
            1.0,
        )
        assert all(r.status is None for r in requests), "a request was answered while no replica ran"
        # KEDA activates on it and the HPA/KEDA asks for one replica.
        wait_until(
            lambda: deployment_replicas(stack, namespace) == 1, "KEDA scaling to one replica", 120, 1.0
        )
        for thread in threads:
            thread.join(timeout=900)

        failed = [(r.n, r.status, r.error) for r in requests if r.status != 200 or not r.text]
        assert failed == [], failed
        pod_ips = {p["status"].get("podIP") for p in pods(cluster, namespace, NAME)}
        assert {r.upstream.rsplit(":", 1)[0] for r in requests if r.upstream} <= pod_ips
        cold_start = min(r.first_token for r in requests if r.first_token is not None)
        slowest = max(r.done for r in requests if r.done is not None)
        # The model came as an image volume: nothing downloaded at start, the image's files loaded.
        [pod] = pods(cluster, namespace, NAME)
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "model-source")
        assert volume["image"]["reference"] == model_uri.removeprefix("oci://")

        def started() -> dict[str, Any] | None:
            return ((isvc(cluster, namespace, NAME).get("status") or {}).get("startup") or {}).get("last")

        last = wait_until(started, "the start in status.startup", 60, 1.0)
        assert (last["fetchedBytes"], last["modelBytes"]) == (0, model_bytes)
        assert last["phases"]["modelFetch"] < 2.0, last
        # A few more once Prometheus has the picker's pick counter (a counter's first sample has no rate).
        wait_until(lambda: prometheus.query(PICKS), "the picker's pick counter in Prometheus", 60, 1.0)
        for n in range(3):
            more = Request(gateway.url, REQUESTS + n, time.monotonic())
            more.run()
            assert (more.status, more.error) == (200, None)
        time.sleep(3)  # a few scrapes
        print(
            f"\nScale from zero: {REQUESTS} requests held (queue peaked at >= {held:.0f} in Prometheus), "
            f"first token {cold_start:.1f}s after they were sent, all done in {slowest:.1f}s"
        )

    # The dashboard's routing panels show the run: the held requests, and every pick going to the one pod.
    panels = {
        (title, legend): expr
        for title, legend, expr in panel_queries(
            dashboard("inferenceservice"), {"namespace": namespace, "service": NAME}
        )
        if "inference_extension_" in expr
    }
    assert len(panels) == 3, panels
    window = (t_start, time.time())

    def peak(key: tuple[str, str]) -> float:
        results = prometheus.query_range(panels[key], *window, step="1s")
        return max((float(v) for result in results for _, v in result["values"]), default=0.0)

    assert peak(("Endpoint picker: requests held", "held")) >= 1
    assert peak(("Endpoint picker: requests held", "pool saturation (0-1)")) == 1.0  # no replica at first
    assert peak(("Endpoint picker: picks per pod", "{{pod_name}}")) > 0

    # Nothing in flight and nothing held: back to zero after the cooldown.
    wait_until(lambda: at_zero(stack, namespace), "back to zero replicas", COOLDOWN_SECONDS + 240, 1.0)


def test_a_burst_that_outlasts_the_waiting_room_gets_503s_that_say_why_and_never_hangs(
    stack: Stack, operator: ChartOperator, namespace: str
) -> None:
    """No replica comes (spec.replicas 0): each request waits the picker's waiting room (its flow control's
    TTL, here 5 s), then gets 503 with GIE's reason ("request timed out in queue"); the service says at
    zero that nothing wakes it. The picker's TTL sweep runs every second: 503 between 5 and 5 + 15 s."""
    cluster = stack.cluster
    sample = tiny_sample(namespace, CLOSED, real_pods=True)
    sample["spec"]["replicas"] = 0
    sample["spec"]["routing"] = {"endpointPicker": {"queueTimeoutSeconds": SHORT_WAIT_SECONDS, "cpu": "250m"}}
    apply(cluster, sample)
    try:
        with start_gateway(cluster, CLOSED, namespace) as gateway:
            body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
            answers: list[tuple[int | None, float, str]] = []

            def send() -> None:
                t0 = time.monotonic()
                try:
                    with httpx.Client(timeout=60) as client:
                        response = client.post(f"{gateway.url}/v1/chat/completions", json=body)
                    answers.append((response.status_code, time.monotonic() - t0, response.text))
                except httpx.HTTPError as exc:
                    answers.append((None, time.monotonic() - t0, repr(exc)))

            threads = [threading.Thread(target=send) for _ in range(REQUESTS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=120)
        assert len(answers) == REQUESTS, answers
        for status, seconds, text in answers:
            assert status == 503, (status, seconds, text)
            assert SHORT_WAIT_SECONDS - 1 <= seconds <= SHORT_WAIT_SECONDS + 15, (seconds, text)
            assert "timed out in queue" in text, text
        ready = condition(isvc(cluster, namespace, CLOSED), "Ready")
        assert (ready.get("status"), ready.get("reason")) == ("False", "ScaledToZero"), ready
        print(
            f"\nWaiting room {SHORT_WAIT_SECONDS}s: {REQUESTS} x 503 after "
            f"{min(a[1] for a in answers):.1f}-{max(a[1] for a in answers):.1f}s"
        )
    finally:
        cluster.kubectl("delete", "-n", namespace, "inferenceservice", CLOSED, "--wait=false", check=False)


# KEDA's Prometheus queries give up after 3 s (KEDA_HTTP_DEFAULT_TIMEOUT): against a hung Prometheus each poll
# of the two triggers takes up to twice that on top of the polling interval.
KEDA_QUERY_TIMEOUT = 3
# KEDA falls back after more than FALLBACK_FAILURES failed polls in a row: that many polls and one, each as
# slow as a hung Prometheus makes it, and a margin for two loaded cores.
FALLBACK_BOUND = (FALLBACK_FAILURES + 1) * (POLLING_SECONDS + 2 * KEDA_QUERY_TIMEOUT) + 30
# As long as KEDA would take to fall back were the service's own queries failing at zero: the idle service
# must stay at zero through it before the hang, so the replica that comes in the hang is the hang's.
IDLE_SECONDS = (FALLBACK_FAILURES + 1) * POLLING_SECONDS + 10
HOLD_SECONDS = 3 * POLLING_SECONDS  # the replica held through three more polls of the hang
# After the hang the load trigger reads the new pod's series only once its runtime has started (about a
# minute on two cores) and Prometheus scraped it.
RECOVERY_BOUND = 300


@dataclass
class Seen:
    """One look at the service from the API server, `t` seconds after the hang began (negative before)."""

    t: float
    replicas: int | None  # the Deployment's spec.replicas
    fallback: str | None  # the ScaledObject's condition Fallback
    blind: dict[str, Any]  # the InferenceService's condition ScalingMetricsUnavailable

    def __str__(self) -> str:
        return (
            f"{self.t:6.1f}s replicas={self.replicas} Fallback={self.fallback} "
            f"ScalingMetricsUnavailable={self.blind.get('status')}/{self.blind.get('reason')}"
        )


def look(stack: Stack, namespace: str, since: float) -> Seen:
    items = get_json(
        stack.cluster,
        "-n",
        namespace,
        f"deployment/{NAME}",
        f"scaledobject/{NAME}",
        f"inferenceservice/{NAME}",
    )["items"]
    by_kind = {item["kind"]: item for item in items}
    deployment = by_kind.get("Deployment")
    return Seen(
        t=time.monotonic() - since,
        replicas=None if deployment is None else int(deployment["spec"].get("replicas", 1)),
        fallback=condition(by_kind.get("ScaledObject") or {}, "Fallback").get("status"),
        blind=condition(by_kind.get("InferenceService") or {}, "ScalingMetricsUnavailable"),
    )


def test_a_service_at_zero_gets_one_replica_while_prometheus_hangs_and_goes_back_to_zero_after(
    stack: Stack, operator: ChartOperator, namespace: str, model_image: tuple[str, int]
) -> None:
    """KEDA v2.21's fallback for a minReplicas-0 service: at zero no trigger is active, so Prometheus hung
    only counts failures at first; past FALLBACK_FAILURES the fallback (currentReplicasIfHigher,
    fallback.replicas 1) stands in as active and KEDA scales the Deployment from zero to one, and holds it
    while the hang lasts. Once Prometheus answers (and has the new pod's series: the load trigger counts an
    empty answer as a failure), the fallback ends, the condition with it, and the idle service goes back to
    zero after the cooldown (30 s here)."""
    cluster = stack.cluster
    apply(cluster, routed_sample(namespace, model_image[0]))
    wait_until(
        lambda: at_zero(stack, namespace), "the service at zero replicas, Ready ScaledToZero", 300, 1.0
    )
    seen: list[Seen] = []

    def timeline() -> str:
        return "\n".join(str(s) for s in seen)

    # Idle at zero with Prometheus answering: no fallback, no replica, for as long as KEDA would take to fall
    # back (the replica the hang brings must be the hang's). With no pod the in-flight query answers 0, not
    # nothing (operator/resources/scaledobject.py `_zero_without_targets`): an empty answer is a failure to
    # KEDA (`ignoreNullValues: "false"`), and its 4th one would start a replica.
    began = time.monotonic()
    while time.monotonic() - began < IDLE_SECONDS:
        now = look(stack, namespace, began + IDLE_SECONDS)
        seen.append(now)
        assert now.replicas == 0 and now.fallback != "True" and now.blind.get("status") != "True", timeline()
        time.sleep(1.0)

    pid = stack.monitoring.pid()
    hung = time.monotonic()
    fallback_after: float | None = None  # seconds from the hang to KEDA's condition Fallback True
    replica_after: float | None = None  # ... to the Deployment at one replica
    blind_after: float | None = None  # ... to the InferenceService's ScalingMetricsUnavailable True
    try:
        with frozen(pid):
            # KEDA falls back and scales the service from zero to one, and the InferenceService says why.
            while fallback_after is None or replica_after is None or blind_after is None:
                assert time.monotonic() - hung < FALLBACK_BOUND, f"no fallback to one replica:\n{timeline()}"
                now = look(stack, namespace, hung)
                seen.append(now)
                assert now.replicas in (0, 1), timeline()
                if fallback_after is None and now.fallback == "True":
                    fallback_after = now.t
                if replica_after is None and now.replicas == 1:
                    replica_after = now.t
                if blind_after is None and now.blind.get("status") == "True":
                    blind_after = now.t
                    assert now.blind["reason"] == "KedaFallback", now.blind
                    # It names the triggers past the threshold when it flipped: both fail, but KEDA counts
                    # each trigger's failures on its own, so either may cross first (CI, stop 49).
                    named = [t for t in ("in-flight", "picker-queue") if f" {t}" in now.blind["message"]]
                    assert named, now.blind
                time.sleep(1.0)
            # ...and holds it while the hang lasts.
            held = time.monotonic()
            while time.monotonic() - held < HOLD_SECONDS:
                now = look(stack, namespace, hung)
                seen.append(now)
                assert (now.replicas, now.fallback, now.blind.get("status")) == (1, "True", "True"), (
                    timeline()
                )
                time.sleep(1.0)
            hang_seconds = time.monotonic() - hung
    finally:
        # Later tests query Prometheus: it answers again before this test goes on or fails.
        wait_until(lambda: http_ok(f"{stack.prometheus_url}/-/ready"), "Prometheus ready after the hang", 60)
    resumed = time.monotonic()

    # Prometheus answers: once it has the new pod's series the fallback ends, the condition with it...
    while (now := look(stack, namespace, hung)).blind.get("status") != "False":
        seen.append(now)
        assert time.monotonic() - resumed < RECOVERY_BOUND, f"still no metrics after the hang:\n{timeline()}"
        time.sleep(1.0)
    seen.append(now)
    assert now.blind["reason"] == "MetricsRead", now.blind
    assert now.fallback == "False", timeline()
    recovered_after = time.monotonic() - resumed
    # ...and with nothing in flight the service goes back to zero after the cooldown.
    wait_until(lambda: at_zero(stack, namespace), "back to zero replicas", COOLDOWN_SECONDS + 120, 1.0)
    zero_after = time.monotonic() - resumed
    print(
        f"\nPrometheus hung {hang_seconds:.0f}s: KEDA fell back after {fallback_after:.0f}s, the Deployment "
        f"at 1 replica after {replica_after:.0f}s, ScalingMetricsUnavailable True after {blind_after:.0f}s; "
        f"resumed: the condition False after {recovered_after:.0f}s, back at zero after {zero_after:.0f}s\n"
        + timeline()
    )
