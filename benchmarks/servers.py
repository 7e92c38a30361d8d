"""What the benchmarks share (they run as scripts, so their folder is on sys.path and they import this as
`servers`): the repository's root (ROOT, for their imports of e2e and tests and their output files), and a
runtime (or plain vLLM) server started by a benchmark: its own TMPDIR and vLLM cache, so that no server
starts on another's warm cache; ready at its first 200 on /v1/models (runtime_vs_vllm.py, bench_lora.py and
engine_processes.py).

Their smoke runs (`make test`, tier 3: tests/runtime/test_rt_bench_smoke.py) share the rest: `--smoke-url URL`
(`smoke_options`) measures a server that is already running (`Given`) on every side instead of starting
servers, with the smallest sizes, through the same measuring, statistics and report code as the full run; what
only servers of the benchmark's own can show (start-up, a second kind of server) is left out and named in the
output (`Smoke`), never filled in."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's bin: pagoda-runtime and its Python
ALREADY_RUNNING = "the server was already running"  # why a smoke run measures no start-up


def prepare(prefix: str, warm: bool = True) -> tuple[Path, Path]:
    """A new work folder and the tiny model in it (`pagoda-runtime make-tiny-model`), with vLLM's and torch's
    files read once (`warm`: a run that starts servers), so that the first server timed does not pay for a
    cold page cache."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    model = work / "tiny"
    subprocess.run([str(BIN / "pagoda-runtime"), "make-tiny-model", str(model)], check=True)
    if warm:
        subprocess.run([sys.executable, "-c", "import vllm.entrypoints.openai.api_server"], check=True)
    return work, model


def process_tree(pid: int) -> list[psutil.Process]:
    """The process `pid` and all its descendants (a server: its API server, EngineCore and workers)."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def tree_memory(pid: int) -> tuple[int, int]:
    """(RSS, USS) in bytes, summed over the process tree from `pid`."""
    rss = uss = 0
    for proc in process_tree(pid):
        try:
            info = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss, uss = rss + info.rss, uss + info.uss
    return rss, uss


class Server:
    def __init__(
        self, name: str, argv: list[str], port: int, workdir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name, self.port, self.url = name, port, f"http://127.0.0.1:{port}"
        workdir = workdir / name
        workdir.mkdir()
        full = dict(os.environ, TMPDIR=str(workdir), VLLM_CACHE_ROOT=str(workdir / "vc"), HF_HUB_OFFLINE="1")
        full.setdefault("VLLM_NO_USAGE_STATS", "1")
        full.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        full.update(env or {})
        self.log = (workdir / f"{name}.log").open("wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=full)
        self.startup_s: float | None = 0.0

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def wait_ready(self, timeout: float = 300) -> None:
        """Until the first 200 on /v1/models (startup_s: seconds from process start)."""
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited rc={self.proc.returncode}; see {self.log.name}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=2).status_code == 200:
                    self.startup_s = time.monotonic() - self.started
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready after {timeout}s")

    def memory(self) -> tuple[int, int]:
        """(RSS, USS) in bytes, summed over the server's process tree."""
        return tree_memory(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Given:
    """A server that a smoke run was given (--smoke-url), standing in for one side's server under that side's
    name: not started here, so no start-up time (None); its process tree (memory, CPU seconds) only when its
    PID was given too (--smoke-pid); not stopped here."""

    def __init__(self, name: str, url: str, pid: int | None) -> None:
        self.name, self.url, self.pid = name, url, pid
        self.startup_s: float | None = None

    def wait_ready(self, timeout: float = 300) -> None:
        httpx.get(self.url + "/v1/models", timeout=timeout).raise_for_status()

    def memory(self) -> tuple[int, int]:
        if self.pid is None:
            raise ValueError(f"{self.name}: no PID given (--smoke-pid), so no process tree to measure")
        return tree_memory(self.pid)

    def stop(self) -> None:
        """Not this benchmark's to stop."""


def smoke_options(
    parser: argparse.ArgumentParser, sizes: dict[str, object], argv: list[str] | None = None
) -> argparse.Namespace:
    """Adds --smoke-url and --smoke-pid to a benchmark's flags and parses them: with --smoke-url, `sizes` (the
    smallest run, and a JSON path of its own so that a smoke run does not overwrite the full run's numbers)
    become the defaults; flags given still win."""
    group = parser.add_argument_group("smoke run (make test, tier 3)")
    group.add_argument(
        "--smoke-url",
        metavar="URL",
        help="start no server: measure the running server at URL (OpenAI API, model 'tiny') on every side, "
        "with the smallest sizes; what needs servers of the benchmark's own is left out, named in the output",
    )
    group.add_argument(
        "--smoke-pid",
        type=int,
        metavar="PID",
        help="that server's process: its process tree's memory and CPU seconds are measured too",
    )
    opts, _ = parser.parse_known_args(argv)
    if opts.smoke_url:
        parser.set_defaults(**sizes)
    opts = parser.parse_args(argv)
    opts.smoke_url = opts.smoke_url and opts.smoke_url.rstrip("/")  # the benchmarks add "/v1/..."
    return opts


class Smoke:
    """Where a smoke run measured and what it left out (`not_measured`: key -> why), for its JSON report and
    the banner over its printed table."""

    def __init__(self, opts: argparse.Namespace, not_measured: dict[str, str]) -> None:
        self.url, self.pid = opts.smoke_url, opts.smoke_pid
        self.not_measured = dict(not_measured)

    @classmethod
    def of(
        cls, opts: argparse.Namespace, left_out: dict[str, str], tree: dict[str, str] | None = None
    ) -> Smoke | None:
        """None without --smoke-url (a full run); else `left_out` always, and `tree` (what needs the server's
        process tree) when no PID was given."""
        if not opts.smoke_url:
            return None
        no_pid = {key: f"{why}: no --smoke-pid" for key, why in (tree or {}).items()}
        return cls(opts, left_out | ({} if opts.smoke_pid else no_pid))

    def report(self) -> dict[str, object]:
        return {
            "url": self.url,
            "pid": self.pid,
            "every_side": "the given server, so every ratio compares it with itself",
            "not_measured": self.not_measured,
        }

    def banner(self) -> str:
        left = "; ".join(f"{key} ({why})" for key, why in self.not_measured.items())
        return (
            f"SMOKE RUN against {self.url}: every side is that one server (every ratio compares it with "
            f"itself); not measured: {left or 'nothing'}"
        )


def write_report(path: Path, numbers: dict[str, Any], table: str) -> None:
    """A benchmark's end: its raw numbers (with their `seconds`) to `path` as JSON; its table printed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(numbers, indent=1))
    print(table)
    print(f"\n{numbers['seconds']} s; raw numbers in {path}")
