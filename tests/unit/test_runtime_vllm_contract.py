"""Tier 1: the pieces of vLLM the runtime calls still have the shape it calls them with, and vLLM's flags are
each honoured, owned or refused (no engine starts; importing vLLM's modules takes a few seconds).

When a vLLM upgrade moves or changes one of these, this fails here rather than in a pod at start.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from pagoda.contract import vllmflags
from pagoda.operator.api.rules import OWNED_FLAG_PATTERN
from pagoda.runtime.serving.config import ServeConfig
from tests.repo import REPO

RUNTIME = REPO / "runtime"
# Options of vLLM's server (FrontendArgs) that build_app, init_app_state or create_engine apply, and so
# work in the runtime as in `vllm serve`.
HONOURED_SERVER_FLAGS = {
    "--allow-credentials",
    "--allowed-origins",
    "--allowed-methods",
    "--allowed-headers",
    "--root-path",
    "--middleware",
    "--enable-request-id-headers",
    "--disable-fastapi-docs",
    "--enable-offline-docs",
    "--enable-flash-late-interaction",
}
SPELLINGS = [
    "--port",
    "--port=1",
    "--served_model_name",
    "--served-model_name=x",
    "--api_key",
    "--model",
    "--model-impl",
    "--portable",
    "--served-model",
    "--host-ip=1",
    "-p",
]


@pytest.mark.parametrize("arg", SPELLINGS)
def test_the_operator_and_the_runtime_agree_on_owned_flags(arg: str) -> None:
    """The CRD's CEL pattern (also the operator's model check) and the runtime's check, from one list."""
    assert bool(re.match(OWNED_FLAG_PATTERN, arg)) == (vllmflags.owned(arg) is not None)


def vllm_imports() -> list[tuple[str, str, str]]:
    """(runtime file, vllm module, name) of every `from vllm... import name` in the runtime's code."""
    found = []
    for path in sorted(RUNTIME.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
                where = str(path.relative_to(RUNTIME))
                found += [(where, str(node.module), alias.name) for alias in node.names]
    return found


@pytest.fixture(scope="module")
def vllm() -> Any:
    return pytest.importorskip("vllm")


def test_every_vllm_name_the_runtime_imports_exists(vllm: Any) -> None:
    imports = vllm_imports()
    assert len(imports) >= 10, imports  # the scan sees the runtime's imports
    missing = [
        f"{where}: from {module} import {name}"
        for where, module, name in imports
        if not hasattr(importlib.import_module(module), name)
    ]
    assert not missing


def accepts(function: Any, *args: Any, **kwargs: Any) -> None:
    """`function` can be called with these arguments (raises TypeError otherwise)."""
    inspect.signature(function).bind(*args, **kwargs)


def test_the_vllm_calls_the_runtime_makes_fit_their_signatures(vllm: Any) -> None:
    """runtime/serving/engine.py: the arguments it passes, by position and keyword."""
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import (
        make_arg_parser,
        propagate_flash_late_interaction,
        validate_parsed_serve_args,
    )
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    x = object()
    accepts(make_arg_parser, x)
    accepts(validate_parsed_serve_args, x)
    accepts(AsyncEngineArgs.from_cli_args, x)
    accepts(AsyncEngineArgs.create_engine_config, x, usage_context=UsageContext.OPENAI_API_SERVER)
    accepts(propagate_flash_late_interaction, x, x)
    accepts(
        AsyncLLM.from_vllm_config,
        vllm_config=x,
        usage_context=x,
        enable_log_requests=x,
        aggregate_engine_logging=x,
        disable_log_stats=x,
        stat_loggers=x,
    )
    accepts(AsyncLLM.get_num_unfinished_requests, x)  # the requests the engine holds (progress.py)
    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    assert {"enable_log_requests", "aggregate_engine_logging", "disable_log_stats"} <= fields
    accepts(build_app, x, x, x)
    accepts(init_app_state, x, x, x, x)
    accepts(ToolParserManager.import_tool_parser, x)
    accepts(ReasoningParserManager.import_reasoning_parser, x)
    for method in ("reset_mm_cache", "get_supported_tasks"):
        assert inspect.iscoroutinefunction(getattr(AsyncLLM, method)), method
    accepts(AsyncLLM.shutdown, x, timeout=x)
    assert isinstance(inspect.getattr_static(AsyncLLM, "errored"), property)
    assert "shutdown_timeout" in inspect.signature(VllmConfig).parameters


def parse(*extra: str) -> Any:
    from pagoda.runtime.serving.engine import parse_vllm_args

    return parse_vllm_args(ServeConfig(model="file:///models/m", extra_args=extra), "/models/m")


def test_vllm_parses_the_runtime_command_line(vllm: Any) -> None:
    args = parse("--enforce-eager")
    assert (args.model, args.served_model_name, args.port) == ("/models/m", ["m"], 8000)
    assert args.enforce_eager is True
    # Refused flags read back as vLLM's defaults, as the code after parsing expects.
    assert args.ssl_keyfile is None and args.headless is False and args.api_server_count is None


def test_vllm_takes_the_chat_template_file_the_operator_mounts(vllm: Any, tmp_path: Path) -> None:
    """--chat-template reaches vLLM's parser and its start-up check as the file (vLLM reads it when the app
    state is built, renderers/chat_utils.py load_chat_template)."""
    from pagoda.runtime.serving.engine import parse_vllm_args

    path = tmp_path / "chat-template.jinja"
    path.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    config = ServeConfig(model="file:///models/m", chat_template=str(path))
    assert parse_vllm_args(config, "/models/m").chat_template == str(path)


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--ssl-keyfile", "/tls/key.pem"], "--ssl-keyfile"),
        (["--ssl_certfile=/tls/cert.pem"], "--ssl-certfile"),
        (["--uvicorn-log-level", "debug"], "--uvicorn-log-level"),
        (["--h11-max-header-count", "64"], "--h11-max-header-count"),
        (["-asc", "2"], "--api-server-count"),
        (["--headless"], "--headless"),
    ],
)
def test_vllm_server_flags_the_runtime_does_not_apply_are_refused(
    vllm: Any, extra: list[str], flag: str
) -> None:
    with pytest.raises(ValueError, match=f"^{flag} is not supported by pagoda-runtime: "):
        parse(*extra)


