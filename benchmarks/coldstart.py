"""Cold start with and without the node model cache, side by side in one run, on the CPU engine.

    make bench-coldstart        (or: .venv/bin/python benchmarks/coldstart.py [--pairs N] [--rate-mbit R])

A random-weight Llama of about 1.1 GB (the runtime's tiny-model writer with larger shapes; kept under
~/.cache/pagoda/bench-models) is uploaded to MinIO, which runs in its own network namespace behind a veth
pair whose store side sends at --rate-mbit (default 1000, one stream from an object store in the region;
0: MinIO on loopback, no link): a download then costs what it costs between a node and its store.

Then pairs of `pagoda-runtime serve --model s3://...` starts, alternating which goes first:
- `first`: an empty cache folder, as the first replica on a node (or any replica with scope Pod) starts;
  the first of all fills the node's folder;
- `cached`: that node folder, as a second replica or a restart on the node starts with
  spec.model.cache.scope Node. vLLM's cache root is in the same folder, as in the pod.
Each start's phases are the runtime's own report (/v1/pagoda/capacity `startup`, what status.startup shows);
`wall` is process start -> first 200 on /v1/models. Prints the median and range per arm and the ratios of
the medians (first / cached); --json writes them. Needs root for the network namespace (`ip`, `tc`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from servers import BIN, ROOT, Server

sys.path.insert(0, str(ROOT))


from e2e.lab.minio import USER, MinioServer  # noqa: E402
from pagoda.runtime.models.modelinfo import SEED_ENV  # noqa: E402
from pagoda.runtime.tools.tinymodel import TinyModelSpec, make_tiny_model  # noqa: E402

# 283 M parameters in float32: 1.13 GB of weights.
MODEL = TinyModelSpec(hidden_size=1536, intermediate_size=4096, num_layers=10, num_heads=12, num_kv_heads=12)
MODELS_DIR = Path.home() / ".cache" / "pagoda" / "bench-models"
BUCKET, PREFIX = "models", "bench/llama-1g"
ENGINE_FLAGS = ["--max-model-len", "512", "--dtype", "float32", "--block-size", "32"]
STORE_ADDRESS, HOST_ADDRESS = "10.251.0.2", "10.251.0.1"
PHASES = ("imports", "modelFetch", "engineSetup", "weightLoad", "engineInit", "apiServer")


def model_folder(spec: TinyModelSpec) -> Path:
    """The benchmark's model, written once per shape."""
    key = f"h{spec.hidden_size}-i{spec.intermediate_size}-l{spec.num_layers}-s{spec.seed}"
    folder = MODELS_DIR / key
    if not (folder / "model.safetensors").is_file():
        partial = MODELS_DIR / f".{key}.partial"
        subprocess.run(["rm", "-rf", str(partial)], check=True)
        make_tiny_model(partial, spec)
        partial.rename(folder)
    return folder


def vllm_seed() -> Path:
    """vLLM's model-info answers, made once per vLLM version, as the runtime images carry them
    (runtime/models/modelinfo.py, PAGODA_VLLM_SEED_DIR): without them every first start would also pay for
    vLLM's architecture inspection, which a pod from the image does not."""
    if os.environ.get(SEED_ENV):  # tier 3 seeds once for its whole session
        return Path(os.environ[SEED_ENV])
    import vllm

    folder = MODELS_DIR / f"vllm-seed-{vllm.__version__}"
    if not (folder / "modelinfos").is_dir():
        partial = MODELS_DIR / f".{folder.name}.partial"
        subprocess.run(["rm", "-rf", str(partial)], check=True)
        subprocess.run([str(BIN / "pagoda-runtime"), "seed-model-info", str(partial)], check=True)
        partial.rename(folder)
    return folder


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


class StoreLink:
    """A network namespace for the store and a veth pair to it, its store side shaped to `rate_mbit`."""

    def __init__(self, rate_mbit: int) -> None:
        tag = f"{os.getpid() % 100000}"
        self.namespace, self.host_if, self.store_if = f"pagoda-bench-{tag}", f"pgbh{tag}", f"pgbs{tag}"
        run("ip", "netns", "add", self.namespace)
        try:
            run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.store_if)
            run("ip", "link", "set", self.store_if, "netns", self.namespace)
            run("ip", "addr", "add", f"{HOST_ADDRESS}/30", "dev", self.host_if)
            run("ip", "link", "set", self.host_if, "up")
            inside = ("ip", "netns", "exec", self.namespace)
            run(*inside, "ip", "addr", "add", f"{STORE_ADDRESS}/30", "dev", self.store_if)
            run(*inside, "ip", "link", "set", self.store_if, "up")
            run(*inside, "ip", "link", "set", "lo", "up")
            shape = ["tc", "qdisc", "add", "dev", self.store_if, "root", "tbf", "rate", f"{rate_mbit}mbit"]
            run(*inside, *shape, "burst", "1mb", "latency", "100ms")
        except BaseException:
            self.close()
            raise

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace]

    def close(self) -> None:
        subprocess.run(["ip", "netns", "del", self.namespace], check=False, capture_output=True)


