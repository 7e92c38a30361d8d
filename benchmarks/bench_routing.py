"""Prefix-aware routing (GIE's endpoint picker behind Envoy) vs round-robin, side by side in one run, on
three real replicas of the tiny model whose KV caches each hold about a third of the workload's prefixes.

    make bench-routing    (or: .venv/bin/python benchmarks/bench_routing.py [--rounds 2] [--rates 1,2,3])

1. A private local cluster with the real node (kubelet + containerd: pods from the CPU runtime image at
   real pod IPs), the operator, GIE v1.5.0's InferencePool CRD; one InferenceService `bench` with
   spec.routing and 3 replicas. Each replica's KV cache is cut to a fixed number of blocks (vLLM's
   --num-gpu-blocks-override) sized so that it holds about a third of the distinct system prompts, with room
   left for the requests it runs.
2. The workload: many users, each reusing one of N long system prompts picked uniformly (N large enough that
   one replica cannot cache them all), a short question each, 8 generated tokens. The same sequence of
   (prompt, question) is sent (a) through Envoy and the real picker, (b) through the same Envoy round-robin
   over the same three pods (a second listener to a ROUND_ROBIN cluster, as a Service's kube-proxy would
   spread them, e2e/lab/gateway.py): the two sides differ only in the picking. Each mode and load gets its own
   prompt texts (a salt at the start), so none starts on another's cache; the order of the modes alternates
   between rounds. First a warm-up through both sides (its own prompts, not counted). Then per round:
   - closed loop: C concurrent clients (more than the replicas' batch slots), each sending its next request
     when the last finished: each side's capacity;
   - a sweep of open-loop arrival rates (requests sent at a fixed rate whatever happens to the others, as
     users arrive): by default 0.5, 0.75, 1.0, 1.25 and 1.5 times round-robin's closed-loop capacity in the
     first round, the same rates in every round; from under load to the overload in which KubeAI measured
     its prefix-hash routing, where the side that cannot keep up piles requests into its queues.
3. Per mode and load: throughput (requests/s and generated tokens/s), TTFT p50/p99/mean (streamed, first
   content), and the engines' own prefix-cache hit rate (vllm:prefix_cache_hits / vllm:prefix_cache_queries,
   summed over the pods, before minus after).
Prints a markdown table (per load: the median over rounds of each side, the median ratio and its range) and
writes the raw numbers to .pagoda-dev/bench-routing.json (--out).

Smoke run (`make test`, tier 3): `--smoke-url URL` starts no cluster: the running server at URL (OpenAI API,
model `tiny`) is both sides and the one pod whose prefix-cache counters are read; 2 system prompts of 40
words, 1 round, a closed loop of 4 requests, 2 clients, the sweep of arrival rates with 2 requests each, a
warm-up of 2. The prompts' length in tokens and the KV cache's size (the replicas' settings) are not measured,
and every ratio compares that server with itself.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from servers import ROOT, Smoke, smoke_options

sys.path.insert(0, str(ROOT))

from e2e.lab import _objects  # noqa: E402
from e2e.lab.addons import install_gateway_crds  # noqa: E402
from e2e.lab.cluster import Cluster, start_private  # noqa: E402
from e2e.lab.gateway import start_gateway  # noqa: E402
from e2e.lab.realpods import ready_pods, wait_condition  # noqa: E402
from e2e.lab.samples import tiny_sample  # noqa: E402
from e2e.lab.stack import run_operator  # noqa: E402
from pagoda.contract import HTTP_PORT  # noqa: E402

NAME, NAMESPACE = "bench", "bench-routing"
REPLICAS = 3
BLOCK_SIZE = 32
MAX_NUM_SEQS = 4
MAX_TOKENS = 8
WORDS = (
    "the model serves requests from many users who share a long system prompt that describes the tools "
    "policies examples and tone of an assistant for a team of engineers working on clusters of machines "
    "with accelerators queues caches replicas gateways routes pools pickers metrics alerts dashboards"
).split()


def pct(values: list[float], q: float) -> float | None:
    """The q-quantile of `values` (nearest rank); None when there are none (every request failed)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else None


