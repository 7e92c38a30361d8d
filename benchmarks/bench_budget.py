"""A GPU budget vs fixed shares of the same pool: two services, two peaks of the high-priority one's load.

    make bench-budget    (or: .venv/bin/python benchmarks/bench_budget.py [--runs 3] [--order fixed,budget])

1. A private local cluster with the real node (pods from the CPU runtime image), KEDA, kube-state-metrics and
   Prometheus (e2e/lab/stack.py), and the operator watching every namespace (it reads GPUBudgets).
2. Per run, each arm of `--order` (alternating the order from run to run): InferenceServices `chat`
   (priority 100) and `batch` (priority 0) in namespace bench-budget, from examples/tiny-cpu.yaml (1 GPU a
   replica), autoscaled on in-flight requests (`--target` a replica, KEDA polling every 5 s, 1 replica at
   least):
   - `budget`: both up to `--max-replicas` (2) under one GPUBudget of `--gpus` (3) GPUs (docs/budget.md):
     the budget gives the spare GPU to whichever asks, chat first, through a drain of batch's replica;
   - `fixed`: no budget; the pool split once, as a team guarding chat's peaks would: chat up to
     `--fixed-chat` (2), batch up to the rest (`--gpus` - `--fixed-chat`: 1).
   Then the same load: batch's `--batch-clients` (8) for the whole run; chat's `--valley-clients` (1), and
   `--peak-clients` (8) in two peaks: valley, peak, valley, peak, valley (`--valley-seconds`,
   `--peak-seconds`). Every client sends streamed chat requests of one shape (a prompt of about
   `--prompt-tokens` tokens of its own, exactly `--output-tokens` generated) back to back through the
   Service's ClusterIP. Every second: each service's pods that hold a GPU (e2e/lab/realpods.Holding).
   Then the services (and the budget) are deleted and their pods waited out.
3. Per arm, the median over the runs with the range: chat's requests within the SLO (its own time to first
   token and mean inter-token latency both within the objectives), in all and in the peaks, with its p95s in
   the peaks; batch's completed requests; failed requests of both; GPU-seconds (pod-seconds holding a GPU,
   both services, over the load) and the most GPUs held at once.
Prints a markdown table and writes the raw numbers to .pagoda-dev/bench-budget.json (--json).

On this 2-core machine every replica shares the same two cores (one engine thread each), so a replica more
for chat means a larger share of the cores for chat, not a GPU's worth of capacity: the numbers show what
the allocation does (who holds the replicas, when), not a GPU fleet's latencies.

Smoke run (`make test`, tier 3): `--smoke-url URL` starts no cluster: the running server at URL is both
services (`given`), the same pattern of a few seconds; GPUs are not measured (no pods).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from bench_slo_ramp import request_body, summarize
from servers import ROOT, Smoke, smoke_options, write_report

sys.path.insert(0, str(ROOT))  # the e2e harness, as bench_routing.py uses it

from e2e.lab import _objects  # noqa: E402
from e2e.lab.observability import Load, Record  # noqa: E402
from e2e.lab.processes import wait_until  # noqa: E402
from e2e.lab.realpods import Holding, service_url, wait_condition  # noqa: E402
from e2e.lab.samples import gpu_budget, tiny_sample  # noqa: E402
from e2e.lab.stack import private_stack, run_operator  # noqa: E402

NAMESPACE, BUDGET = "bench-budget", "bench-budget"
SERVICES = {"chat": 100, "batch": 0}  # name -> priority
ARMS = ("budget", "fixed")
PATTERN = ("valley", "peak", "valley", "peak", "valley")
SMOKE = {
    "valley_seconds": 2.0,
    "peak_seconds": 3.0,
    "batch_clients": 1,
    "peak_clients": 2,
    "runs": 1,
    "json": ROOT / ".pagoda-dev" / "bench-budget-smoke.json",
}
# What the table shows of each arm: (key, heading).
MEASURES = (
    ("chat_within_slo", "chat within SLO"),
    ("chat_attainment", "chat attainment"),
    ("chat_attainment_peaks", "chat attainment, peaks"),
    ("chat_ttft_p95_peaks_ms", "chat TTFT p95, peaks (ms)"),
    ("chat_itl_p95_peaks_ms", "chat ITL p95, peaks (ms)"),
    ("batch_completed", "batch completed"),
    ("failed", "failed (both)"),
    ("gpu_seconds", "GPU-seconds"),
    ("max_gpus", "most GPUs at once"),
)


def services(arm: str, opts: argparse.Namespace) -> list[dict[str, Any]]:
    """The arm's two InferenceServices."""
    out = []
    for name, priority in SERVICES.items():
        obj = tiny_sample(NAMESPACE, name, real_pods=True)
        spec = obj["spec"]
        spec.pop("replicas")
        spec["runtime"]["startupTimeoutSeconds"] = 900  # replicas start beside busy ones on two shared cores
        spec["monitoring"] = {"serviceMonitor": {"enabled": True, "interval": "2s"}}
        autoscaling: dict[str, Any] = {
            "minReplicas": 1,
            "metric": "InFlight",
            "targetInFlight": opts.target,
            "pollingInterval": 5,
            "cooldownPeriod": 30,
        }
        if arm == "budget":
            autoscaling |= {
                "maxReplicas": opts.max_replicas,
                "budget": {"name": BUDGET, "priority": priority},
            }
        else:
            autoscaling["maxReplicas"] = opts.fixed_chat if name == "chat" else opts.gpus - opts.fixed_chat
        spec["autoscaling"] = autoscaling
        out.append(obj)
    return out


