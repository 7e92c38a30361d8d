"""The autoscaler on a load ramp: KEDA with `metric: SLO` (the in-flight target from the measured capacity)
vs fixed targets (`metric: InFlight`: Pagoda's default 32, and one below the capacity), one after the other
in one run.

    make bench-slo-ramp    (or: .venv/bin/python benchmarks/bench_slo_ramp.py [--ramp 2,4,8,12,16,16,4] ...)

1. A private local cluster with the real node (pods from the CPU runtime image), KEDA, kube-state-metrics and
   Prometheus (e2e/lab/stack.py), and the operator.
2. Per arm, in `--order`: an InferenceService `ramp` (examples/tiny-cpu.yaml, autoscaling 1 to
   `--max-replicas`, KEDA polling every 5 s):
   - `slo`: spec.slo (SLO below) with its capacity profile, `metric: SLO`, sloTargetRatio 0.8: the ramp starts
     once the profile has measured and KEDA's HPA holds the target it gives;
   - `fixed`: `metric: InFlight` without targetInFlight: the default target, 32 in flight per replica;
   - `low`: `metric: InFlight` with targetInFlight `--low-target` (2): a cautious guess below what one
     replica holds within the SLO, which scales out early and keeps replicas longer.
   `--order` runs some of them (each at most once), in that order.
   Then the same ramp: `--ramp` clients in turn, each for `--step-seconds`, every client sending streamed
   chat requests of the SLO's shape (a prompt of about `--prompt-tokens` tokens of its own, so no prefix is
   cached, and exactly `--output-tokens` generated) back to back through the Service's ClusterIP. Every
   second: the Deployment's replicas (pods that exist, started or starting: what GPUs cost) and ready ones.
   Then the service is deleted and its pods are waited out.
3. Per arm: requests completed and failed; SLO attainment (the share of completed requests whose own time
   to first token and mean inter-token latency are both within the objectives); p95 of each over the ramp;
   replica-seconds over the ramp (the sum of the per-second replica counts); the most replicas.
Prints a markdown table and writes the raw numbers to .pagoda-dev/bench-slo-ramp.json (--json).

On this 2-core machine every replica shares the same two cores (one engine thread each, as the sample), so a
second replica adds at most the idle core: the numbers show what the targets do, not a GPU's scaling.

Smoke run (`make test`, tier 3): `--smoke-url URL` starts no cluster: the running server at URL is the one
arm (`given`), a ramp of 1 then 2 clients for 3 s each; replicas are not measured (no Deployment).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from servers import ROOT, Smoke, smoke_options, write_report

sys.path.insert(0, str(ROOT))  # the e2e harness, as bench_routing.py uses it

from e2e.lab import _objects  # noqa: E402
from e2e.lab.observability import Load, Record  # noqa: E402
from e2e.lab.processes import wait_until  # noqa: E402
from e2e.lab.realpods import finished_profile, hpa_target, service_url, wait_condition  # noqa: E402
from e2e.lab.samples import tiny_sample  # noqa: E402
from e2e.lab.stack import private_stack, run_operator  # noqa: E402

NAME, NAMESPACE = "ramp", "bench-slo-ramp"
ARMS = ("slo", "fixed", "low")  # the measured target; the default (32); a fixed one below the capacity
DEFAULT_TARGET = 32
SLO_TARGET_RATIO = 0.8
SMOKE = {"ramp": [1, 2], "step_seconds": 3.0, "json": ROOT / ".pagoda-dev" / "bench-slo-ramp-smoke.json"}
WORDS = "alpha beta gamma delta kernel tensor cache batch token queue replica engine stream model".split()


def sample(arm: str, opts: argparse.Namespace) -> dict[str, Any]:
    """The arm's InferenceService."""
    obj = tiny_sample(NAMESPACE, NAME, real_pods=True)
    spec = obj["spec"]
    spec.pop("replicas")
    spec["runtime"]["startupTimeoutSeconds"] = 900  # replicas start beside busy ones on two shared cores
    spec["monitoring"] = {"serviceMonitor": {"enabled": True, "interval": "2s"}}
    autoscaling: dict[str, Any] = {
        "minReplicas": 1,
        "maxReplicas": opts.max_replicas,
        "pollingInterval": 5,
        "cooldownPeriod": 30,
    }
    if arm == "slo":
        spec["slo"] = slo_spec(opts)
        autoscaling |= {"metric": "SLO", "sloTargetRatio": SLO_TARGET_RATIO}
    elif arm == "low":  # a cautious guess under what one replica can do: it scales out early
        autoscaling |= {"metric": "InFlight", "targetInFlight": opts.low_target}
    else:
        autoscaling["metric"] = "InFlight"  # targetInFlight unset: the default
    spec["autoscaling"] = autoscaling
    return obj


