"""The process lifecycle: bind, serve probes, load the engine, watch it, drain on SIGTERM, exit clean.

Exit status: 0 after a drain; 1 when the model cannot be resolved or loaded, or the engine dies. A failure
to start also writes a termination message (termination.py) naming its reason and the field to change.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped,unused-ignore]
import uvicorn

from pagoda.contract import management
from pagoda.runtime.models import modeluri, sources
from pagoda.runtime.models.modelcache import ModelCache
from pagoda.runtime.serving import capacity, enginefailure, metrics, routes, signals, termination
from pagoda.runtime.serving import engine as eng
from pagoda.runtime.serving.adapters import AdapterManager, management_app
from pagoda.runtime.serving.config import ServeConfig
from pagoda.runtime.serving.lora import parse_lora_flag
from pagoda.runtime.serving.progress import EngineSteps, ProgressWatch, default_stall_timeout
from pagoda.runtime.serving.server import PagodaApp, RuntimeState
from pagoda.runtime.serving.startup import StartupClock, folder_bytes
from pagoda.runtime.serving.tls import CertificateReloader

KEEP_ALIVE_SECONDS = 65
# A drain ends once no request came for this long (and none is inside): clients under load send their next
# request within it, get `Connection: close` and move to another replica.
DRAIN_QUIET_SECONDS = 2.0
DRAIN_POLL_SECONDS = 0.1
log = logging.getLogger("pagoda.runtime")
WATCHDOG_INTERVAL_S = 1.0
CHILD_EXIT_TIMEOUT_S = 5.0


class _NoSignalServer(uvicorn.Server):
    """uvicorn installs and re-raises SIGTERM itself; the runtime handles signals instead."""

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        return

    def capture_signals(self) -> Any:  # uvicorn >= 0.29
        import contextlib

        return contextlib.nullcontext()


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def _is_resource_tracker(proc: psutil.Process) -> bool:
    """multiprocessing's resource tracker ignores SIGTERM and exits by itself when this process does."""
    try:
        return "resource_tracker" in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def reap_children() -> int:
    """Terminate, then kill, any process this one started that is still alive. Returns how many."""
    children = [c for c in psutil.Process().children(recursive=True) if not _is_resource_tracker(c)]
    for child in children:
        try:
            child.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(children, timeout=CHILD_EXIT_TIMEOUT_S)
    for child in alive:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    if children:
        names = ",".join(sorted({_name(c) for c in children}))
        log.warning(
            "Reaped leftover child processes count=%d killed=%d names=%s", len(children), len(alive), names
        )
    return len(children)


def _name(proc: psutil.Process) -> str:
    try:
        return str(proc.name())
    except psutil.Error:
        return "?"


