"""Pagoda runtime vs plain vLLM server, side by side in one run, on the tiny local model (CPU engine).

    make bench-runtime            (or: .venv/bin/python benchmarks/runtime_vs_vllm.py [--rounds N])

1. Starts `pagoda-runtime serve` and then `python -m vllm.entrypoints.openai.api_server` with the same
   engine flags, each with its own TMPDIR and vLLM cache; each timed from process start to its first 200
   on /v1/models. The first start pays for a cold page cache, so the fair start-up pair is the plain
   server vs the third server below (both started beside one idle server).
2. Alternates paired rounds between the two (A/B, B/A, ..., so load from other work hits both alike):
   throughput = 32 concurrent streams of 64 tokens; TTFT = sequential streamed requests, first token. The
   TTFT overhead is per round, Pagoda's p50 minus plain vLLM's (same model and load, back to back), and the
   headline is the median of the rounds' differences with their range: pooled p50s let one slow stretch on
   one side decide the sign.
3. Prefix caching: a third server (Pagoda, --no-enable-prefix-caching) vs the first (caching on), both
   sent a shared ~1,000-token system prompt with short distinct questions; TTFT p50 ratio.
Prints a markdown table and writes the raw numbers to .pagoda-dev/bench-runtime.json (--json).

Smoke run (`make test`, tier 3): `--smoke-url URL` starts no server and measures the running server at URL as
all three, 1 round of 4 streams x 8 tokens, 2 TTFT requests, 2 chat requests on a ~200-token system prompt;
start-up is not measured (the server was running) and every ratio compares that server with itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
from servers import ALREADY_RUNNING, BIN, ROOT, Given, Server, Smoke, prepare, smoke_options

from pagoda.runtime.serving.engine import DYNAMO_DISABLE_ENV

ENGINE_FLAGS = ["--max-model-len", "4096", "--dtype", "float32"]
VLLM_ONLY = ["--enforce-eager"]
# What the runtime sets for its own CPU engine (engine.apply_env_defaults), given to the plain server too, so
# that the two engines run the same code and the difference is the serving layer: without it, the plain
# server would compile vLLM's torch.compile'd sampler helpers with inductor where the runtime runs them
# eagerly.
PLAIN_ENV = {DYNAMO_DISABLE_ENV: "1"}
# --smoke-url's sizes (servers.smoke_options): seconds on the tiny model.
SMOKE = {
    "rounds": 1,
    "ttft_requests": 2,
    "streams": 4,
    "tokens": 8,
    "prefix_requests": 2,
    "prompt_tokens": 200,
    "json": ROOT / ".pagoda-dev" / "bench-runtime-smoke.json",
}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def stream_one(client: httpx.AsyncClient, url: str, body: dict[str, object]) -> tuple[float, int]:
    """(seconds to the first token, tokens streamed) for one streamed completion."""
    start, first, tokens = time.perf_counter(), 0.0, 0
    async with client.stream("POST", url, json={**body, "stream": True}) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            text = (choices[0].get("text") or choices[0].get("delta", {}).get("content")) if choices else None
            if text:
                tokens += 1
                if not first:
                    first = time.perf_counter() - start
    return first, tokens


async def throughput(server: Server | Given, streams: int = 32, tokens: int = 64) -> float:
    body = {
        "model": "tiny",
        "prompt": "Benchmark",
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    async with httpx.AsyncClient(timeout=300) as client:
        start = time.perf_counter()
        results = await asyncio.gather(
            *(stream_one(client, server.url + "/v1/completions", body) for _ in range(streams))
        )
        wall = time.perf_counter() - start
    return sum(t for _, t in results) / wall


async def ttfts(
    server: Server | Given, n: int, messages: list[list[dict[str, str]]] | None = None
) -> list[float]:
    out = []
    async with httpx.AsyncClient(timeout=120) as client:
        for i in range(n):
            if messages is None:
                body: dict[str, object] = {"model": "tiny", "prompt": f"Question {i}:", "max_tokens": 4}
                url = server.url + "/v1/completions"
            else:
                body = {"model": "tiny", "messages": messages[i % len(messages)], "max_tokens": 4}
                url = server.url + "/v1/chat/completions"
            first, _ = await stream_one(client, url, body)
            out.append(first)
    return out


def system_prompt(model_dir: Path, target_tokens: int = 1000) -> str:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    source = (Path(json.__file__).parent / "decoder.py").read_text()
    words = source.split()
    text = ""
    for n in range(50, len(words), 25):
        text = " ".join(words[:n])
        if len(tokenizer.encode(text).ids) >= target_tokens:
            break
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--ttft-requests", type=int, default=25)
    parser.add_argument("--streams", type=int, default=32, help="concurrent streams of a throughput round")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per stream")
    parser.add_argument("--prefix-requests", type=int, default=20, help="chat requests per prefix-cache side")
    parser.add_argument("--prompt-tokens", type=int, default=1000, help="the shared system prompt's length")
    parser.add_argument(
        "--json", type=Path, default=ROOT / ".pagoda-dev" / "bench-runtime.json", help="the raw numbers"
    )
    opts = smoke_options(parser, SMOKE)
    smoke = Smoke.of(opts, {"startup_s": ALREADY_RUNNING})
    # The tiny model's tokenizer sizes the system prompt; a smoke run starts no server, so no warm-up either.
    work, model = prepare("pagoda-bench-", warm=smoke is None)

    def pagoda(port: int, *flags: str) -> list[str]:
        head = [str(BIN / "pagoda-runtime"), "serve", "--model", f"file://{model}", "--served-model-name"]
        return [
            *head,
            "tiny",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *ENGINE_FLAGS,
            *flags,
            "--",
            *VLLM_ONLY,
        ]

    plain_argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    plain_argv += ["--served-model-name", "tiny", "--host", "127.0.0.1", "--port", "18402", *ENGINE_FLAGS]
    plain_argv += [*VLLM_ONLY, "--disable-uvicorn-access-log"]
    argvs = {
        "pagoda": (pagoda(18401, "--enable-prefix-caching"), 18401),
        "vllm": (plain_argv, 18402),
        "pagoda-nocache": (pagoda(18403, "--no-enable-prefix-caching"), 18403),
    }
    servers: list[Server | Given] = []

    def start(name: str) -> Server | Given:
        """The side's server, ready: started here, or in a smoke run the given one under the side's name."""
        env = PLAIN_ENV if name == "vllm" else None
        server = (
            Given(name, opts.smoke_url, opts.smoke_pid) if smoke else Server(name, *argvs[name], work, env)
        )
        servers.append(server)
        server.wait_ready()
        return server

    try:
        a = start("pagoda")
        b = start("vllm")
        results: dict[str, dict[str, list[float]]] = {
            s.name: {"tps": [], "ttft": [], "ttft_p50": []} for s in (a, b)
        }
        for s in (a, b):  # warm-up
            asyncio.run(throughput(s, 8, 16))
        for i in range(opts.rounds):  # paired rounds, alternating which server goes first
            for s in (a, b) if i % 2 == 0 else (b, a):
                results[s.name]["tps"].append(asyncio.run(throughput(s, opts.streams, opts.tokens)))
            for s in (a, b) if i % 2 == 0 else (b, a):
                measured = asyncio.run(ttfts(s, opts.ttft_requests))
                results[s.name]["ttft"] += measured
                results[s.name]["ttft_p50"].append(pct(measured, 0.5))
        b.stop()
        c = start("pagoda-nocache")
        shared = system_prompt(model, opts.prompt_tokens)
        chats = [[{"role": "system", "content": shared}, {"role": "user", "content": f"Question {i}?"}]
                 for i in range(opts.prefix_requests)]  # fmt: skip
        prefix = {}
        for s in (a, c):
            asyncio.run(ttfts(s, 2, chats))  # the first request fills the cache
            prefix[s.name] = asyncio.run(ttfts(s, opts.prefix_requests, chats))
    finally:
        for s in servers:
            s.stop()

    summary = {
        "startup_s": {s.name: round(s.startup_s, 1) for s in servers if s.startup_s is not None},
        "throughput_tok_s": {k: round(statistics.median(v["tps"]), 1) for k, v in results.items()},
        "ttft_p50_ms": {k: round(1000 * pct(v["ttft"], 0.5), 2) for k, v in results.items()},
        "ttft_p99_ms": {k: round(1000 * pct(v["ttft"], 0.99), 2) for k, v in results.items()},
        "prefix_ttft_p50_ms": {k: round(1000 * pct(v, 0.5), 2) for k, v in prefix.items()},
        "throughput_rounds_tok_s": {k: [round(x, 1) for x in v["tps"]] for k, v in results.items()},
        "ttft_p50_rounds_ms": {k: [round(1000 * x, 2) for x in v["ttft_p50"]] for k, v in results.items()},
    }
    # Per paired round, Pagoda's TTFT p50 minus plain vLLM's; the headline is their median, with the range.
    diffs = [
        1000 * (x - y)
        for x, y in zip(results["pagoda"]["ttft_p50"], results["vllm"]["ttft_p50"], strict=True)
    ]
    overhead = {
        "rounds": [round(d, 2) for d in diffs],
        "median": round(statistics.median(diffs), 2),
        "min": round(min(diffs), 2),
        "max": round(max(diffs), 2),
    }
    summary["ttft_p50_overhead_ms"] = overhead
    t, p50, p99 = summary["throughput_tok_s"], summary["ttft_p50_ms"], summary["ttft_p99_ms"]
    pre = summary["prefix_ttft_p50_ms"]
    # The median of per-round ratios: each pair ran back to back, so load from elsewhere mostly cancels.
    ratio = statistics.median(
        x / y for x, y in zip(results["pagoda"]["tps"], results["vllm"]["tps"], strict=True)
    )
    cache_ratio = pre["pagoda"] / pre["pagoda-nocache"]
    summary["ratios"] = {"throughput": round(ratio, 3), "prefix_cache_ttft": round(cache_ratio, 3)}
    if smoke:
        summary["smoke"] = smoke.report()
        print(smoke.banner())
    out = opts.json
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print("| metric | Pagoda runtime | plain vLLM | Pagoda / vLLM |")
    print("|---|---|---|---|")
    name = f"throughput, {opts.streams} streams x {opts.tokens} tokens (tok/s, median of {opts.rounds})"
    print(f"| {name} | {t['pagoda']} | {t['vllm']} | {ratio:.3f}x (median of paired rounds) |")
    rounds = summary["throughput_rounds_tok_s"]
    print(f"| throughput per round (tok/s) | {rounds['pagoda']} | {rounds['vllm']} | |")
    span = f"{overhead['min']:+.2f} to {overhead['max']:+.2f}"
    print(
        f"| TTFT p50 (ms, rounds pooled) | {p50['pagoda']} | {p50['vllm']} | {overhead['median']:+.2f} ms "
        f"(median of {opts.rounds} paired rounds' differences; range {span}) |"
    )
    print(f"| TTFT p99 (ms) | {p99['pagoda']} | {p99['vllm']} | {p99['pagoda'] - p99['vllm']:+.2f} ms |")
    st = summary["startup_s"]
    if st:
        # The first start of a run reads vLLM's worker-side files cold; the plain server and the third server
        # (Pagoda, caching off) both start with one idle server beside them and a warm page cache.
        warm = st["pagoda-nocache"]
        print(f"| start-up to ready (s), warm | {warm} | {st['vllm']} | {warm - st['vllm']:+.1f} s |")
        print(f"| start-up to ready (s), first of the run (cold) | {st['pagoda']} | | |")
    else:
        print("| start-up to ready (s) | not measured | not measured | |")
    print(f"\nTTFT p50 per paired round ({opts.ttft_requests} sequential requests a side):\n")
    print("| round | Pagoda (ms) | plain vLLM (ms) | Pagoda - vLLM (ms) |")
    print("|---|---|---|---|")
    rounds_ms = summary["ttft_p50_rounds_ms"]
    for n, (x, y, d) in enumerate(zip(rounds_ms["pagoda"], rounds_ms["vllm"], diffs, strict=True), 1):
        print(f"| {n} | {x} | {y} | {d:+.2f} |")
    print(f"| median (range) | | | **{overhead['median']:+.2f}** ({span}) |")
    on, off = pre["pagoda"], pre["pagoda-nocache"]
    what = f"~{opts.prompt_tokens:,}-token shared system prompt"
    print(f"\nPrefix caching, {what}, TTFT p50: on {on} ms, off {off} ms, ", end="")
    print(f"ratio {cache_ratio:.2f} ({(1 - cache_ratio) * 100:.0f}% lower)")
    print(f"\nRaw numbers: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
