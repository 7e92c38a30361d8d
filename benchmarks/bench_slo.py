"""Goodput at the SLO: the engine settings `pagoda-runtime profile --tune-engine` chooses vs vLLM's defaults.

    make bench-slo    (or: .venv/bin/python benchmarks/bench_slo.py [--shapes a,b] [--rounds 3] [--json F])

For each request shape and SLO of SHAPES (the tiny model on this machine's CPU engine):

1. **Tune**: `pagoda-runtime profile --tune-engine` with the shape's flags (vLLM's defaults for the batch
   settings): the candidates it profiled (each a server of its own, runtime/profiling/tune.py), their capacity
   and goodput (requests/s at the highest concurrency step that meets the SLO), and its choice.
2. **Side by side**: `--rounds` rounds, each one `pagoda-runtime profile` of a server with vLLM's defaults and
   one of a server with the chosen settings, the order alternating between rounds; the goodput ratio of each
   round, and its median and range. A choice of "the defaults" is measured the same way (a ratio near 1).

Every server runs the CPU engine as examples/tiny-cpu.yaml does (one engine thread, nobind, a 1 GiB KV
cache, the model in the EngineCore); GuideLLM (`make guidellm`, as many workers as cores) loads it. Prints a
markdown table and writes the numbers to .pagoda-dev/bench-slo.json (--json).

Smoke run (`make test`, tier 3: `--smoke`): one shape of small requests, two 2-second steps, at most three
servers in the tune (the defaults, one candidate and, when it beats them, the defaults again) and no
side-by-side round: it checks that the tune runs end to end and the report is whole, not what it chooses.
The smoke's SLO (`--smoke-slo-ttft-ms`, `--smoke-slo-itl-ms`) must be met by one stream and missed by 64
on the machine at hand, or no objective binds and no candidate is tried: tier 3 measures one stream first and
passes a multiple of it (tests/runtime/test_rt_profile.py), since a fixed SLO is met on one machine and
missed on a slower one. Its server runs four requests at a time, so 64 streams queue and miss it whatever the
machine's speed (without the queue, 64 streams measured only 3.2 times one stream's time to first token on a
busy machine, and met an SLO of 4 times it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from servers import BIN, ROOT, prepare, write_report

GUIDELLM = Path(os.environ.get("PAGODA_GUIDELLM", ROOT / ".pagoda-dev" / "guidellm" / "bin" / "guidellm"))
ENGINE_FLAGS = ["--dtype", "float32", "--max-model-len", "1024", "--block-size", "32"]
VLLM_ONLY = ["--enforce-eager"]
# examples/tiny-cpu.yaml's engine environment: one engine thread, in the EngineCore (docs/benchmarks.md).
CPU_ENV = {
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "OMP_NUM_THREADS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
PROFILE_TIMEOUT_S = 3600

# name -> the request shape, the SLO (p95, ms), the concurrency steps and what the shape is for.
SHAPES: dict[str, dict[str, Any]] = {
    "short-prompts": {
        "prompt": 256,
        "output": 64,
        "ttft_ms": 500,
        "itl_ms": 30,
        "streams": "1,2,4,8,16,32",
        "step_seconds": 8,
        "about": "short prompts, a tight time to first token",
    },
    "long-prompts": {
        "prompt": 896,
        "output": 64,
        "ttft_ms": 2000,
        "itl_ms": 25,
        "streams": "1,2,4,8,16,32",
        "step_seconds": 8,
        "about": "long prompts, a tight inter-token latency",
    },
}
SMOKE_SHAPE = {
    "prompt": 24,
    "output": 32,
    "ttft_ms": 100,
    "itl_ms": 10,
    "streams": "1,64",
    "step_seconds": 2,
    # Four requests at a time, so that 60 of the 64 streams queue: their time to first token is many
    # requests long on any machine, and the SLO that one stream meets, 64 miss.
    "flags": ["--max-num-seqs", "4"],
    "about": "smoke: small requests, one stream then 64 (4 at a time)",
}


def profile(model: Path, shape: dict[str, Any], port: int, out: Path, flags: list[str]) -> dict[str, Any]:
    """One `pagoda-runtime profile` (its own server on `port`) with `flags` added; its JSON result."""
    argv = [
        str(BIN / "pagoda-runtime"),
        "profile",
        "--model",
        f"file://{model}",
        "--served-model-name",
        "tiny",
    ]
    argv += ["--host", "127.0.0.1", "--port", str(port), *ENGINE_FLAGS, "--guidellm", str(GUIDELLM)]
    argv += ["--slo-ttft-ms", str(shape["ttft_ms"]), "--slo-itl-ms", str(shape["itl_ms"])]
    argv += ["--prompt-tokens", str(shape["prompt"]), "--output-tokens", str(shape["output"])]
    argv += ["--streams", shape["streams"], "--step-seconds", str(shape["step_seconds"])]
    argv += [*shape.get("flags", []), "--result", str(out), *flags, "--", *VLLM_ONLY]
    env = dict(os.environ, **CPU_ENV, HF_HUB_OFFLINE="1", TMPDIR=str(out.parent))
    started = time.monotonic()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, timeout=PROFILE_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the profile exited {done.returncode}: {out.read_text(errors='replace')[:2000]}")
    result: dict[str, Any] = json.loads(out.read_text())
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def chosen_flags(engine: dict[str, Any]) -> list[str]:
    """The serve flags of the tune's choice (none: it kept the defaults)."""
    flags: list[str] = []
    if engine["maxNumBatchedTokens"] is not None:
        flags += ["--max-num-batched-tokens", str(engine["maxNumBatchedTokens"])]
    if engine["maxNumSeqs"] is not None:
        flags += ["--max-num-seqs", str(engine["maxNumSeqs"])]
    return flags