def drive(urls: dict[str, str], opts: argparse.Namespace) -> dict[str, Any]:
    """The load pattern: batch's clients throughout, chat's valleys and peaks (PATTERN). Returns each
    service's records, the peaks' (start, end) and the load's (start, end), monotonic."""
    body = request_body(opts)

    def load(name: str, clients: int) -> Load:
        return Load(urls[name], "tiny", clients=clients, max_requests=10**7, max_seconds=7200, body=body)

    loads = [load("batch", opts.batch_clients).start(), load("chat", opts.valley_clients).start()]
    began, peaks = time.monotonic(), []
    try:
        for phase in PATTERN:
            if phase == "valley":
                time.sleep(opts.valley_seconds)
                continue
            print(f"   peak of chat's load ({opts.peak_clients} clients)", file=sys.stderr, flush=True)
            peak = load("chat", opts.peak_clients - opts.valley_clients).start()
            loads.append(peak)
            start = time.monotonic()
            time.sleep(opts.peak_seconds)
            peak.stop()
            peaks.append((start, time.monotonic()))
    finally:
        for running in loads:
            running.stop()
    records = {"batch": loads[0].records, "chat": [r for running in loads[1:] for r in running.records]}
    return {"records": records, "peaks": peaks, "window": (began, time.monotonic())}


def measure(driven: dict[str, Any], opts: argparse.Namespace, holding: Holding | None) -> dict[str, Any]:
    """One arm's numbers from one run (GPU-seconds only with `holding`, the pods sampled)."""
    chat: list[Record] = driven["records"]["chat"]
    batch: list[Record] = driven["records"]["batch"]
    in_peaks = [r for r in chat if any(start <= r.started <= end for start, end in driven["peaks"])]
    overall, peaks = summarize(chat, opts), summarize(in_peaks, opts)
    out: dict[str, Any] = {
        "chat_completed": overall["completed"],
        "chat_within_slo": round((overall["attainment"] or 0) * overall["completed"]),
        "chat_attainment": overall["attainment"],
        "chat_attainment_peaks": peaks["attainment"],
        "chat_ttft_p95_peaks_ms": peaks["ttft_p95_ms"],
        "chat_itl_p95_peaks_ms": peaks["itl_p95_ms"],
        "batch_completed": sum(1 for r in batch if r.failure is None),
        "batch_tokens": sum(r.tokens or 0 for r in batch if r.failure is None),
        "failed": overall["failed"] + sum(1 for r in batch if r.failure is not None),
        "failures": [r.failure for r in chat + batch if r.failure is not None][:10],
    }
    if holding is not None:
        start, end = driven["window"]
        out["gpu_seconds"] = holding.gpu_seconds(start, end)
        out["gpu_seconds_by_service"] = {name: holding.gpu_seconds(start, end, name) for name in SERVICES}
        out["max_gpus"] = max((sum(c for c, _ in s.values()) for s in holding.samples), default=0)
        out["gpus_held"] = [sum(c for c, _ in s.values()) for s in holding.samples]
    return out


def run_arm(arm: str, cluster: Any, opts: argparse.Namespace) -> dict[str, Any]:
    print(f"== {arm}", file=sys.stderr, flush=True)
    objects = ([gpu_budget(BUDGET, opts.gpus, NAMESPACE)] if arm == "budget" else []) + services(arm, opts)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    holding = Holding(cluster, NAMESPACE, SERVICES)
    try:
        for name in SERVICES:
            wait_condition(cluster, NAMESPACE, name, "Ready", timeout=900)
        urls = {name: service_url(cluster, NAMESPACE, name) for name in SERVICES}
        holding.start()
        driven = drive(urls, opts)
    finally:
        holding.stop()
        cluster.kubectl("delete", "inferenceservices", "--all", "-n", NAMESPACE, "--wait=true", timeout=300)
        cluster.kubectl("delete", "gpubudget", BUDGET, "--ignore-not-found", timeout=60)
        wait_until(lambda: not pods_left(cluster), "the arm's pods to go", timeout=300, interval=2)
    return measure(driven, opts, holding)