def start(name: str, cache: Path, store: MinioServer, work: Path, port: int, seed: Path) -> dict[str, Any]:
    """One runtime start on `cache`; its phases, fetched bytes and wall time."""
    argv = [str(BIN / "pagoda-runtime"), "serve", "--model", f"s3://{BUCKET}/{PREFIX}"]
    argv += ["--served-model-name", "bench", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--cache-dir", str(cache), *ENGINE_FLAGS, "--", "--enforce-eager"]
    env = {
        "AWS_ACCESS_KEY_ID": USER,
        "AWS_SECRET_ACCESS_KEY": store.password,
        "AWS_ENDPOINT_URL": store.url,
        "VLLM_CACHE_ROOT": str(cache / "vllm"),  # in the cache folder, as the pod's environment puts it
        SEED_ENV: str(seed),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # as examples/tiny-cpu.yaml runs the engine
    }
    server = Server(name, argv, port, work, env=env)
    try:
        server.wait_ready(timeout=900)
        report = httpx.get(f"{server.url}/v1/pagoda/capacity", timeout=10).json()["startup"]
    finally:
        server.stop()
    return {
        "arm": name.split("-")[0],
        "wall": round(server.startup_s, 2),
        "seconds": report["seconds"],
        "fetchedBytes": report.get("fetchedBytes"),
        "phases": report["phases"],
    }


def summary(starts: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: median [min, max] of wall, the runtime's total and each phase; ratios first / cached."""
    result: dict[str, Any] = {}
    for arm in ("first", "cached"):
        mine = [s for s in starts if s["arm"] == arm]
        stats: dict[str, Any] = {}
        for key in ("wall", "seconds", *PHASES):
            values = [s[key] if key in ("wall", "seconds") else s["phases"].get(key, 0.0) for s in mine]
            stats[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        stats["fetchedBytes"] = sorted({s["fetchedBytes"] for s in mine})
        result[arm] = stats
    result["ratios"] = {
        key: round(result["first"][key]["median"] / max(result["cached"][key]["median"], 1e-3), 2)
        for key in ("wall", "seconds", "modelFetch")
    }
    return result


def table(result: dict[str, Any]) -> str:
    rows = ["| | first start (empty cache) | cached (node cache hit) | ratio |", "|---|---|---|---|"]
    for key in ("wall", "seconds", *PHASES):
        cells = []
        for arm in ("first", "cached"):
            s = result[arm][key]
            cells.append(f"{s['median']:.2f} s [{s['min']:.2f}-{s['max']:.2f}]")
        ratio = result["ratios"].get(key)
        rows.append(f"| {key} | {cells[0]} | {cells[1]} | {f'{ratio}x' if ratio else ''} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="first/cached pairs (default 3)")
    parser.add_argument("--rate-mbit", type=int, default=1000, help="the store link's rate; 0: loopback")
    parser.add_argument("--json", type=Path, help="write the starts and the summary there")
    parser.add_argument(
        "--smoke", action="store_true", help="the 12 MB tiny model instead (tier 3 runs it with --pairs 1)"
    )
    parser.add_argument(
        "--bin", type=Path, default=Path(os.environ.get("PAGODA_BIN", ROOT / ".pagoda-dev/bin"))
    )
    opts = parser.parse_args()
    if opts.pairs < 1 or opts.rate_mbit < 0:
        parser.error("--pairs must be at least 1 and --rate-mbit at least 0")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers and MinIO, drop the link
    folder, seed = model_folder(TinyModelSpec() if opts.smoke else MODEL), vllm_seed()
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    work = Path(
        subprocess.run(
            ["mktemp", "-d", "/tmp/pagoda-coldstart-XXXX"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    with ExitStack() as stack:
        store_kwargs: dict[str, Any] = {}
        if opts.rate_mbit:
            link = StoreLink(opts.rate_mbit)
            stack.callback(link.close)
            store_kwargs = {"host": STORE_ADDRESS, "wrapper": link.prefix}
        store = stack.enter_context(MinioServer(work / "minio", opts.bin, **store_kwargs).start())
        sent = store.upload(BUCKET, PREFIX, folder)
        print(
            f"model: {size / 1e9:.2f} GB ({sent} bytes uploaded); store link: "
            + (f"{opts.rate_mbit} Mbit/s" if opts.rate_mbit else "loopback"),
            flush=True,
        )
        shared = work / "node-cache"
        starts = []
        for i in range(opts.pairs):
            order = ("first", "cached") if i % 2 == 0 else ("cached", "first")
            for arm in order:
                # The node's first start fills the shared folder; later first starts get folders of their own.
                cache = shared if arm == "cached" or i == 0 else work / f"pod-cache-{i}"
                found = start(f"{arm}-{i}", cache, store, work, 18602, seed)
                print(json.dumps(found), flush=True)
                starts.append(found)
                if cache != shared:
                    subprocess.run(["rm", "-rf", str(cache)], check=True)
    subprocess.run(["rm", "-rf", str(work)], check=False)
    result = summary(starts)
    print(table(result))
    print(json.dumps(result["ratios"]))
    if opts.json:
        opts.json.write_text(
            json.dumps({"modelBytes": size, "rateMbit": opts.rate_mbit, "starts": starts, **result}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