def test_abbreviated_flags_are_not_accepted(vllm: Any) -> None:
    """argparse would read `--served-model` as `--served-model-name`, past the owned-flag checks."""
    with pytest.raises(SystemExit) as caught:
        parse("--served-model", "other")
    assert caught.value.code == 2


def test_every_option_of_vllms_server_is_honoured_owned_or_refused(vllm: Any) -> None:
    """A new server option in a vLLM upgrade fails this until it is sorted into one of the three."""
    from vllm.entrypoints.launchers.cli_args import BaseFrontendArgs, FrontendArgs, make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def flags(cls: Any) -> set[str]:
        return {"--" + f.name.replace("_", "-") for f in dataclasses.fields(cls)}

    server_flags = flags(FrontendArgs) - flags(BaseFrontendArgs)  # Base: the API's own options (served)
    sorted_flags = HONOURED_SERVER_FLAGS | set(vllmflags.OWNED_FLAGS) | set(vllmflags.REFUSED_FLAGS)
    assert server_flags - sorted_flags == set()
    parser = make_arg_parser(FlexibleArgumentParser())
    known = {option for action in parser._actions for option in action.option_strings}
    assert sorted_flags - known == set(), "a flag listed here is gone from vLLM"


def test_the_step_logger_counts_each_step_vllm_reports(vllm: Any) -> None:
    """progress.py's progress: runtime/serving/engine.py's stat logger, behind vLLM's per-engine adapter as
    AsyncLLM wraps it, counts one step per scheduler statistics report, also one without IterationStats (a
    step that computed part of a prefill and produced no output). The config fields the default timeout reads
    exist."""
    from vllm.config import ModelConfig, SchedulerConfig
    from vllm.v1.metrics.loggers import PerEngineStatLoggerAdapter, StatLoggerBase
    from vllm.v1.metrics.stats import SchedulerStats

    from pagoda.runtime.serving.engine import step_logger
    from pagoda.runtime.serving.progress import EngineSteps

    steps = EngineSteps()
    factory = step_logger(steps)
    assert issubclass(factory, StatLoggerBase)
    adapter = PerEngineStatLoggerAdapter(
        vllm_config=None,  # type: ignore[arg-type]
        engine_indexes=[0],
        per_engine_stat_logger_factory=factory,
    )
    adapter.log_engine_initialized()
    adapter.record(scheduler_stats=SchedulerStats(num_running_reqs=1), iteration_stats=None, engine_idx=0)
    adapter.record(scheduler_stats=SchedulerStats(num_running_reqs=1), iteration_stats=None, engine_idx=0)
    adapter.record(scheduler_stats=None, iteration_stats=None, engine_idx=0)
    adapter.log()
    assert steps.count == 2
    assert "max_num_batched_tokens" in {f.name for f in dataclasses.fields(SchedulerConfig)}
    assert "max_model_len" in {f.name for f in dataclasses.fields(ModelConfig)}