def goodput(result: dict[str, Any]) -> float:
    """Requests/s at the SLO; 0 when no step met it."""
    return float(result["requestsPerSecond"] or 0.0)


def bench_shape(name: str, shape: dict[str, Any], model: Path, work: Path, opts: argparse.Namespace) -> dict:
    print(f"== {name}: {shape['about']}", file=sys.stderr, flush=True)
    tune_flags = ["--tune-engine"] + (
        ["--tune-max-runs", str(opts.tune_max_runs)] if opts.tune_max_runs else []
    )
    tuned = profile(model, shape, opts.port, work / f"{name}-tune.json", tune_flags)
    engine = tuned["engine"]
    flags = chosen_flags(engine)
    print(
        f"   tuned in {tuned['seconds']} s: {flags or 'the defaults'} {engine}", file=sys.stderr, flush=True
    )
    rounds = []
    for index in range(opts.rounds):
        sides = {"defaults": [], "chosen": flags}
        order = list(sides) if index % 2 == 0 else list(reversed(sides))
        measured = {}
        for side in order:
            out = work / f"{name}-{index}-{side}.json"
            measured[side] = profile(model, shape, opts.port, out, sides[side])
        row = {
            side: {
                "goodput": goodput(measured[side]),
                "concurrency": measured[side]["concurrency"],
                "steps": measured[side]["steps"],
            }
            for side in sides
        }
        base = row["defaults"]["goodput"]
        row["ratio"] = round(row["chosen"]["goodput"] / base, 3) if base else None
        row["first"] = order[0]
        rounds.append(row)
        print(f"   round {index}: {row['ratio']} ({base} -> {row['chosen']['goodput']})", file=sys.stderr)
    ratios = [r["ratio"] for r in rounds if r["ratio"] is not None]
    return {
        "shape": shape,
        "tune": {"engine": engine, "seconds": tuned["seconds"], "steps": tuned["steps"]},
        "chosen_flags": flags,
        "rounds": rounds,
        "ratio_median": statistics.median(ratios) if ratios else None,
        "ratio_range": [min(ratios), max(ratios)] if ratios else None,
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| shape | SLO (TTFT / ITL p95) | tune: goodput defaults -> chosen (req/s) | chosen | "
        "side by side: goodput ratio, median [range] (rounds) |",
        "|---|---|---|---|---|",
    ]
    for name, r in results.items():
        shape, engine = r["shape"], r["tune"]["engine"]
        ratio = "-"
        if r["ratio_median"] is not None:
            low, high = r["ratio_range"]
            ratio = f"{r['ratio_median']:.2f}x [{low:.2f}-{high:.2f}] ({len(r['rounds'])})"
            if not r["chosen_flags"]:  # the defaults against themselves: how far two runs differ here
                ratio += ", both sides the defaults: the noise"
        lines.append(
            f"| {name}: {shape['prompt']}/{shape['output']} tokens "
            f"| {shape['ttft_ms']} / {shape['itl_ms']} ms | "
            f"{engine['baselineGoodput']} -> {engine['goodput']} ({len(engine['candidates'])} servers) | "
            f"{' '.join(r['chosen_flags']) or 'the defaults'} | {ratio} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--rounds", type=int, default=3, help="side-by-side rounds per shape")
    parser.add_argument(
        "--tune-max-runs", type=int, help="servers the tune profiles at most (the runtime's default)"
    )
    parser.add_argument("--port", type=int, default=18310, help="the servers' port (one at a time)")
    parser.add_argument("--json", type=Path, default=ROOT / ".pagoda-dev" / "bench-slo.json")
    parser.add_argument("--smoke", action="store_true", help="the tier-3 smoke run (see the docstring)")
    parser.add_argument(
        "--smoke-slo-ttft-ms",
        type=float,
        default=SMOKE_SHAPE["ttft_ms"],
        help="the smoke's time-to-first-token objective, p95 (default: %(default)s)",
    )
    parser.add_argument(
        "--smoke-slo-itl-ms",
        type=float,
        default=SMOKE_SHAPE["itl_ms"],
        help="the smoke's inter-token latency objective, p95 (default: %(default)s)",
    )
    opts = parser.parse_args(argv)
    if opts.smoke:
        if opts.smoke_slo_ttft_ms <= 0 or opts.smoke_slo_itl_ms <= 0:
            parser.error("--smoke-slo-ttft-ms and --smoke-slo-itl-ms must be greater than 0")
        shapes = {
            "smoke": {**SMOKE_SHAPE, "ttft_ms": opts.smoke_slo_ttft_ms, "itl_ms": opts.smoke_slo_itl_ms}
        }
        opts.rounds, opts.tune_max_runs = 0, 3
    else:
        unknown = [s for s in opts.shapes.split(",") if s not in SHAPES]
        if unknown:
            parser.error(f"--shapes: unknown {', '.join(unknown)} (known: {', '.join(SHAPES)})")
        shapes = {s: SHAPES[s] for s in opts.shapes.split(",")}
    if not GUIDELLM.is_file():
        parser.error(f"{GUIDELLM} is missing: run `make guidellm`")
    work, model = prepare("bench-slo-")
    started = time.monotonic()
    results = {name: bench_shape(name, shape, model, work, opts) for name, shape in shapes.items()}
    report = {
        "smoke": opts.smoke,
        "rounds": opts.rounds,
        "seconds": round(time.monotonic() - started, 1),
        "load_average": os.getloadavg(),
        "shapes": results,
    }
    write_report(opts.json, report, table(results))
    subprocess.run(["rm", "-rf", str(work)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
