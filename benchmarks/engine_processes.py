"""vLLM's process model on the CPU backend, side by side in one run, on the tiny local model:

- "worker process": vLLM's CPU default. The platform runs the model in a worker process beside the
  EngineCore (to set up OpenMP thread binding), so a runtime is three processes: API server, EngineCore,
  worker; the EngineCore and the worker wait on each other in a spin loop.
- "in EngineCore": VLLM_ENABLE_V1_MULTIPROCESSING=0 (what examples/tiny-cpu.yaml sets). The model runs in
  the EngineCore, as vLLM does on one GPU; the runtime's AsyncLLM keeps the EngineCore a process of its own.
- "in EngineCore, model info seeded": the same, with vLLM's model-registry answers copied from a seed made
  once (`pagoda-runtime seed-model-info`, what the runtime images carry: runtime/models/modelinfo.py) instead
  of inspected in a new Python process at each start.

    make bench-engine             (or: .venv/bin/python benchmarks/engine_processes.py [--rounds N])

Each round starts one runtime of each kind, alternating which goes first, each with its own TMPDIR and
vLLM cache (as a pod with a new cache volume), with the sample's CPU settings (thread binding off, one
OpenMP thread). Per server: seconds from process start to the first 200 on /v1/models, the CPU seconds its
process tree spent until then, and, under 12 concurrent streams of 32 tokens (the autoscaling scenario's
load), generated tokens per second and the cores its process tree kept busy. Prints a markdown table and
writes the raw numbers to .pagoda-dev/bench-engine.json (--json).

Smoke run (`make test`, tier 3): `--smoke-url URL [--smoke-pid PID]` starts no server and measures the running
server at URL as every kind, 1 round of 4 streams x 8 tokens: tokens/s, and with its PID its process tree's
processes and busy cores; start-up and its CPU seconds are not measured (the server was running), and every
ratio compares that server with itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
from runtime_vs_vllm import VLLM_ONLY, throughput
from servers import ALREADY_RUNNING, BIN, ROOT, Given, Server, Smoke, prepare, process_tree, smoke_options

sys.path.insert(0, str(ROOT))
from e2e.lab.processes import sample_engine_env  # noqa: E402

# examples/tiny-cpu.yaml's engine settings, read where the tests read them; the kinds differ only in where
# the model runs, the sample's VLLM_ENABLE_V1_MULTIPROCESSING.
ENGINE_CORE_VAR = "VLLM_ENABLE_V1_MULTIPROCESSING"
SAMPLE_ENV = {k: v for k, v in sample_engine_env().items() if k != ENGINE_CORE_VAR}
IN_ENGINE_CORE = {ENGINE_CORE_VAR: sample_engine_env()[ENGINE_CORE_VAR]}
SEEDED = "in EngineCore, model info seeded"  # its PAGODA_VLLM_SEED_DIR is set in main()
KINDS: dict[str, dict[str, str]] = {
    "worker process": {},
    "in EngineCore": IN_ENGINE_CORE,
    SEEDED: IN_ENGINE_CORE,
}
FLAGS = ["--max-model-len", "512", "--max-num-seqs", "8", "--dtype", "float32", "--block-size", "32"]
# --smoke-url's sizes (servers.smoke_options): seconds on the tiny model.
SMOKE = {"rounds": 1, "streams": 4, "tokens": 8, "json": ROOT / ".pagoda-dev" / "bench-engine-smoke.json"}
TREE = "the server's process tree"
LABELS = {
    "processes": "processes",
    "startup_s": "start-up to ready (s)",
    "startup_cpu_s": "CPU seconds until ready",
    "tokens_per_s": "generated tokens/s, {streams} streams",
    "cores_under_load": "cores busy under that load",
}


def cpu_seconds(server: Server | Given) -> float:
    """CPU seconds of the server's process tree so far: live processes, and the children it reaped."""
    tree = process_tree(server.pid)
    reaped = tree[0].cpu_times()
    total = reaped.children_user + reaped.children_system
    for proc in tree:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def start(name: str, env: dict[str, str], model: Path, port: int, work: Path) -> Server:
    argv = [str(BIN / "pagoda-runtime"), "serve", "--model", f"file://{model}", "--served-model-name", "tiny"]
    argv += ["--host", "127.0.0.1", "--port", str(port), *FLAGS, "--", *VLLM_ONLY]
    return Server(name, argv, port, work, env={**SAMPLE_ENV, **env})


def measure(server: Server | Given, streams: int = 12, tokens: int = 32) -> dict[str, float]:
    """Start-up (a server started here), then `streams` x `tokens` under load: tokens/s, and the process
    tree's busy cores and processes (when its PID is known); stops the server."""
    found: dict[str, float] = {}
    try:
        server.wait_ready()
        if server.startup_s is not None:
            found |= {"startup_s": server.startup_s, "startup_cpu_s": cpu_seconds(server)}
        asyncio.run(throughput(server, 4, 8))  # warm-up
        before = cpu_seconds(server) if server.pid is not None else 0.0
        began = time.perf_counter()
        found["tokens_per_s"] = asyncio.run(throughput(server, streams, tokens))
        if server.pid is not None:
            found["cores_under_load"] = (cpu_seconds(server) - before) / (time.perf_counter() - began)
            found["processes"] = len(process_tree(server.pid))
    finally:
        server.stop()
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=12, help="concurrent streams under load")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per stream")
    parser.add_argument(
        "--json", type=Path, default=ROOT / ".pagoda-dev" / "bench-engine.json", help="the raw numbers"
    )
    opts = smoke_options(parser, SMOKE)
    started = dict.fromkeys(["startup_s", "startup_cpu_s"], ALREADY_RUNNING)
    smoke = Smoke.of(opts, started, dict.fromkeys(["processes", "cores_under_load"], TREE))
    if smoke is None:
        work, model = prepare("pagoda-bench-engine-")
        seed = work / "vllm-seed"  # what the runtime images carry (runtime/models/modelinfo.py)
        seeding = [str(BIN / "pagoda-runtime"), "seed-model-info", str(seed)]
        subprocess.run(seeding, check=True, stdout=subprocess.DEVNULL)
        KINDS[SEEDED] = {**IN_ENGINE_CORE, "PAGODA_VLLM_SEED_DIR": str(seed)}
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    port = 18430
    for i in range(opts.rounds):
        for kind in list(KINDS) if i % 2 == 0 else list(KINDS)[::-1]:
            port += 1
            name = f"{kind.replace(' ', '-')}-{i}"
            if smoke:  # the given server as every kind
                server: Server | Given = Given(name, opts.smoke_url, opts.smoke_pid)
            else:
                server = start(name, KINDS[kind], model, port, work)
            results[kind].append(measure(server, opts.streams, opts.tokens))
            print(kind, results[kind][-1], flush=True)
    out = opts.json
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results | ({"smoke": smoke.report()} if smoke else {}), indent=1))

    def median(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in results[kind])

    base, *others = KINDS
    if smoke:
        print(smoke.banner())
    print(f"\n| median of {opts.rounds} | {base} | " + " | ".join(f"{k} | ratio" for k in others) + " |")
    print("|---|---|" + "---|---|" * len(others))
    for key, label in LABELS.items():
        label = label.format(streams=opts.streams)
        if smoke and key in smoke.not_measured:
            print("| " + " | ".join([label, "not measured", *["not measured", ""] * len(others)]) + " |")
            continue
        a = median(base, key)
        cells = " | ".join(f"{median(k, key):.2f} | {median(k, key) / a:.2f}x" for k in others)
        print(f"| {label} | {a:.2f} | {cells} |")
    print(f"\nRaw numbers: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