def slo_spec(opts: argparse.Namespace) -> dict[str, Any]:
    return {
        "ttftMs": opts.ttft_ms,
        "interTokenMs": opts.itl_ms,
        "request": {"promptTokens": opts.prompt_tokens, "outputTokens": opts.output_tokens},
        "profile": {"streams": [1, 2, 4, 8, 16], "stepSeconds": 10},
        "tuneEngine": False,  # the arms compare targets, on the same engine settings
    }


def request_body(opts: argparse.Namespace) -> Any:
    """Each request's own prompt of about `prompt_tokens` tokens (two words' worth per token is generous for
    the tiny model's tokenizer; the count is what the engine reports) and exactly `output_tokens` out."""
    rng = random.Random(7)
    lock = threading.Lock()

    def body(client: int, n: int) -> dict[str, Any]:
        with lock:
            words = " ".join(rng.choice(WORDS) for _ in range(opts.prompt_tokens // 2))
        return {
            "messages": [{"role": "user", "content": f"{client}-{n}: {words}"}],
            "max_tokens": opts.output_tokens,
            "ignore_eos": True,
        }

    return body


class Replicas(threading.Thread):
    """The Deployment's replicas and ready replicas, every second."""

    def __init__(self, apps: Any) -> None:
        super().__init__(daemon=True)
        self.apps, self.samples, self.stopped = apps, [], threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(1.0):
            try:
                status = self.apps.read_namespaced_deployment_status(NAME, NAMESPACE).status
            except Exception:  # noqa: BLE001 - a missed sample is not the benchmark's failure
                continue
            self.samples.append((time.monotonic(), status.replicas or 0, status.ready_replicas or 0))

    def stop(self) -> list[tuple[float, int, int]]:
        self.stopped.set()
        self.join()
        return self.samples


def ramp(url: str, opts: argparse.Namespace) -> list[Record]:
    """The ramp's requests: `opts.ramp` clients in turn, `opts.step_seconds` each."""
    loads: list[Load] = []
    body = request_body(opts)
    try:
        for clients in opts.ramp:
            running = sum(load.clients for load in loads if not load.stop_event.is_set())
            while running > clients:  # the ramp down: stop whole loads, newest first
                newest = next(load for load in reversed(loads) if not load.stop_event.is_set())
                newest.stop_event.set()
                running -= newest.clients
            if clients > running:
                loads.append(
                    Load(url, "tiny", clients=clients - running, max_seconds=3600, body=body).start()
                )
            time.sleep(opts.step_seconds)
    finally:
        for load in loads:
            load.stop()
    return [record for load in loads for record in load.records]


def summarize(records: list[Record], opts: argparse.Namespace) -> dict[str, Any]:
    """Attainment and p95s over the completed requests (a request's inter-token latency is its mean)."""
    done = [r for r in records if r.failure is None and r.first_token is not None and r.tokens]
    ttft = [(r.first_token - r.started) * 1000 for r in done]  # type: ignore[operator]
    itl = [(r.ended - r.first_token) * 1000 / max(1, r.tokens - 1) for r in done]  # type: ignore[operator]
    within = sum(1 for t, i in zip(ttft, itl, strict=True) if t <= opts.ttft_ms and i <= opts.itl_ms)
    return {
        "completed": len(done),
        "failed": len(records) - len(done),
        "attainment": round(within / len(done), 4) if done else None,
        "ttft_p95_ms": round(percentile(ttft, 95), 1) if ttft else None,
        "itl_p95_ms": round(percentile(itl, 95), 2) if itl else None,
    }


def percentile(values: list[float], q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]
    )


def run_arm(arm: str, cluster: Any, opts: argparse.Namespace) -> dict[str, Any]:
    from kubernetes import client

    print(f"== {arm}", file=sys.stderr, flush=True)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(sample(arm, opts)))
    wait_condition(cluster, NAMESPACE, NAME, "Ready", timeout=900)
    profile: dict[str, Any] = {}
    if arm == "slo":
        profile = finished_profile(cluster, NAMESPACE, NAME, timeout=1200)
        if profile["state"] != "Succeeded" or not profile.get("concurrency"):
            raise SystemExit(f"the profile measured no capacity: {profile}")
    if profile:
        target = max(1, int(profile["concurrency"] * SLO_TARGET_RATIO))
    else:
        target = opts.low_target if arm == "low" else DEFAULT_TARGET
    wait_until(
        lambda: hpa_target(cluster, NAMESPACE, NAME) == str(target),
        f"the HPA at {target}",
        timeout=180,
        interval=2,
    )
    url = service_url(cluster, NAMESPACE, NAME)
    sampler = Replicas(client.AppsV1Api(cluster.api_client()))
    sampler.start()
    started = time.monotonic()
    records = ramp(url, opts)
    samples = [s for s in sampler.stop() if s[0] >= started]
    cluster.kubectl("delete", "inferenceservice", NAME, "-n", NAMESPACE, "--wait=true", timeout=300)
    wait_until(lambda: not pods_left(cluster), "the arm's pods to go", timeout=300, interval=2)
    return {
        "target_in_flight": target,
        "profile": {k: profile.get(k) for k in ("concurrency", "requestsPerSecond", "steps")}
        if profile
        else None,
        **summarize(records, opts),
        "replica_seconds": sum(s[1] for s in samples),
        "ready_replica_seconds": sum(s[2] for s in samples),
        "max_replicas": max((s[1] for s in samples), default=0),
        "replicas": [s[1] for s in samples],
    }


