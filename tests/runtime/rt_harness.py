"""Starts `pagoda-runtime serve` as a subprocess on a free loopback port, as production does."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from e2e.lab.processes import VENV_BIN, ManagedProcess, WaitTimeout, free_port, runtime_env, wait_until

__all__ = ["CHAT_TEMPLATE_MARKER", "RUNTIME", "RuntimeProcess", "wait_until"]

RUNTIME = str(VENV_BIN / "pagoda-runtime")
START_TIMEOUT_S = 420.0
ENGINE_FLAGS = ["--max-model-len", "2048", "--max-num-seqs", "4", "--dtype", "float32"]
VLLM_EXTRA = ["--enforce-eager"]
# The first line of the shared server's chat template (--chat-template, what the operator passes for
# spec.engine.chatTemplate): the tiny model's own template follows it, so the chat tests see the same role
# markers, and a test sees that the engine renders the flag's template rather than the model's.
CHAT_TEMPLATE_MARKER = "[pagoda chat template]"


@dataclass
class RuntimeProcess(ManagedProcess):
    """`pagoda-runtime serve` on `model`; its output in workdir/runtime.log."""

    model: str
    workdir: Path
    flags: list[str] = field(default_factory=lambda: list(ENGINE_FLAGS))
    extra_env: dict[str, str] = field(default_factory=dict)
    vllm_extra: list[str] = field(default_factory=lambda: list(VLLM_EXTRA))  # after `--`
    port: int = field(default_factory=free_port)
    # What the probes answered while the model loaded: (livez, readyz, /v1/models status, retry-after).
    loading_observation: tuple[int, int, int, str | None] | None = None

    name = "pagoda-runtime"
    STOP_GRACE = 60.0
    LOG_NAME = "runtime.log"

    def start(self) -> RuntimeProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [RUNTIME, "serve", "--model", self.model, "--served-model-name", "tiny", "--host", "127.0.0.1"]
        args += ["--port", str(self.port), "--cache-dir", str(self.workdir / "cache"), *self.flags]
        args += ["--", *self.vllm_extra]
        self.launch(args, env=runtime_env(self.workdir, **self.extra_env))
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
            self.check_alive()
            seen = self._probe()
            if seen and seen[1] != 200 and self.loading_observation is None:
                self.loading_observation = seen
            return bool(seen and seen[1] == 200)

        try:
            wait_until(check, "/readyz 200", timeout=timeout, interval=0.2)
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}\n{self.log_tail()}") from None
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

    def terminate(self, timeout: float = 60.0) -> int | None:
        """Stops it (SIGTERM, then SIGKILL after `timeout`), then SIGKILLs any leftover engine children."""
        kids = self.children() if self.proc is not None else []
        rc = self.stop(timeout)
        for kid in kids:
            try:
                kid.kill()
            except psutil.NoSuchProcess:
                pass
        return rc