class Runtime:
    def __init__(
        self, config: ServeConfig, vllm_args: Any, certificate: CertificateReloader | None = None
    ) -> None:
        """`certificate`: serve HTTPS with it (--tls-cert-file, --tls-key-file; tls.py), else plain HTTP."""
        self.config = config
        self.vllm_args = vllm_args
        self.certificate = certificate
        adapters = AdapterManager(config.name, config.cache_dir, config.drain_timeout, config.lora_enabled)
        self.state = RuntimeState(
            config.name,
            adapters,
            max_connection_age=config.max_connection_age,
            max_request_body_bytes=config.max_request_body_bytes,
            management_key=config.management_public_key_file,
            identity=management.PodIdentity.from_env(os.environ, config.host, config.port),
            api_key=os.environ.get("PAGODA_API_KEY") or None,  # vLLM's --api-key too (engine.py)
        )
        self.stop = asyncio.Event()
        self.exit_code = 0
        self.model_cache = self.state.status.model_cache = ModelCache(
            Path(config.cache_dir), config.cache_max_bytes
        )
        self.clock = self.state.status.startup = StartupClock()  # its first phase, imports, ends below
        # Stopped while the engine loaded: its loading thread is still inside native code (torch, vLLM), and
        # tearing the interpreter down under it can crash the process (SIGSEGV, exit 139) after a clean
        # stop; cli.py then leaves without that teardown.
        self.abandoned_load = False
        self.engine_steps = EngineSteps()  # counted by a stat logger in the engine (progress.py)

    def request_stop(self, reason: str, exit_code: int = 0) -> None:
        if not self.stop.is_set():
            log.info("Received stop request reason=%s", reason)
            self.exit_code = exit_code
            self.stop.set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in signals.STOP_SIGNALS:
            loop.add_signal_handler(sig, self.request_stop, signal.Signals(sig).name)
        early = signals.received_early()
        if early is not None:  # came while Python imported the engine (runtime/serving/signals.py)
            self.request_stop(early)
        try:
            sock = bind(self.config.host, self.config.port)
        except OSError as exc:
            termination.write(termination.bind_failed(self.config.host, self.config.port, str(exc)))
            return 1
        http = uvicorn.Config(
            PagodaApp(self.state),
            lifespan="off",
            log_level="warning",
            access_log=False,
            # Longer than the idle timeout of the proxies and gateways in front (60 s is common; the
            # harness's Envoy uses 30 s): a proxy that reuses a connection the runtime has just closed
            # answers its client 503 (seen with 5 s: 2 of 600 requests through Envoy).
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
            timeout_graceful_shutdown=5,
        )
        reload_task = None
        if self.certificate is not None:  # uvicorn listens with the reloader's context (tls.py)
            http.load()
            http.ssl = self.certificate.context
            reload_task = asyncio.create_task(self.certificate.watch())
        server = _NoSignalServer(http)
        server_task = asyncio.create_task(server.serve(sockets=[sock]))
        log.info(
            "Started HTTP server host=%s port=%d tls=%s",
            self.config.host,
            self.config.port,
            str(self.certificate is not None).lower(),
        )
        if self.state.verifier is not None:  # what a management call must be signed for (management.py)
            log.info("Management API binds calls to %s", self.state.verifier.identity.describe())
        async with AsyncExitStack() as stack:
            await self._load_and_serve(server, stack)
            await self._drain()
            server.should_exit = True
            await asyncio.wait({server_task}, timeout=15)
        if reload_task is not None:
            reload_task.cancel()
        await self._shutdown_engine()
        sock.close()
        reap_children()
        log.info("Stopped runtime exit_code=%d", self.exit_code)
        return self.exit_code

    async def _load_and_serve(self, server: uvicorn.Server, stack: AsyncExitStack) -> None:
        if self.stop.is_set():
            log.info("Stopped before loading model=%s", self.config.model)
            return
        source = modeluri.parse_model_uri(self.config.model)
        args, config = self.vllm_args, self.config
        report = enginefailure.prepare_report()  # before any engine process starts

        clock, cache, steps = self.clock, self.model_cache, self.engine_steps

        def load() -> Any:
            fetched = cache.fetch(source, config.revision)
            path = sources.check_model_dir(source.uri, fetched.path)
            clock.model_bytes, clock.fetched_bytes = folder_bytes(path), fetched.bytes_moved
            args.model = str(path)
            log.info("Started engine model=%s path=%s", config.model, path)
            clock.begin("engineSetup")
            clock.expect_vllm_timings()
            try:
                return eng.create_engine(args, steps)
            finally:
                clock.read_vllm_timings()

        clock.begin("modelFetch")  # here, not in the thread: a stop from now on finds the phase begun
        loading = eng.run_in_daemon_thread(load, "pagoda-engine-load")
        stopped = asyncio.create_task(self.stop.wait())
        await asyncio.wait({loading, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not loading.done():
            stopped.cancel()
            log.info("Stopped while loading model=%s phase=%s", config.model, clock.current)
            # Kept by the kubelet when it restarts the container (a startup probe that ran out): the
            # operator names the phase in StartupTimeout.
            termination.write(termination.stopped_while_loading(clock), error=False)
            reap_children()  # makes a pending EngineCore handshake fail
            self.abandoned_load = True
            return
        stopped.cancel()
        try:
            self.state.engine = loading.result()
            clock.begin("apiServer")
            app = await eng.build_vllm_app(self.state.engine, args, server, stack)
            self.state.engine_registry = _engine_registry()
        except Exception as exc:
            log.error("Failed to load model uri=%s error=%s: %s", config.model, type(exc).__name__, exc)
            if isinstance(exc, modeluri.ModelSourceError):
                fatal = termination.model_source(exc.reason, str(exc))
            else:
                root = enginefailure.read_report(report)
                fatal = termination.engine_start(exc, root, config.max_model_len, eng.cpu_kv_cache_space())
            termination.write(fatal)
            self.request_stop("model load failed", exit_code=1)
            return
        await self._start_adapters(app, Path(args.model))
        kv = self.state.status.kv_cache = capacity.from_vllm_config(self.state.engine.vllm_config)
        clock.ready()
        self.state.inner = app  # ready from here
        log.info(
            "Loaded model uri=%s name=%s seconds=%.1f kv_cache_tokens=%s max_concurrency=%s phases=%r",
            config.model,
            config.name,
            clock.total(),
            kv.tokens if kv else "unknown",
            f"{kv.max_concurrency:.2f}" if kv else "unknown",
            clock.summary(),
        )
        # What of vLLM's app the gate keeps out (routes.py), as JSON: tier 3 calls each of them.
        log.info("Gated vLLM's routes not_forwarded=%s", json.dumps(routes.not_forwarded(app)))
        watchdog = asyncio.create_task(self._watch_engine())
        await self.stop.wait()
        watchdog.cancel()

    async def _start_adapters(self, app: Any, base_dir: Path) -> None:
        """The adapters API (the management API), and the --lora adapters loaded before the pod is ready."""
        manager = self.state.adapters
        assert manager is not None
        manager.attach(self.state.engine, app.state.openai_serving_models, base_dir)
        self.state.management = management_app(manager)
        await manager.load_at_start([parse_lora_flag(flag) for flag in self.config.lora])

    def stall_timeout(self) -> float:
        """--stall-timeout, else the default for the loaded engine's step budget and context (progress.py)."""
        if self.config.stall_timeout is not None:
            return self.config.stall_timeout
        vllm_config = self.state.engine.vllm_config
        return default_stall_timeout(
            vllm_config.scheduler_config.max_num_batched_tokens, vllm_config.model_config.max_model_len
        )

    async def _watch_engine(self) -> None:
        """Every second: an engine that errored, or that holds requests and completed no step for
        --stall-timeout seconds (progress.py), ends the process with 1, so that the kubelet restarts it."""
        state = self.state
        timeout = self.stall_timeout()
        log.info("Watching engine progress stall_timeout=%.0f", timeout)
        watch = ProgressWatch(timeout)
        while not self.stop.is_set():
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
            if state.engine_dead:
                log.error("Engine died model=%s; exiting", self.config.model)
                self.request_stop("engine died", exit_code=1)
                continue
            families = list(state.engine_registry.collect()) if state.engine_registry is not None else []
            gauges = metrics.engine_gauges(families, self.config.name)
            held = int(state.engine.get_num_unfinished_requests())
            busy = held > 0 or gauges.waiting + gauges.running > 0
            idle = watch.observe(time.monotonic(), busy, self.engine_steps.count)
            state.status.stalled_seconds = idle
            if watch.stalled(idle):
                state.engine_stalled = True
                log.error(
                    "Engine stalled model=%s seconds=%.0f held=%d waiting=%d running=%d steps=%d; exiting",
                    self.config.model,
                    idle,
                    held,
                    gauges.waiting,
                    gauges.running,
                    self.engine_steps.count,
                )
                termination.write(termination.engine_stalled(idle, timeout))
                self.request_stop("engine stalled", exit_code=1)

    async def _drain(self) -> None:
        """Serves on (each response closing its connection, server.py) until no request is inside and none
        came for DRAIN_QUIET_SECONDS: by then every client that still had a connection here has been told to
        reconnect, and new connections go to other replicas. Bounded by --drain-timeout."""
        state = self.state
        state.drain_deadline = time.monotonic() + self.config.drain_timeout
        state.status.draining = True
        if state.inner is None or state.engine_dead:
            return
        log.info("Started drain in_flight=%d timeout=%.0f", state.in_flight, self.config.drain_timeout)
        while True:
            now = time.monotonic()
            if state.in_flight == 0 and now - state.last_request >= DRAIN_QUIET_SECONDS:
                log.info("Drained requests rejected=%d", state.status.rejected_draining)
                return
            if now >= state.drain_deadline:
                log.warning("Drain timed out in_flight=%d", state.in_flight)
                return
            await asyncio.sleep(DRAIN_POLL_SECONDS)

    async def _shutdown_engine(self) -> None:
        engine = self.state.engine
        if engine is None or self.state.engine_stalled:  # a stalled engine would not answer: reap it
            return
        try:
            await asyncio.wait_for(eng.run_in_daemon_thread(lambda: eng.shutdown_engine(engine), "stop"), 30)
            log.info("Stopped engine")
        except Exception as exc:
            log.warning("Failed to stop engine cleanly error=%s", exc)


def _engine_registry() -> Any:
    from pagoda.runtime.serving.metrics import engine_registry

    return engine_registry()
