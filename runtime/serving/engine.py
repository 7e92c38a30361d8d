"""The vLLM engine: arguments, construction off the event loop, vLLM's app, shutdown.

vLLM's public pieces do the work: its own argument parser (`make_arg_parser`), `AsyncEngineArgs`,
`AsyncLLM.from_vllm_config` (what `build_async_engine_client_from_engine_args` calls), `build_app` and
`init_app_state`. The differences from `vllm serve`: the blocking engine construction runs in a daemon
thread, so the HTTP server (and /livez) answers while the model loads; and that server is the runtime's own,
so the options of vLLM's server that it does not apply (TLS, uvicorn's logs and limits, several API
servers) are refused at start (vllmflags.py).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import threading
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any, TypeVar

from pagoda.contract import vllmflags
from pagoda.runtime.serving.adapters import adapter_engine_class
from pagoda.runtime.serving.config import ServeConfig
from pagoda.runtime.serving.progress import EngineSteps

log = logging.getLogger("pagoda.runtime.serving.engine")
T = TypeVar("T")


def cpu_kv_cache_default_gib(total_bytes: int) -> int:
    """An eighth of the machine's memory, between 1 and 16 GiB (vLLM's CPU backend needs a number)."""
    return max(1, min(16, total_bytes // (8 * 1024**3)))


# On vLLM's CPU backend, torch.compile'd functions run eagerly unless the pod's environment says otherwise.
# vLLM compiles some sampler helpers with inductor the first time a request needs them (logprobs counts the
# tokens ranked above the chosen one with one): on a CPU, inductor generates C++ and runs a compiler inside
# the engine's step. The CPU image has no compiler, so one `logprobs` request killed the EngineCore; with one,
# the step stopped 40 s on two cores (measured), past the stall watchdog's 30 s, for every request in flight.
# Eager runs the same PyTorch operations without the wait (docs/runtime.md, "torch.compile on CPU").
DYNAMO_DISABLE_ENV = "TORCHDYNAMO_DISABLE"


def apply_env_defaults() -> None:
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    if "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
        import psutil  # type: ignore[import-untyped,unused-ignore]

        gib = cpu_kv_cache_default_gib(psutil.virtual_memory().total)
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(gib)
        log.info("Set CPU KV-cache size default VLLM_CPU_KVCACHE_SPACE=%d", gib)
    if DYNAMO_DISABLE_ENV not in os.environ:
        # torch reads it at each torch.compile'd call (torch._dynamo.config), in this process and the
        # EngineCore it starts.
        os.environ[DYNAMO_DISABLE_ENV] = "1"
        log.info("Set CPU default %s=1: torch.compile'd functions run eagerly", DYNAMO_DISABLE_ENV)


def cpu_kv_cache_space() -> str | None:
    """VLLM_CPU_KVCACHE_SPACE (GiB) when the engine runs on vLLM's CPU backend, which sizes its KV cache from
    it; None on GPUs."""
    from vllm.platforms import current_platform

    return os.environ.get("VLLM_CPU_KVCACHE_SPACE") if current_platform.is_cpu() else None


def vllm_argv(config: ServeConfig, model_path: str) -> list[str]:
    """The vLLM command line equivalent to this config (after the model is local)."""
    argv = [
        "--model", model_path,
        "--served-model-name", config.name,
        "--host", config.host,
        "--port", str(config.port),
        "--dtype", config.dtype,
        "--tensor-parallel-size", str(config.tensor_parallel_size),
        "--gpu-memory-utilization", str(config.gpu_memory_utilization),
    ]  # fmt: skip
    optional = {
        "--quantization": config.quantization,
        "--max-model-len": config.max_model_len,
        "--block-size": config.block_size,
        "--max-num-seqs": config.max_num_seqs,
        "--max-num-batched-tokens": config.max_num_batched_tokens,
        "--chat-template": config.chat_template,
    }
    for flag, value in optional.items():
        if value is not None:
            argv += [flag, str(value)]
    if config.lora_enabled:  # the adapters themselves are loaded by the runtime (adapters.py), not vLLM
        argv.append("--enable-lora")
        lora = {
            "--max-loras": config.max_loras,
            "--max-lora-rank": config.max_lora_rank,
            "--max-cpu-loras": config.max_cpu_loras,
        }
        argv += [x for flag, value in lora.items() if value is not None for x in (flag, str(value))]
    if config.enable_prefix_caching is not None:
        argv.append(
            "--enable-prefix-caching" if config.enable_prefix_caching else "--no-enable-prefix-caching"
        )
    return argv + list(config.extra_args)


def parse_vllm_args(config: ServeConfig, model_path: str) -> argparse.Namespace:
    """Parse with vLLM's own parser; a bad extra argument exits 2 with vLLM's message, a flag the runtime
    does not honour raises ValueError naming it (vllmflags.REFUSED_FLAGS). Abbreviated flags are not
    accepted: `--served-model` would get past the owned-flag checks."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    prog = "pagoda-runtime serve -- (vLLM engine arguments)"
    base = FlexibleArgumentParser(prog=prog, allow_abbrev=False)  # type: ignore[no-untyped-call,unused-ignore]
    parser = make_arg_parser(base)  # type: ignore[no-untyped-call,unused-ignore]
    args = vllmflags.parse_refusing(parser, vllm_argv(config, model_path))
    if api_key := os.environ.get("PAGODA_API_KEY"):
        args.api_key = [api_key]
    validate_parsed_serve_args(args)
    import_parser_plugins(args)
    return args


