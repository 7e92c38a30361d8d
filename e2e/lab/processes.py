"""Child processes for the tests, the demo, the tools and the local cluster, one way each: free loopback
ports, polling without fixed sleeps (`wait_until`; `wait_while_running` also fails as soon as a component
exits), whether a URL answers 200 (`http_ok`), stopping by PID (`terminate`: SIGTERM, then SIGKILL), a
process with its output in a log file (`ManagedProcess`), a cluster component in a session of its own
(`ComponentProcess`, started by name by the control plane's `Launcher`), `pagoda-operator`, and the
environment of a `pagoda-runtime` subprocess. REPO_ROOT is the repository's root for all of e2e.

Used by tests/integration, tests/runtime, benchmarks, e2e and e2e/lab/demo.py."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import yaml

from e2e.lab import clusterdns

if TYPE_CHECKING:
    from e2e.lab._pki import Pki

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SAMPLE = REPO_ROOT / "examples" / "tiny-cpu.yaml"
SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")
POLL = 0.1  # how often the cluster's waits poll
# Components that are harness code run by this Python (`python -m MODULE`), not Go binaries in bin_dir.
PYTHON_COMPONENTS = {
    "pagoda-operator": "pagoda.operator.main",  # `make cluster-up` runs the operator too
}


class WaitTimeout(AssertionError):
    """`wait_until` ran out of time."""


class StartError(RuntimeError):
    """A cluster component or add-on exited or did not become ready in time."""


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


def listens(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on host:port."""
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


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


def wait_while_running(
    probe: Callable[[], object],
    what: str,
    procs: Iterable[ComponentProcess],
    deadline: float,
    logs: Iterable[ComponentProcess] | None = None,
) -> None:
    """`wait_until` `deadline` (monotonic), every POLL seconds, raising StartError: at once, with its log,
    when one of `procs` exits; on timeout with the logs of `logs` (default: `procs`)."""
    procs = list(procs)
    shown = procs if logs is None else list(logs)

    def alive() -> None:
        for proc in procs:
            proc.check_alive()

    wait_until(
        probe,
        what,
        timeout=deadline - time.monotonic(),
        interval=POLL,
        alive=alive,
        tail=(lambda: "".join(f"\n{p.log_path}:\n{p.excerpt()}" for p in shown)) if shown else None,
        error=StartError,
    )


def http_ok(url: str, timeout: float = 2, context: ssl.SSLContext | None = None) -> bool:
    """Whether `url` answers 200 (False while nothing listens, or on any other status); `context` for
    https:// with a private CA or a client certificate."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _runs(pid: int, exe: Path) -> bool:
    """Whether `pid` runs `exe` (not when it is a zombie or gone)."""
    try:
        return os.readlink(f"/proc/{pid}/exe") == str(exe.resolve())
    except OSError:
        return False


def _ended(pid: int) -> tuple[bool, int | None]:
    """Whether `pid` has exited, and its exit code if it was this process' child (reaped here)."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not this process' child: its state in /proc
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True, None
        return state in ("Z", "X"), None
    return (True, os.waitstatus_to_exitcode(status)) if done else (False, None)


def terminate(pid: int, grace: float, exe: Path | None = None) -> int | None:
    """SIGTERM to `pid`, then SIGKILL if it has not exited after `grace` seconds; returns once it is gone (at
    most 10 s after the SIGKILL), with its exit code if it was this process' child (negative: the signal
    that ended it). With `exe`, only if `pid` still runs that executable: a PID recorded by an earlier
    `python -m e2e.lab up` may have been reused since."""
    if exe is not None and not _runs(pid, exe):
        return None
    try:
        os.kill(pid, signal.SIGTERM)
        deadline, killed = time.monotonic() + grace, False
        while not (ended := _ended(pid))[0]:
            if time.monotonic() > deadline:
                if killed:
                    raise TimeoutError(f"PID {pid} still runs 10 s after SIGKILL")
                os.kill(pid, signal.SIGKILL)
                deadline, killed = time.monotonic() + 10, True
            time.sleep(POLL / 2)
    except ProcessLookupError:
        return None
    return ended[1]