def pods_left(cluster: Any) -> bool:
    found = cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "name", check=False)
    return bool(found.stdout.strip())


def table(arms: dict[str, dict[str, Any]], opts: argparse.Namespace) -> str:
    lines = [
        f"SLO: TTFT {opts.ttft_ms} ms, inter-token {opts.itl_ms} ms (per request); ramp {opts.ramp} clients, "
        f"{opts.step_seconds:g} s each",
        "",
        "| arm | in-flight target | completed / failed | SLO attainment | TTFT p95 | ITL p95 "
        "| replica-seconds | max replicas |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, r in arms.items():
        lines.append(
            f"| {arm} | {r.get('target_in_flight', '-')} | {r['completed']} / {r['failed']} | "
            f"{r['attainment']} | {r['ttft_p95_ms']} ms | {r['itl_p95_ms']} ms | "
            f"{r.get('replica_seconds', '-')} | {r.get('max_replicas', '-')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ramp", type=lambda t: [int(c) for c in t.split(",")], default=[2, 4, 8, 12, 16, 16, 4]
    )
    parser.add_argument("--step-seconds", type=float, default=45.0, help="seconds at each step of the ramp")
    parser.add_argument("--order", default=",".join(ARMS), help=f"the arms, in order (of {', '.join(ARMS)})")
    parser.add_argument("--max-replicas", type=int, default=3)
    parser.add_argument(
        "--low-target",
        type=int,
        default=2,
        help="the `low` arm's fixed in-flight target, below what the profile measures (a cautious guess)",
    )
    parser.add_argument("--ttft-ms", type=float, default=200.0, help="the TTFT objective (p95)")
    parser.add_argument("--itl-ms", type=float, default=60.0, help="the inter-token objective (p95)")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path, default=ROOT / ".pagoda-dev" / "bench-slo-ramp.json")
    opts = smoke_options(parser, SMOKE, argv)
    order = opts.order.split(",")
    if not order or len(set(order)) != len(order) or not set(order) <= set(ARMS):
        parser.error(f"--order: some of {', '.join(ARMS)}, each at most once (got {opts.order!r})")
    smoke = Smoke.of(opts, {"replicas": "no Deployment: the given server is the one arm"})
    started = time.monotonic()
    if smoke is not None:
        arms = {"given": summarize(ramp(opts.smoke_url, opts), opts)}
        print(smoke.banner())
    else:
        with private_stack() as stack:
            cluster = stack.cluster
            operator = run_operator(
                cluster, Path(tempfile.mkdtemp(prefix="bench-slo-ramp-")) / "operator.log"
            )
            try:
                cluster.kubectl("create", "namespace", NAMESPACE)
                _objects.wait_service_account(None, cluster.api_client(), NAMESPACE, time.monotonic() + 60)
                arms = {arm: run_arm(arm, cluster, opts) for arm in order}
            finally:
                operator.stop()
    report = {
        "smoke": smoke.report() if smoke else None,
        "slo": {"ttftMs": opts.ttft_ms, "interTokenMs": opts.itl_ms},
        "shape": {"promptTokens": opts.prompt_tokens, "outputTokens": opts.output_tokens},
        "ramp": opts.ramp,
        "step_seconds": opts.step_seconds,
        "seconds": round(time.monotonic() - started, 1),
        "load_average": os.getloadavg(),
        "arms": arms,
    }
    write_report(opts.json, report, table(arms, opts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
