"""Starts `pagoda-runtime serve` as a subprocess on a free loopback port, as production does."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

VENV_BIN = Path(sys.executable).parent
RUNTIME = str(VENV_BIN / "pagoda-runtime")
START_TIMEOUT_S = 420.0
ENGINE_FLAGS = ["--max-model-len", "2048", "--max-num-seqs", "4", "--dtype", "float32"]
VLLM_EXTRA = ["--enforce-eager"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def runtime_env(workdir: Path, **extra: str) -> dict[str, str]:
    tmp = workdir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        TMPDIR=str(tmp),
        VLLM_CACHE_ROOT=str(workdir / "vllm-cache"),
        VLLM_NO_USAGE_STATS="1",
        HF_HUB_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        PYTHONUNBUFFERED="1",
    )
    env.pop("PAGODA_API_KEY", None)
    env.update(extra)
    return env


def wait_for(check: Callable[[], Any], timeout: float, interval: float = 0.1, what: str = "condition") -> Any:
    """Polls `check` until it returns something truthy; bounded by `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


@dataclass
class RuntimeProcess:
    model: str
    workdir: Path
    flags: list[str] = field(default_factory=lambda: list(ENGINE_FLAGS))
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    # What the probes answered while the model loaded: (livez, readyz, /v1/models status, retry-after).
    loading_observation: tuple[int, int, int, str | None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "runtime.log"

    def start(self) -> RuntimeProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [RUNTIME, "serve", "--model", self.model, "--served-model-name", "tiny", "--host", "127.0.0.1"]
        args += ["--port", str(self.port), "--cache-dir", str(self.workdir / "cache"), *self.flags]
        args += ["--", *VLLM_EXTRA]
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=runtime_env(self.workdir, **self.extra_env)
        )
        return self

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=10, **kwargs)

    def _probe(self) -> tuple[int, int, int, str | None] | None:
        try:
            live = self.get("/livez").status_code
            ready = self.get("/readyz").status_code
            models = self.get("/v1/models")
        except httpx.TransportError:
            return None
        return live, ready, models.status_code, models.headers.get("retry-after")

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> RuntimeProcess:
        def check() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"runtime exited rc={self.proc.returncode}:\n{self.log_tail()}")
            seen = self._probe()
            if seen and seen[1] != 200 and self.loading_observation is None:
                self.loading_observation = seen
            return bool(seen and seen[1] == 200)

        try:
            wait_for(check, timeout, interval=0.2, what="/readyz 200")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.log_tail()}") from None
        return self

    def children(self) -> list[psutil.Process]:
        assert self.proc is not None
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, wait; SIGKILL the process and any leftover children if it does not exit."""
        if self.proc is None:
            return 0
        kids = self.children()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(timeout=10)
        for kid in kids:
            try:
                kid.kill()
            except psutil.NoSuchProcess:
                pass
        return rc