def import_parser_plugins(args: argparse.Namespace) -> None:
    """--tool-parser-plugin and --reasoning-parser-plugin, imported as vLLM's API server does at start."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    if args.tool_parser_plugin:
        ToolParserManager.import_tool_parser(args.tool_parser_plugin)
    if args.reasoning_parser_plugin:
        ReasoningParserManager.import_reasoning_parser(args.reasoning_parser_plugin)


def run_in_daemon_thread(fn: Callable[[], T], name: str) -> asyncio.Future[T]:
    """Like asyncio.to_thread, but the thread never holds up interpreter exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def deliver(setter: Callable[[Any], None], value: Any) -> None:
        if not future.done():
            setter(value)

    def target() -> None:
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the event loop
            loop.call_soon_threadsafe(deliver, future.set_exception, exc)
        else:
            loop.call_soon_threadsafe(deliver, future.set_result, result)

    threading.Thread(target=target, name=name, daemon=True).start()
    return future


def create_engine(args: argparse.Namespace, steps: EngineSteps | None = None) -> Any:
    """Blocking: builds the engine config and starts EngineCore (what vLLM's build function does). `steps`
    counts the engine's steps (progress.py): a stat logger beside vLLM's own, which also keeps EngineCore
    reporting its statistics after every step when --disable-log-stats is given."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import propagate_flash_late_interaction
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    engine_args = AsyncEngineArgs.from_cli_args(args)
    propagate_flash_late_interaction(args, engine_args)
    vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    # With LoRA on, a subclass that counts and drains each adapter's requests (adapters.py).
    cls = adapter_engine_class() if engine_args.enable_lora else AsyncLLM
    return cls.from_vllm_config(
        vllm_config=vllm_config,
        usage_context=UsageContext.OPENAI_API_SERVER,
        enable_log_requests=engine_args.enable_log_requests,
        aggregate_engine_logging=engine_args.aggregate_engine_logging,
        disable_log_stats=engine_args.disable_log_stats,
        stat_loggers=[step_logger(steps)] if steps is not None else None,
    )


def step_logger(steps: EngineSteps) -> Any:
    """A vLLM stat logger factory (one logger per engine) that counts each step's statistics into `steps`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class StepLogger(StatLoggerBase):  # type: ignore[misc,unused-ignore]
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            steps.record(scheduler_stats)

        def log_engine_initialized(self) -> None:
            return

    return StepLogger


async def build_vllm_app(engine: Any, args: argparse.Namespace, server: Any, stack: AsyncExitStack) -> Any:
    """vLLM's FastAPI app with its state and lifespan, exactly as `vllm serve` builds it."""
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app

    await engine.reset_mm_cache()
    supported_tasks = await engine.get_supported_tasks()
    app = build_app(args, supported_tasks, engine.model_config)
    await init_app_state(engine, app.state, args, supported_tasks)
    app.state.server = server
    await stack.enter_async_context(app.router.lifespan_context(app))
    return app


def shutdown_engine(engine: Any) -> None:
    """Blocking: stops EngineCore and its workers."""
    engine.shutdown(timeout=engine.vllm_config.shutdown_timeout)
