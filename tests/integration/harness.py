"""The operator as a subprocess (as in production) and polling helpers for integration tests."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from e2e.fixtures import wait_for

REPO = Path(__file__).resolve().parents[2]
RESYNC_SECONDS = 5
SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class OperatorProcess:
    """`pagoda-operator` as a child process, with its metrics endpoint and log file."""

    def __init__(
        self, kubeconfig: Path, workdir: Path, resync_seconds: float = RESYNC_SECONDS, workers: int = 4
    ) -> None:
        self.kubeconfig = kubeconfig
        self.resync_seconds = resync_seconds
        self.workers = workers
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "operator-0.log"
        self.starts = 0

    def start(self) -> None:
        exe = Path(sys.executable).with_name("pagoda-operator")
        self.log_path = self.workdir / f"operator-{self.starts}.log"
        self.starts += 1
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    str(exe),
                    "--kubeconfig",
                    str(self.kubeconfig),
                    "--metrics-host",
                    "127.0.0.1",
                    "--metrics-port",
                    str(self.port),
                    "--resync-seconds",
                    str(self.resync_seconds),
                    "--workers",
                    str(self.workers),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        wait_for(self.healthy, "the operator's /healthz", timeout=60)

    def kill(self) -> None:
        """SIGKILL, like a crashed or evicted pod: no clean shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"The operator exited; its log:\n{self.log()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[tuple[str, str], float]:
        """Every sample: (name, raw label string) -> value."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        samples: dict[tuple[str, str], float] = {}
        for line in text.splitlines():
            match = SAMPLE_LINE.match(line)
            if match:
                samples[(match.group(1), match.group(2) or "")] = float(match.group(3))
        return samples

    def total(self, name: str, **labels: str) -> float:
        want = [f'{key}="{value}"' for key, value in labels.items()]
        return sum(
            value
            for (sample, raw), value in self.metrics().items()
            if sample == name and all(w in raw for w in want)
        )

    def writes(self) -> float:
        return self.total("pagoda_operator_api_writes_total")

    def resyncs(self) -> int:
        return self.log().count("Queued resync")


def wait_until(probe: Any, what: str, timeout: float = 60.0) -> Any:
    """Polls `probe` until truthy (no fixed sleeps); returns its value or fails naming `what`."""
    return wait_for(probe, what, timeout=timeout, interval=0.25)
