"""Child processes for the tests, the demo and the tools: free loopback ports, polling without fixed sleeps,
a process with its output in a log file (awaited on an HTTP endpoint, stopped by PID), `pagoda-operator`,
and the environment of a `pagoda-runtime` subprocess.

Used by tests/integration, tests/runtime, e2e and e2e/demo.py, so that there is one way to do each."""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

import yaml

T = TypeVar("T")
VENV_BIN = Path(sys.executable).parent
SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


class WaitTimeout(AssertionError):
    """`wait_until` ran out of time."""


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (held open together so that they differ)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def wait_until(
    probe: Callable[[], T | None],
    what: str,
    timeout: float = 60.0,
    interval: float = 0.25,
    *,
    alive: Callable[[], object] | None = None,
    tail: Callable[[], str] | None = None,
    error: type[Exception] = WaitTimeout,
) -> T:
    """Polls `probe` until it returns a truthy value, which is returned: the harness's one poller.

    `alive`, called before each try, raises when a process the wait depends on has exited, so the wait fails
    at once instead of at its deadline. On timeout raises `error` naming `what`, with `tail()` (the end of a
    log) appended."""
    deadline = time.monotonic() + timeout
    while True:
        if alive is not None:
            alive()
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            said = f"\n{tail()}" if tail is not None else ""
            raise error(f"Timed out after {max(timeout, 0):.0f}s waiting for {what}.{said}")
        time.sleep(interval)


def http_ok(url: str, timeout: float = 2, context: ssl.SSLContext | None = None) -> bool:
    """Whether `url` answers 200 (False while nothing listens, or on any other status); `context` for
    https:// with a private CA or a client certificate."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def terminate(proc: subprocess.Popen[bytes], grace: float) -> int:
    """SIGTERM to a process this one started, then SIGKILL if it has not exited after `grace` seconds;
    returns its exit code (negative: the signal that ended it)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode


SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny-cpu.yaml"


def sample_engine_env() -> dict[str, str]:
    """spec.runtime.env of examples/tiny-cpu.yaml: the CPU engine's settings its pods run with (the model in
    vLLM's EngineCore process, as on one GPU; one unpinned OpenMP thread; a 1 GiB KV cache)."""
    spec = yaml.safe_load(SAMPLE.read_text())["spec"]
    return {item["name"]: str(item["value"]) for item in spec["runtime"]["env"]}


def runtime_env(workdir: Path, **extra: str) -> dict[str, str]:
    """The environment of a `pagoda-runtime` subprocess: the sample's engine settings (`sample_engine_env`),
    private temp and vLLM cache dirs under `workdir`, offline, no usage stats, no API key; `extra` goes on
    top."""
    tmp = workdir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(sample_engine_env())
    env.update(
        TMPDIR=str(tmp),
        VLLM_CACHE_ROOT=str(workdir / "vllm-cache"),
        VLLM_NO_USAGE_STATS="1",
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    env.pop("PAGODA_API_KEY", None)
    env.update(extra)
    return env


class ManagedProcess:
    """A child process with its output in `log_path`: launched, awaited on an HTTP URL, stopped by PID
    (SIGTERM, then SIGKILL after `STOP_GRACE` seconds). A context manager that stops it on exit."""

    name = "process"
    STOP_GRACE = 30.0
    LOG_NAME = "process.log"
    port: int  # where it listens on loopback, for those that do
    workdir: Path  # set by the dataclass subclasses, whose log is workdir/LOG_NAME

    def __init__(self, log_path: Path, name: str | None = None) -> None:
        self.log_path = log_path
        self.name = name or self.name
        self.proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        """For dataclass subclasses (their own __init__ does not call this class')."""
        ManagedProcess.__init__(self, self.workdir / self.LOG_NAME)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self, args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def check_alive(self) -> None:
        """Fails at once, with the end of the log, when the process is not running."""
        if self.proc is None or self.proc.poll() is not None:
            rc = None if self.proc is None else self.proc.returncode
            raise AssertionError(f"{self.name} is not running (rc={rc}); its log:\n{self.log()[-4000:]}")

    def answers(self, url: str) -> bool:
        self.check_alive()
        return http_ok(url)

    def wait_answers(self, url: str, what: str, timeout: float, interval: float = 0.25) -> None:
        wait_until(lambda: self.answers(url), what, timeout=timeout, interval=interval)

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM, wait; SIGKILL if it has not exited in time. Returns the exit code (None: not started)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        return terminate(proc, self.STOP_GRACE if timeout is None else timeout)

    def kill(self) -> None:
        """SIGKILL, like a crashed or evicted pod: no clean shutdown."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


class OperatorMetrics:
    """Reading `pagoda-operator`'s /metrics at `url`: as a child process (OperatorProcess) or a pod
    (e2e/chartenv.py ChartOperator)."""

    @property
    def url(self) -> str:
        raise NotImplementedError

    def metrics(self) -> dict[tuple[str, str], float]:
        """Every sample: (name, raw label string) -> value."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as response:
            text = response.read().decode()
        samples: dict[tuple[str, str], float] = {}
        for line in text.splitlines():
            match = SAMPLE_LINE.match(line)
            if match:
                samples[(match.group(1), match.group(2) or "")] = float(match.group(3))
        return samples

    def total(self, name: str, **labels: str) -> float:
        """The sum of metric `name`'s samples that carry all of `labels`."""
        want = [f'{key}="{value}"' for key, value in labels.items()]
        return sum(
            value
            for (sample, raw), value in self.metrics().items()
            if sample == name and all(w in raw for w in want)
        )

    def reconciles(self) -> float:
        return self.total("pagoda_operator_reconciles_total")


class OperatorProcess(ManagedProcess, OperatorMetrics):
    """`pagoda-operator` as a child process (as in production), with its /healthz, /metrics and log file.
    A flag whose value is None is left out (the operator's default applies)."""

    name = "pagoda-operator"

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        *,
        resync_seconds: float | None = None,
        workers: int | None = None,
        metrics_host: str | None = "127.0.0.1",
        cwd: Path | None = None,
        runtime_image: str | None = None,
        management_key_secret: str | None = None,
        leader_elect: str | None = None,
    ) -> None:
        super().__init__(log_path)
        self.management_key_secret, self.leader_elect = management_key_secret, leader_elect
        self.kubeconfig, self.resync_seconds, self.workers = kubeconfig, resync_seconds, workers
        self.metrics_host, self.cwd, self.runtime_image = metrics_host, cwd, runtime_image
        self.port = free_port()

    def args(self) -> list[str]:
        args = [str(VENV_BIN / "pagoda-operator"), "--kubeconfig", str(self.kubeconfig)]
        if self.metrics_host is not None:
            args += ["--metrics-host", self.metrics_host]
        args += ["--metrics-port", str(self.port)]
        if self.resync_seconds is not None:
            args += ["--resync-seconds", str(self.resync_seconds)]
        if self.workers is not None:
            args += ["--workers", str(self.workers)]
        if self.runtime_image is not None:
            args += ["--runtime-image", self.runtime_image]
        if self.management_key_secret is not None:
            args += ["--management-key-secret", self.management_key_secret]
        if self.leader_elect is not None:
            args += ["--leader-elect", self.leader_elect]
        return args

    def start(self) -> Self:
        self.launch(self.args(), cwd=self.cwd)
        self.wait_answers(f"{self.url}/healthz", "the operator's /healthz", timeout=60)
        return self

    def healthy(self) -> bool:
        """Whether /healthz answers 200; fails at once, with its log, if the operator exited."""
        return self.answers(f"{self.url}/healthz")