@dataclass
class Workload:
    prompts: int
    prompt_words: int
    requests: int
    concurrency: int
    seed: int = 7
    sequence: list[tuple[int, str]] = field(default_factory=list)  # (prompt index, question)

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        # Each request: a user of one of the N assistants, picked uniformly (every prompt as popular).
        for n in range(self.requests):
            index = rng.randrange(self.prompts)
            self.sequence.append((index, f"question {n}: {' '.join(rng.choices(WORDS, k=6))}?"))

    def system_prompts(self, salt: str) -> list[str]:
        rng = random.Random(self.seed + 1)
        return [
            f"{salt} assistant {i}: " + " ".join(rng.choices(WORDS, k=self.prompt_words))
            for i in range(self.prompts)
        ]


@functools.cache
def tiny_model() -> Path:
    """The tiny model as the CPU runtime image has it (`make-tiny-model` is deterministic): its tokenizer."""
    from pagoda.runtime.tools.tinymodel import make_tiny_model

    return make_tiny_model(Path(tempfile.mkdtemp(prefix="bench-routing-model-")) / "tiny")


def prompt_tokens(text: str) -> int:
    from transformers import AutoTokenizer  # the tiny model's own tokenizer, local

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model()))
    return len(tokenizer(text)["input_ids"])


def kv_blocks(workload: Workload) -> tuple[int, int]:
    """Blocks per replica: a third of the distinct prompts' tokens, plus its running requests' own blocks
    beyond their prompt; and the prompt length in tokens."""
    tokens = prompt_tokens(workload.system_prompts("size")[0]) + 40  # the chat template and a question
    prefixes = workload.prompts * tokens / REPLICAS
    running = MAX_NUM_SEQS * (MAX_TOKENS + 40)
    return int((prefixes + running) / BLOCK_SIZE) + 1, tokens


def bench_sample(blocks: int, max_model_len: int) -> dict[str, Any]:
    sample = tiny_sample(NAMESPACE, NAME, real_pods=True)
    spec = sample["spec"]
    spec["replicas"] = REPLICAS
    spec["engine"].update(
        {
            "maxModelLen": max_model_len,
            "maxNumSeqs": MAX_NUM_SEQS,
            "blockSize": BLOCK_SIZE,
            "enablePrefixCaching": True,
            "extraArgs": ["--enforce-eager", "--num-gpu-blocks-override", str(blocks)],
        }
    )
    spec["runtime"]["startupTimeoutSeconds"] = 900
    # The real node has two cores to share: small CPU requests (the engines still use idle cores).
    spec["resources"]["cpu"] = "250m"
    # One picker: the benchmark compares picking, and a standby would only take a share of the two cores.
    spec["routing"] = {"endpointPicker": {"queueTimeoutSeconds": 600, "cpu": "250m", "replicas": 1}}
    return sample


def scrape(pod_urls: list[str]) -> dict[str, float]:
    """vLLM's prefix-cache counters summed over the pods."""
    totals = {"hits": 0.0, "queries": 0.0}
    for url in pod_urls:
        for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                totals["hits"] += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                totals["queries"] += float(line.rsplit(" ", 1)[1])
    return totals


@dataclass
class Result:
    mode: str
    round: int
    completed: int
    failed: int
    seconds: float
    ttft: list[float]
    tokens: int
    hit_rate: float
    rate: float | None = None  # open loop: requests sent per second; None: closed loop

    def row(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "load": f"open {self.rate:.2f}/s" if self.rate else "closed",
            "round": self.round,
            "completed": self.completed,
            "failed": self.failed,
            "requests_per_s": self.completed / self.seconds,
            "tokens_per_s": self.tokens / self.seconds,
            "ttft_p50_s": pct(self.ttft, 0.5),
            "ttft_p99_s": pct(self.ttft, 0.99),
            "ttft_mean_s": statistics.fmean(self.ttft) if self.ttft else None,
            "prefix_hit_rate": self.hit_rate,
        }