def die_with_parent() -> None:
    """In the child (a preexec_fn): get SIGKILL when the parent (the test session) exits, however it exits.
    (Not SIGTERM: kube-apiserver's graceful shutdown can hang once etcd is gone, and the data is thrown away
    anyway.)"""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


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
    APPEND = False  # whether each launch appends to the log (a restarted component's) or starts it afresh
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

    def launch(self, args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> int:
        """Starts `args` with `env` (default: this process') from `cwd`; returns its PID."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab" if self.APPEND else "wb") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, **self.popen_options()
            )
        return self.proc.pid

    def popen_options(self) -> dict[str, Any]:
        """More of subprocess.Popen's arguments, for subclasses."""
        return {}

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
        """SIGTERM, wait; SIGKILL if it has not exited after `timeout` (default: STOP_GRACE) seconds. Returns
        the exit code (None: not started)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is not None:
            return proc.returncode
        return terminate(proc.pid, self.STOP_GRACE if timeout is None else timeout)

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


class ComponentProcess(ManagedProcess):
    """A cluster component or add-on, NAME (a binary in bin_dir, or `python -m MODULE` for the harness's own:
    PYTHON_COMPONENTS), in a session of its own, stdin from /dev/null, its output appended to
    LOG_DIR/NAME.log. Unless `detach`, it gets SIGKILL when the process that started it exits, however that
    exits."""

    STOP_GRACE = 10.0
    APPEND = True

    def __init__(self, name: str, bin_dir: Path, log_dir: Path, *, detach: bool) -> None:
        super().__init__(log_dir / f"{name}.log", name)
        self.exe = program(bin_dir, name)
        self.detach = detach
        self.command: tuple[list[str], dict[str, str] | None, Path | None] | None = None  # argv, env, cwd

    def start(
        self,
        args: list[str],
        env: dict[str, str] | None = None,
        *,
        cwd: Path | None = None,
        resolv_conf: Path | None = None,
    ) -> int:
        """Starts `exe` with `args`; returns its PID. `resolv_conf`: the cluster DNS's, for a process that
        stands in for a pod (clusterdns.in_cluster_dns)."""
        argv = [str(self.exe), *args]
        if self.name in PYTHON_COMPONENTS:
            argv[1:1] = ["-m", PYTHON_COMPONENTS[self.name]]
        if resolv_conf is not None:
            argv = clusterdns.in_cluster_dns(argv, resolv_conf)
        self.command = (argv, env, cwd)
        return self.launch(argv, env, cwd)

    def restart(self) -> int:
        """Stops it (SIGTERM, SIGKILL after STOP_GRACE) and starts the same command again, as a restarted
        static pod or systemd unit would be; its log goes on in the same file. Returns the new PID."""
        assert self.command is not None, "restart() after start()"
        self.stop()
        return self.launch(*self.command)

    def popen_options(self) -> dict[str, Any]:
        return {
            "stdin": subprocess.DEVNULL,
            "start_new_session": True,
            "preexec_fn": None if self.detach else die_with_parent,
        }

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def check_alive(self) -> None:
        """Fails at once, with StartError and the log, when the process has exited."""
        if self.proc is None or self.proc.poll() is not None:
            rc = None if self.proc is None else self.proc.returncode
            raise StartError(f"{self.name} exited (code {rc}); {self.log_path}:\n{self.excerpt()}")

    def excerpt(self) -> str:
        """The log's first and last lines (a flag error comes first, before the usage text)."""
        lines = self.log().splitlines()
        return "\n".join(lines if len(lines) <= 40 else [*lines[:5], "...", *lines[-30:]])


def program(bin_dir: Path, name: str) -> Path:
    """The executable of component `name`: a binary in bin_dir, or this Python for the harness's own."""
    return Path(sys.executable) if name in PYTHON_COMPONENTS else bin_dir / name


def all_alive(pids: dict[str, int], bin_dir: Path) -> bool:
    """Whether every component in `pids` (name -> PID, from a cluster's state file) still runs."""
    return bool(pids) and all(_runs(pid, program(bin_dir, name)) for name, pid in pids.items())


class Launcher:
    """Starts the control plane's components by name (ComponentProcess, from the repository root) and
    watches that they stay up."""

    def __init__(self, bin_dir: Path, log_dir: Path, *, detach: bool) -> None:
        self.bin_dir = bin_dir
        self.log_dir = log_dir
        self.detach = detach
        self.procs: dict[str, ComponentProcess] = {}

    def launch(self, name: str, args: list[str], env: dict[str, str] | None = None) -> int:
        """Starts component `name` with `args` and `env` (default: this process'); returns its PID."""
        proc = ComponentProcess(name, self.bin_dir, self.log_dir, detach=self.detach)
        pid = proc.start(args, env, cwd=REPO_ROOT)
        self.procs[name] = proc
        return pid

    def relaunch(self, name: str) -> int:
        """Restarts component `name` (ComponentProcess.restart); returns the new PID."""
        return self.procs[name].restart()

    def wait(
        self, probe: Callable[[], object], what: str, deadline: float, log_of: str | None = None
    ) -> None:
        """`wait_while_running` every component, with `log_of`'s log on timeout."""
        logs = [self.procs[log_of]] if log_of else []
        wait_while_running(probe, what, self.procs.values(), deadline, logs=logs)

    def wait_http(self, name: str, url: str, deadline: float, pki: Pki | None = None) -> None:
        """Waits until `url` (component `name`'s /readyz or /healthz) answers 200: verified against the
        cluster CA with the admin's client certificate when `pki` is given, else unverified (a certificate
        that the component made for itself)."""
        if pki is not None:
            ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
            ctx.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        else:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        self.wait(lambda: http_ok(url, context=ctx), f"{name} at {url}", deadline, log_of=name)


class OperatorMetrics:
    """Reading `pagoda-operator`'s /metrics at `url`: as a child process (OperatorProcess) or a pod
    (e2e/lab/chartenv.py ChartOperator)."""

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
        self.extra_args: list[str] = []  # more flags, for the next start

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
        return args + self.extra_args

    def start(self) -> Self:
        self.launch(self.args(), cwd=self.cwd)
        self.wait_answers(f"{self.url}/healthz", "the operator's /healthz", timeout=60)
        return self

    def healthy(self) -> bool:
        """Whether /healthz answers 200; fails at once, with its log, if the operator exited."""
        return self.answers(f"{self.url}/healthz")


def discard_folder(path: Path, failed: bool, what: str, kept: Path | None = None) -> None:
    """A harness's working folder, once done with: removed, unless what ran in it failed; then kept, and
    named (`kept`: the part of it worth reading, e.g. its logs; the folder itself by default)."""
    if failed:
        print(f"\nKept {what} in {kept or path}.")
    else:
        shutil.rmtree(path, ignore_errors=True)
