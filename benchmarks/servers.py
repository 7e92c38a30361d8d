"""What the benchmarks share (they run as scripts, so their folder is on sys.path and they import this as
`servers`): the repository's root (ROOT, for their imports of e2e and tests and their output files), and a
runtime (or plain vLLM) server started by a benchmark: its own TMPDIR and vLLM cache, so that no server
starts on another's warm cache; ready at its first 200 on /v1/models (runtime_vs_vllm.py, bench_lora.py and
engine_processes.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's bin: pagoda-runtime and its Python


def prepare(prefix: str) -> tuple[Path, Path]:
    """A new work folder and the tiny model in it (`pagoda-runtime make-tiny-model`), with vLLM's and torch's
    files read once, so that the first server timed does not pay for a cold page cache."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    model = work / "tiny"
    subprocess.run([str(BIN / "pagoda-runtime"), "make-tiny-model", str(model)], check=True)
    subprocess.run([sys.executable, "-c", "import vllm.entrypoints.openai.api_server"], check=True)
    return work, model


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
        self.startup_s = 0.0

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
        import psutil

        root = psutil.Process(self.proc.pid)
        rss = uss = 0
        for proc in [root, *root.children(recursive=True)]:
            try:
                info = proc.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            rss, uss = rss + info.rss, uss + info.uss
        return rss, uss

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