def send(http: httpx.Client, url: str, system: str, question: str) -> tuple[float | None, int]:
    """One streamed chat completion: (time to its first content token, completion tokens); raises on a
    failure (HTTP error status or transport error)."""
    body = {
        "model": "tiny",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    began, first, tokens = time.monotonic(), None, 0
    with http.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and any(c["delta"].get("content") for c in chunk.get("choices", [])):
                first = time.monotonic() - began
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    return first, tokens


def run_mode(
    mode: str,
    round_: int,
    workload: Workload,
    url: str,
    pod_urls: list[str],
    rate: float | None = None,
    salt: str | None = None,
) -> Result:
    """The workload's sequence, each request to `url` (Envoy's picker listener or its round-robin one).
    Closed loop (`rate` None): `concurrency` clients, each sending its next request when the last one
    finished, so the replicas are kept saturated (throughput). Open loop: request n is sent at n / `rate`
    seconds whatever happens to the others, as users arrive (TTFT under a given load). `salt`: the prompts'
    (default: one per mode, round and load)."""
    prompts = workload.system_prompts(salt or f"{mode}-{round_}-{f'open-{rate:.3f}' if rate else 'closed'}")
    before = scrape(pod_urls)
    lock = threading.Lock()
    ttft: list[float] = []
    outcome = {"completed": 0, "failed": 0, "tokens": 0}

    def one(http: httpx.Client, n: int) -> None:
        index, question = workload.sequence[n]
        try:
            first, tokens = send(http, url, prompts[index], question)
        except (httpx.HTTPError, RuntimeError):
            with lock:
                outcome["failed"] += 1
            return
        with lock:
            outcome["completed"] += 1
            outcome["tokens"] += tokens
            if first is not None:
                ttft.append(first)

    next_index = iter(range(len(workload.sequence)))

    def closed_client() -> None:
        with httpx.Client(timeout=900) as http:
            while True:
                with lock:
                    n = next(next_index, None)
                if n is None:
                    return
                one(http, n)

    def open_client(n: int, at: float) -> None:
        time.sleep(max(0.0, at - time.monotonic()))
        with httpx.Client(timeout=900) as http:
            one(http, n)

    began = time.monotonic()
    if rate is None:
        threads = [threading.Thread(target=closed_client) for _ in range(workload.concurrency)]
    else:
        threads = [
            threading.Thread(target=open_client, args=(n, began + n / rate))
            for n in range(len(workload.sequence))
        ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - began
    after = scrape(pod_urls)
    queries = after["queries"] - before["queries"]
    hit_rate = (after["hits"] - before["hits"]) / queries if queries else 0.0
    result = Result(
        mode, round_, outcome["completed"], outcome["failed"], seconds, ttft, outcome["tokens"], hit_rate
    )
    result.rate = rate
    return result


def median_range(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def table(rows: list[dict[str, Any]]) -> str:
    """The curve, one line per load (the closed loop, then each arrival rate): each side's median over the
    rounds (picker / round-robin), and the median of the per-round throughput ratios with their range."""

    def side(load: str, mode: str, key: str) -> float | None:
        """The median over the rounds; None when no round has the value (no request of them succeeded)."""
        found = [r[key] for r in rows if r["load"] == load and r["mode"] == mode and r[key] is not None]
        return statistics.median(found) if found else None

    lines = [
        "| load | generated tokens/s, picker / round-robin | ratio (range over rounds) | TTFT p50 (s) | "
        "TTFT p99 (s) | prefix-cache hit rate | failed |",
        "|---|---|---|---|---|---|---|",
    ]
    loads = sorted({r["load"] for r in rows}, key=lambda load: (load != "closed", load_rate(load)))
    for load in loads:
        label = "closed loop (saturated)" if load == "closed" else f"arrivals {load.removeprefix('open ')}"
        ratios = []
        for round_ in sorted({r["round"] for r in rows if r["load"] == load}):
            found = {r["mode"]: r["tokens_per_s"] for r in rows if r["load"] == load and r["round"] == round_}
            if found.get("round-robin") and "picker" in found:
                ratios.append(found["picker"] / found["round-robin"])
        ratio = "n/a"
        if ratios:
            mid, low, high = median_range(ratios)
            ratio = f"**{mid:.2f}x** ({low:.2f}-{high:.2f})"

        def pair(key: str, fmt: str, load: str = load) -> str:
            shown = [side(load, mode, key) for mode in ("picker", "round-robin")]
            return " / ".join("none" if value is None else fmt.format(value) for value in shown)

        failed = sum(r["failed"] for r in rows if r["load"] == load)
        lines.append(
            f"| {label} | {pair('tokens_per_s', '{:.1f}')} | {ratio} | {pair('ttft_p50_s', '{:.2f}')} | "
            f"{pair('ttft_p99_s', '{:.2f}')} | {pair('prefix_hit_rate', '{:.0%}')} | {failed} |"
        )
    return "\n".join(lines)


def load_rate(load: str) -> float:
    """The arrival rate of a row's load ("open 2.50/s"); 0 for the closed loop."""
    return float(load.removeprefix("open ").removesuffix("/s")) if load.startswith("open") else 0.0


SWEEP = (0.5, 0.75, 1.0, 1.25, 1.5)  # arrival rates, as fractions of round-robin's closed-loop capacity
# --smoke-url's sizes (servers.smoke_options): seconds on the tiny model.
SMOKE = {
    "prompts": 2,
    "prompt_words": 40,
    "requests": 4,
    "sweep_requests": 2,
    "concurrency": 2,
    "warmup": 2,
    "rounds": 1,
    "out": ROOT / ".pagoda-dev" / "bench-routing-smoke.json",
}
# The report's part that belongs to the cluster's replicas (their KV cache sized for the prompts): a smoke run
# has no cluster.
REPLICA_KEYS = ("prompt_tokens", "kv_blocks_per_replica", "block_size", "max_num_seqs")


def measure(
    args: argparse.Namespace, workload: Workload, sweep: Workload, urls: dict[str, str], pod_urls: list[str]
) -> dict[str, Any]:
    """The warm-up, then per round the closed loop and the sweep of arrival rates through both sides (`urls`:
    mode -> URL), the order of the modes alternating; the report's measured part."""
    if args.warmup:
        warm = Workload(args.prompts, args.prompt_words, args.warmup, args.concurrency, seed=3)
        for mode, url in urls.items():
            result = run_mode(mode, -1, warm, url, pod_urls, salt=f"warm-up-{mode}")
            print(f"warm-up {mode}: {result.completed} done, {result.failed} failed", flush=True)
    load = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    rates: list[float] = args.rates or []
    for round_ in range(args.rounds):
        order = ["picker", "round-robin"] if round_ % 2 == 0 else ["round-robin", "picker"]
        closed: dict[str, float] = {}
        for mode in order:  # saturated: each side's capacity
            result = run_mode(mode, round_, workload, urls[mode], pod_urls)
            closed[mode] = result.completed / result.seconds
            rows.append(result.row())
            print(json.dumps(result.row()), flush=True)
        rates = rates or [round(f * closed["round-robin"], 2) for f in SWEEP]
        for rate in rates:
            for mode in order:
                result = run_mode(mode, round_, sweep, urls[mode], pod_urls, rate=rate)
                rows.append(result.row())
                print(json.dumps(result.row()), flush=True)
    return {
        "workload": {k: v for k, v in asdict(workload).items() if k != "sequence"},
        "sweep_requests": args.sweep_requests,
        "rates": rates,
        "load_average_at_start": load,
        "load_average_at_end": os.getloadavg()[0],
        "rows": rows,
    }


def write_report(args: argparse.Namespace, report: dict[str, Any], smoke: Smoke | None = None) -> None:
    if smoke:
        report["smoke"] = smoke.report()
        print(smoke.banner())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report["rows"]))
    print(f"Raw numbers in {args.out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=12, help="distinct system prompts (N)")
    parser.add_argument("--prompt-words", type=int, default=600, help="words per system prompt")
    parser.add_argument(
        "--requests", type=int, default=150, help="requests per closed loop (per mode, round)"
    )
    parser.add_argument("--sweep-requests", type=int, default=100, help="requests per arrival rate")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent clients (3 x 4 batch slots)")
    parser.add_argument(
        "--warmup", type=int, default=24, help="requests through each side first, not counted"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--rates",
        type=lambda text: [float(rate) for rate in text.split(",")],
        default=None,
        help="open-loop arrival rates, requests/s, comma-separated; default: "
        f"{', '.join(str(f) for f in SWEEP)} x round-robin's first closed-loop throughput",
    )
    parser.add_argument("--out", type=Path, default=ROOT / ".pagoda-dev" / "bench-routing.json")
    args = smoke_options(parser, SMOKE, argv)
    workload = Workload(args.prompts, args.prompt_words, args.requests, args.concurrency)
    sweep = Workload(args.prompts, args.prompt_words, args.sweep_requests, args.concurrency, seed=11)
    smoke = Smoke.of(args, dict.fromkeys(REPLICA_KEYS, "the replicas' KV cache: no cluster here"))
    if smoke:  # the given server is both sides and the one pod
        urls = {"picker": args.smoke_url, "round-robin": args.smoke_url}
        write_report(args, measure(args, workload, sweep, urls, [args.smoke_url]), smoke)
        return 0
    blocks, tokens = kv_blocks(workload)
    max_model_len = BLOCK_SIZE * ((tokens + 64) // BLOCK_SIZE + 2)
    print(
        f"System prompts: {args.prompts} x ~{tokens} tokens; KV cache per replica: {blocks} blocks "
        f"({blocks * BLOCK_SIZE} tokens, ~{blocks * BLOCK_SIZE / tokens:.1f} prompts)",
        flush=True,
    )

    cluster: Cluster = start_private(real_node=True)
    operator = gateway = None
    try:
        operator = run_operator(cluster, Path(tempfile.mkdtemp(prefix="bench-routing-")) / "operator.log")
        install_gateway_crds(cluster)
        cluster.kubectl("create", "namespace", NAMESPACE)
        _objects.wait_service_account(None, cluster.api_client(), NAMESPACE, time.monotonic() + 60)
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(bench_sample(blocks, max_model_len)))
        wait_condition(cluster, NAMESPACE, NAME, "Ready", timeout=1200)
        pods = ready_pods(cluster, NAMESPACE, NAME)
        pod_urls = sorted(f"http://{p['status']['podIP']}:{HTTP_PORT}" for p in pods)
        assert len(pod_urls) == REPLICAS, pod_urls
        addresses = sorted((p["status"]["podIP"], HTTP_PORT) for p in pods)
        gateway = start_gateway(cluster, NAME, NAMESPACE, round_robin=addresses)
        urls = {"picker": gateway.url, "round-robin": gateway.round_robin_url}
        measured = measure(args, workload, sweep, urls, pod_urls)
        replicas = {
            "prompt_tokens": tokens,
            "kv_blocks_per_replica": blocks,
            "block_size": BLOCK_SIZE,
            "max_num_seqs": MAX_NUM_SEQS,
        }
        # The keys in the order they always had: the workload, the replicas' settings, the measurements.
        report = {k: measured[k] for k in ("workload", "sweep_requests", "rates")} | replicas | measured
        write_report(args, report)
    finally:
        if gateway is not None:
            gateway.stop()
        if operator is not None:
            operator.stop()
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