def pods_left(cluster: Any) -> bool:
    found = cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "name", check=False)
    return bool(found.stdout.strip())


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each measured number's median over the runs, with its range."""
    out: dict[str, Any] = {}
    for key, _ in MEASURES:
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return out


def table(summary: dict[str, dict[str, Any]], opts: argparse.Namespace) -> str:
    arms = list(summary)
    lines = [
        f"Pool {opts.gpus} GPUs; chat's SLO: TTFT {opts.ttft_ms:g} ms, inter-token {opts.itl_ms:g} ms; "
        f"batch {opts.batch_clients} clients throughout; chat {opts.valley_clients} client, "
        f"{opts.peak_clients} in two peaks of {opts.peak_seconds:g} s (valleys {opts.valley_seconds:g} s); "
        f"median (range) of {opts.runs} run(s)",
        "",
        "| measure | " + " | ".join(arms) + " |",
        "|---|" + "---|" * len(arms),
    ]
    for key, heading in MEASURES:
        cells = []
        for arm in arms:
            m = summary[arm].get(key)
            cells.append("-" if m is None else f"{m['median']:g} ({m['min']:g}-{m['max']:g})")
        lines.append(f"| {heading} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--order", default=",".join(ARMS), help=f"the arms, in order (of {', '.join(ARMS)})")
    parser.add_argument("--runs", type=int, default=3, help="runs of every arm (the table shows medians)")
    parser.add_argument(
        "--gpus", type=int, default=3, help="the pool: the budget's GPUs, or the fixed split's"
    )
    parser.add_argument(
        "--max-replicas", type=int, default=2, help="each service's maxReplicas under the budget"
    )
    parser.add_argument(
        "--fixed-chat", type=int, default=2, help="chat's share in the fixed arm (batch: the rest)"
    )
    parser.add_argument("--target", type=int, default=4, help="in-flight requests a replica (KEDA's target)")
    parser.add_argument("--batch-clients", type=int, default=8)
    parser.add_argument("--valley-clients", type=int, default=1)
    parser.add_argument("--peak-clients", type=int, default=8)
    parser.add_argument("--valley-seconds", type=float, default=120.0)
    parser.add_argument("--peak-seconds", type=float, default=180.0)
    parser.add_argument("--ttft-ms", type=float, default=500.0, help="chat's TTFT objective")
    parser.add_argument("--itl-ms", type=float, default=60.0, help="chat's inter-token objective")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path, default=ROOT / ".pagoda-dev" / "bench-budget.json")
    opts = smoke_options(parser, SMOKE, argv)
    order = opts.order.split(",")
    if not order or len(set(order)) != len(order) or not set(order) <= set(ARMS):
        parser.error(f"--order: some of {', '.join(ARMS)}, each at most once (got {opts.order!r})")
    if opts.runs < 1:
        parser.error(f"--runs: at least 1 (got {opts.runs})")
    if not 1 <= opts.fixed_chat < opts.gpus:
        parser.error(f"--fixed-chat: from 1 to --gpus - 1, so that batch keeps one (got {opts.fixed_chat})")
    if not opts.valley_clients < opts.peak_clients:
        parser.error("--peak-clients: more than --valley-clients")
    smoke = Smoke.of(opts, {"gpus": "no pods: the given server is both services"})
    started = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {}
    if smoke is not None:
        runs["given"] = [measure(drive({name: opts.smoke_url for name in SERVICES}, opts), opts, None)]
        print(smoke.banner())
    else:
        with private_stack() as stack:
            cluster = stack.cluster
            operator = run_operator(cluster, cluster.workdir / "operator.log")
            try:
                cluster.kubectl("create", "namespace", NAMESPACE)
                _objects.wait_service_account(None, cluster.api_client(), NAMESPACE, time.monotonic() + 60)
                for run in range(opts.runs):
                    for arm in order if run % 2 == 0 else order[::-1]:
                        runs.setdefault(arm, []).append(run_arm(arm, cluster, opts))
            finally:
                operator.stop()
    summary = {arm: medians(results) for arm, results in runs.items()}
    report = {
        "smoke": smoke.report() if smoke else None,
        "pool_gpus": opts.gpus,
        "slo": {"ttftMs": opts.ttft_ms, "interTokenMs": opts.itl_ms},
        "shape": {"promptTokens": opts.prompt_tokens, "outputTokens": opts.output_tokens},
        "pattern": {
            "phases": PATTERN,
            "valley_seconds": opts.valley_seconds,
            "peak_seconds": opts.peak_seconds,
            "batch_clients": opts.batch_clients,
            "chat_clients": {"valley": opts.valley_clients, "peak": opts.peak_clients},
        },
        "seconds": round(time.monotonic() - started, 1),
        "load_average": os.getloadavg(),
        "summary": summary,
        "runs": runs,
    }
    write_report(opts.json, report, table(summary, opts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
