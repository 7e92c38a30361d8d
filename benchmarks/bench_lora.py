"""N LoRA adapters on one base model vs the same adapters merged into N separate deployments, in one run.

    make bench-lora    (or: .venv/bin/python benchmarks/bench_lora.py [--adapters 3] [--rounds 6] ...)

1. Makes the tiny model (`pagoda-runtime make-tiny-model`), N adapters (`make-tiny-adapter`, seeds 1..N,
   rank 8) and, per adapter, a merged model: a copy of the tiny model with each adapted weight replaced by
   W + (lora_alpha / r) * B @ A, which is what the adapter adds to that layer's output, folded in.
2. LoRA side: one `pagoda-runtime serve --lora a1=... --lora aN=...` (--max-loras N, so all N share a batch).
   Merged side: N `pagoda-runtime serve`, one per merged model, served as a1..aN, started at once. Every
   runtime runs the CPU engine with `VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_CPU_KVCACHE_SPACE=1` and one
   engine thread (`OMP_NUM_THREADS=1`), as examples/tiny-cpu.yaml; `--lora-threads` gives the LoRA runtime
   more (on 2 shared cores, 2 threads were slower than one: docs/benchmarks.md).
3. Checks that each adapter's greedy completion is the same on both sides (the merge is right).
4. Paired rounds, alternating which side goes first: `--requests` streamed completions of `--tokens` tokens
   (ignore_eos), `--concurrency` at a time, spread round-robin over the N model names; requests/s, tokens/s
   and TTFT (pooled over the rounds). Then TTFT one request at a time.
5. Memory: the sum over each side's serving processes (each runtime and its children: vLLM's API server and
   engine core) of RSS and of USS (private pages, which another process's mappings do not change), the
   largest of the samples taken after the warm-up and after each round.
Prints a markdown table with the ratios and the machine's load average, and writes the raw numbers to
.pagoda-dev/bench-lora.json (--json).

Smoke run (`make test`, tier 3): `--smoke-url URL [--smoke-pid PID]` makes nothing and starts no server: the
running server at URL is both sides, its adapters (the models it lists with a parent; its base model when it
has none) the N names; 1 round of 4 requests x 4 tokens, 2 at a time, then 2 TTFT requests. Not measured: the
greedy check (one server on both sides proves nothing), start-up (it was running), and without its PID its
memory; every ratio compares that server with itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from servers import ALREADY_RUNNING, BIN, ROOT, Given, Server, Smoke, smoke_options

ENGINE_FLAGS = ["--max-model-len", "2048", "--dtype", "float32"]
VLLM_ONLY = ["--enforce-eager"]
CPU_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1"}
PEFT_PREFIX = "base_model.model."
MiB = 1024 * 1024
# --smoke-url's sizes (servers.smoke_options): seconds on the tiny model.
SMOKE = {
    "rounds": 1,
    "requests": 4,
    "concurrency": 2,
    "tokens": 4,
    "ttft_requests": 2,
    "json": ROOT / ".pagoda-dev" / "bench-lora-smoke.json",
}
TREES = "the servers' process trees"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def merge_adapter(model: Path, adapter: Path, out: Path) -> Path:
    """A copy of `model` with the LoRA adapter folded into its weights: W' = W + (alpha / r) * B @ A for
    each adapted linear layer (PEFT's merge for a plain LoRA: no DoRA, no rsLoRA, no rank_pattern)."""
    from safetensors.torch import load_file, save_file

    config = json.loads((adapter / "adapter_config.json").read_text())
    if config.get("use_dora") or config.get("use_rslora") or config.get("rank_pattern"):
        raise ValueError(f"{adapter}: only plain LoRA adapters are merged here")
    scale = float(config["lora_alpha"]) / float(config["r"])
    lora = load_file(str(adapter / "adapter_model.safetensors"))
    shutil.copytree(model, out)
    merged = 0
    for file in sorted(out.glob("*.safetensors")):
        weights = load_file(str(file))
        for key, a in lora.items():
            if not key.endswith(".lora_A.weight"):
                continue
            target = key.removeprefix(PEFT_PREFIX).removesuffix(".lora_A.weight") + ".weight"
            if target in weights:
                b = lora[key.replace(".lora_A.", ".lora_B.")]
                w = weights[target]
                weights[target] = (w.double() + scale * (b.double() @ a.double())).to(w.dtype)
                merged += 1
        save_file(weights, str(file), metadata={"format": "pt"})
    if merged != sum(1 for k in lora if k.endswith(".lora_A.weight")):
        raise ValueError(f"{adapter}: merged {merged} layers, the adapter has more")
    return out


class Side:
    """The servers of one setup and the URL for each model name."""

    def __init__(self, name: str, servers: list[Server | Given], routes: dict[str, str]) -> None:
        self.name, self.servers, self.routes = name, servers, routes
        self.rss = self.uss = 0
        self.memory_known = all(s.pid is not None for s in servers)  # not: a given server without its PID

    def sample_memory(self) -> None:
        if not self.memory_known:
            return
        rss, uss = (sum(m) for m in zip(*(s.memory() for s in self.servers), strict=True))
        self.rss, self.uss = max(self.rss, rss), max(self.uss, uss)


class LoadAverage:
    """The 1-minute load average, sampled every 2 s (mean, max)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(float(Path("/proc/loadavg").read_text().split()[0]))
            self._stop.wait(2)

    def result(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return {"mean": round(statistics.mean(self.samples), 2), "max": max(self.samples)}


async def stream_one(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[float, int]:
    """(seconds to the first token, tokens streamed) for one streamed completion."""
    start, first, tokens = time.perf_counter(), 0.0, 0
    async with client.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or []
            if choices and choices[0].get("text"):
                tokens += 1
                if not first:
                    first = time.perf_counter() - start
    return first, tokens


async def load_round(
    side: Side, names: list[str], requests: int, concurrency: int, tokens: int
) -> dict[str, Any]:
    """`requests` streamed completions, round-robin over the names, `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, i: int) -> tuple[float, int]:
        name = names[i % len(names)]
        body = {"model": name, "prompt": f"Request {i}:", "max_tokens": tokens, "ignore_eos": True}
        async with gate:
            return await stream_one(client, side.routes[name], body | {"temperature": 0})

    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(one(client, i) for i in range(requests)))
        wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "requests_per_s": requests / wall,
        "tokens_per_s": sum(t for _, t in results) / wall,
        "ttft": [first for first, _ in results],
    }


async def sequential_ttfts(side: Side, names: list[str], n: int) -> list[float]:
    out = []
    async with httpx.AsyncClient(timeout=120) as client:
        for i in range(n):
            name = names[i % len(names)]
            body = {"model": name, "prompt": f"Question {i}:", "max_tokens": 4, "temperature": 0}
            out.append((await stream_one(client, side.routes[name], body))[0])
    return out


def greedy(side: Side, name: str) -> str:
    body = {"model": name, "prompt": "def main():", "max_tokens": 16, "temperature": 0}
    reply = httpx.post(side.routes[name] + "/v1/completions", json=body, timeout=120)
    reply.raise_for_status()
    return str(reply.json()["choices"][0]["text"])


def make_models(work: Path, n: int) -> tuple[Path, dict[str, Path], dict[str, Path]]:
    """The tiny model, N adapters (a1..aN) and each merged into a copy of the model."""
    model = work / "tiny"
    tool = str(BIN / "pagoda-runtime")
    subprocess.run([tool, "make-tiny-model", str(model)], check=True, capture_output=True)
    names = [f"a{i}" for i in range(1, n + 1)]
    adapters, merged = {}, {}
    for i, name in enumerate(names, 1):
        adapters[name] = work / "adapters" / name
        argv = [
            tool,
            "make-tiny-adapter",
            "--model",
            str(model),
            "--out",
            str(adapters[name]),
            "--seed",
            str(i),
        ]
        subprocess.run(argv, check=True, capture_output=True)
        merged[name] = merge_adapter(model, adapters[name], work / "merged" / name)
    return model, adapters, merged


def start_sides(
    work: Path,
    model: Path,
    adapters: dict[str, Path],
    merged: dict[str, Path],
    lora_threads: int,
    servers: list[Server],
) -> tuple[list[Side], dict[str, float]]:
    """The LoRA runtime and the N merged ones, ready (each in `servers` once started); their start-up."""
    names, n, tool = list(adapters), len(adapters), str(BIN / "pagoda-runtime")

    def serve(model_dir: Path, served: str, port: int, *flags: str) -> list[str]:
        head = [tool, "serve", "--model", f"file://{model_dir}", "--served-model-name", served]
        return [*head, "--host", "127.0.0.1", "--port", str(port), *ENGINE_FLAGS, *flags, "--", *VLLM_ONLY]

    lora_flags = [f for name in names for f in ("--lora", f"{name}=file://{adapters[name]}")]
    lora_flags += ["--max-loras", str(n), "--max-cpu-loras", str(n), "--max-lora-rank", "8"]
    env = CPU_ENV | {"OMP_NUM_THREADS": str(lora_threads)}
    one = Server("lora", serve(model, "tiny", 18411, *lora_flags), 18411, work, env)
    servers.append(one)
    one.wait_ready(timeout=600)
    sep = []
    for i, name in enumerate(names):
        port = 18412 + i
        env = CPU_ENV | {"OMP_NUM_THREADS": "1"}
        sep.append(Server(f"merged-{name}", serve(merged[name], name, port), port, work, env))
        servers.append(sep[-1])
    started = time.monotonic()
    for s in sep:
        s.wait_ready(timeout=600)
    merged_startup = time.monotonic() - started
    sides = [
        Side("lora", [one], {name: one.url for name in names}),
        Side("merged", list(sep), {name: s.url for name, s in zip(names, sep, strict=True)}),
    ]
    return sides, {"lora": round(one.startup_s or 0.0, 1), "merged": round(merged_startup, 1)}


def given_sides(url: str, pid: int | None) -> tuple[list[str], list[Side]]:
    """A smoke run's names (the given server's adapters: the models it lists with a parent; its base model
    when it has none) and its sides, both that server."""
    models = httpx.get(url + "/v1/models", timeout=30).json()["data"]
    names = [m["id"] for m in models if m.get("parent")] or [m["id"] for m in models]
    servers = {side: Given(side, url, pid) for side in ("lora", "merged")}
    return names, [
        Side(side, [server], {name: server.url for name in names}) for side, server in servers.items()
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=int, default=3, help="N adapters (and N merged runtimes)")
    parser.add_argument("--rounds", type=int, default=6, help="paired load rounds")
    parser.add_argument("--requests", type=int, default=96, help="requests per round and side")
    parser.add_argument("--concurrency", type=int, default=12, help="streams at a time per side")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per request")
    parser.add_argument("--ttft-requests", type=int, default=15, help="sequential TTFT requests per side")
    parser.add_argument("--lora-threads", type=int, default=1, help="engine threads of the LoRA runtime")
    parser.add_argument(
        "--json", type=Path, default=ROOT / ".pagoda-dev" / "bench-lora.json", help="the raw numbers"
    )
    opts = smoke_options(parser, SMOKE)
    left_out = {
        "greedy_same": "both sides are the one given server",
        "startup_s": ALREADY_RUNNING,
        "lora_threads": "the given server's own setting",
    }
    smoke = Smoke.of(opts, left_out, dict.fromkeys(["rss_mib", "uss_mib"], TREES))
    lora_threads = opts.lora_threads
    if smoke is None:
        work = Path(tempfile.mkdtemp(prefix="pagoda-bench-lora-"))
        model, adapters, merged = make_models(work, opts.adapters)
        names = list(adapters)
    servers: list[Server] = []
    load = LoadAverage()
    try:
        if smoke is None:
            sides, startup = start_sides(work, model, adapters, merged, lora_threads, servers)
            same = {name: greedy(sides[0], name) == greedy(sides[1], name) for name in names}
        else:
            names, sides = given_sides(opts.smoke_url, opts.smoke_pid)
        n = len(names)
        for side in sides:  # warm-up
            asyncio.run(load_round(side, names, 2 * n, n, 8))
            side.sample_memory()
        rounds: dict[str, list[dict[str, Any]]] = {side.name: [] for side in sides}
        for r in range(opts.rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                rounds[side.name].append(
                    asyncio.run(load_round(side, names, opts.requests, opts.concurrency, opts.tokens))
                )
                side.sample_memory()
        seq = {side.name: asyncio.run(sequential_ttfts(side, names, opts.ttft_requests)) for side in sides}
    finally:
        for s in servers:
            s.stop()
        load_average = load.result()

    summary: dict[str, Any] = {
        "adapters": n,
        "lora_threads": lora_threads,
        "requests_per_round": opts.requests,
        "concurrency": opts.concurrency,
        "tokens": opts.tokens,
        "load_average": load_average,
    }
    if smoke is None:
        summary |= {"greedy_same": same, "startup_s": startup}
    else:
        summary |= {"names": names, "smoke": smoke.report()}
        del summary["lora_threads"]
    for side in sides:
        runs = rounds[side.name]
        memory = (
            {"rss_mib": round(side.rss / MiB), "uss_mib": round(side.uss / MiB)} if side.memory_known else {}
        )
        summary[side.name] = memory | {
            "requests_per_s": round(statistics.median(x["requests_per_s"] for x in runs), 2),
            "tokens_per_s": round(statistics.median(x["tokens_per_s"] for x in runs), 1),
            "ttft_p50_ms": round(1000 * pct([t for x in runs for t in x["ttft"]], 0.5), 1),
            "ttft_p50_sequential_ms": round(1000 * pct(seq[side.name], 0.5), 1),
            "tokens_per_s_rounds": [round(x["tokens_per_s"], 1) for x in runs],
        }
    a, b = summary["lora"], summary["merged"]
    tput = statistics.median(
        x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(rounds["lora"], rounds["merged"], strict=True)
    )
    memory_ratios = {}
    if "rss_mib" in a and "rss_mib" in b:
        memory_ratios = {
            "rss": round(a["rss_mib"] / b["rss_mib"], 3),
            "uss": round(a["uss_mib"] / b["uss_mib"], 3),
        }
    summary["ratios"] = memory_ratios | {
        "throughput": round(tput, 3),
        "ttft_p50": round(a["ttft_p50_ms"] / b["ttft_p50_ms"], 3),
        "ttft_p50_sequential": round(a["ttft_p50_sequential_ms"] / b["ttft_p50_sequential_ms"], 3),
    }
    out = opts.json
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    ratios = summary["ratios"]
    if smoke:
        print(smoke.banner())
        checked = "not checked (one server on both sides)"
    else:
        checked = f"{sum(same.values())}/{n}"
    print(f"\n{n} adapters, load average {load_average['mean']} (max {load_average['max']}), ", end="")
    print(f"greedy completions identical on both sides: {checked}\n")
    print(f"| metric | 1 runtime, {n} LoRA adapters | {n} runtimes, merged models | LoRA / merged |")
    print("|---|---|---|---|")
    if memory_ratios:
        print(f"| RSS, sum of process trees (MiB) | {a['rss_mib']} | {b['rss_mib']} | {ratios['rss']:.3f} |")
        print(f"| USS, private memory (MiB) | {a['uss_mib']} | {b['uss_mib']} | {ratios['uss']:.3f} |")
    else:
        print("| RSS and USS, sum of process trees (MiB) | not measured | not measured | |")
    rps = a["requests_per_s"] / b["requests_per_s"]
    what = f"requests/s (median of {opts.rounds})"
    print(f"| {what} | {a['requests_per_s']} | {b['requests_per_s']} | {rps:.3f} |")
    what = f"generated tokens/s (median of {opts.rounds})"
    print(f"| {what} | {a['tokens_per_s']} | {b['tokens_per_s']} | {tput:.3f} (median of paired rounds) |")
    print(
        f"| TTFT p50 under load (ms) | {a['ttft_p50_ms']} | {b['ttft_p50_ms']} | {ratios['ttft_p50']:.3f} |"
    )
    seq_a, seq_b = a["ttft_p50_sequential_ms"], b["ttft_p50_sequential_ms"]
    print(f"| TTFT p50, one at a time (ms) | {seq_a} | {seq_b} | {ratios['ttft_p50_sequential']:.3f} |")
    if smoke is None:
        st = summary["startup_s"]
        print(f"| start-up to ready (s) | {st['lora']} | {st['merged']} (all {n} at once) | |")
    else:
        print("| start-up to ready (s) | not measured | not measured | |")
    print(f"| tokens/s per round | {a['tokens_per_s_rounds']} | {b['tokens_per_s_rounds']} | |")
    print(f"\nRaw numbers: {out}")
    if smoke is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
