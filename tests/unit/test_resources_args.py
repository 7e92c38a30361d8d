"""The container args round-trip through the runtime's own `serve` flag parser (the CLI contract)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from pagoda.contract import MAX_REQUEST_BODY_BYTES
from pagoda.operator.api import InferenceServiceSpec
from pagoda.operator.resources.args import COMMAND, runtime_args
from pagoda.operator.resources.chattemplate import CHAT_TEMPLATE_PATH
from pagoda.runtime.models.sources import parse_model_uri
from pagoda.runtime.serving.config import ServeConfig, add_serve_flags, config_from_args


def parse_like_the_runtime(args: list[str]) -> ServeConfig:
    assert args[0] == "serve"
    argv, extra = args[1:], []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_serve_flags(parser)
    return config_from_args(parser.parse_args(argv), extra)


def _check_round_trip(spec: InferenceServiceSpec) -> None:
    config = parse_like_the_runtime(runtime_args(spec))
    engine = spec.engine
    assert config.model == spec.model.uri
    assert config.served_model_name == spec.model.served_name
    assert config.revision == spec.model.revision
    assert (config.host, config.port) == ("0.0.0.0", 8000)
    assert config.dtype == engine.dtype
    assert config.quantization == (None if engine.quantization == "none" else engine.quantization)
    assert config.tensor_parallel_size == spec.resources.gpu.count
    assert config.max_model_len == engine.max_model_len
    assert config.gpu_memory_utilization == pytest.approx(engine.gpu_memory_utilization)
    assert config.block_size == engine.block_size
    assert config.enable_prefix_caching is engine.enable_prefix_caching
    assert config.max_num_seqs == engine.max_num_seqs
    assert config.chat_template == (CHAT_TEMPLATE_PATH if engine.chat_template else None)
    assert config.drain_timeout == spec.runtime.drain_timeout_seconds
    assert config.cache_dir == "/var/cache/pagoda"
    assert list(config.extra_args) == engine.extra_args


def test_example_args_round_trip(example: dict[str, Any]) -> None:
    _check_round_trip(InferenceServiceSpec.model_validate(example["spec"]))


@pytest.mark.parametrize(
    "engine",
    [
        {},
        {"quantization": "gptq", "enablePrefixCaching": False, "blockSize": 128},
        {"dtype": "float16", "maxModelLen": 16, "maxNumSeqs": 1, "gpuMemoryUtilization": 1},
        {"gpuMemoryUtilization": 0.1 + 0.2, "extraArgs": ["--enforce-eager", "--kv-cache-dtype", "fp8"]},
        {"chatTemplate": {"inline": "{% for m in messages %}{{ m.content }}{% endfor %}"}},
        {"chatTemplate": {"configMap": {"name": "templates", "key": "chat.jinja"}}},
    ],
)
def test_engine_variants_round_trip(llama_spec: dict[str, Any], engine: dict[str, Any]) -> None:
    llama_spec["engine"] = {"tensorParallelSize": 4, **engine}
    llama_spec["model"]["revision"] = "main"
    _check_round_trip(InferenceServiceSpec.model_validate(llama_spec))


def test_the_body_limit_is_a_flag_only_when_the_spec_sets_it(llama_spec: dict[str, Any]) -> None:
    """Unset, the runtime keeps its own default; set, the runtime parses the same number of bytes."""
    args = runtime_args(InferenceServiceSpec.model_validate(llama_spec))
    assert not any(arg.startswith("--max-request-body-bytes") for arg in args)
    assert parse_like_the_runtime(args).max_request_body_bytes == MAX_REQUEST_BODY_BYTES
    llama_spec["runtime"] = {"maxRequestBodyBytes": 64 * 1024**2}
    args = runtime_args(InferenceServiceSpec.model_validate(llama_spec))
    assert args[args.index("--max-request-body-bytes") + 1] == "67108864"
    assert parse_like_the_runtime(args).max_request_body_bytes == 64 * 1024**2


def test_command_is_the_runtime_console_script() -> None:
    assert COMMAND == ["pagoda-runtime"]


@pytest.mark.parametrize(
    "uri",
    [
        "hf://gpt2",
        "hf://meta-llama/Llama-3.1-70B-Instruct",
        "hf://Qwen/Qwen2.5-7B-Instruct/",
        "s3://models/qwen/Qwen2.5-7B-Instruct",
        "s3://my.bucket-1/a",
        "pvc://models",
        "pvc://models/mistralai/Mixtral-8x7B-Instruct-v0.1",
        "file:///models/tiny",
    ],
)
def test_every_uri_the_api_accepts_the_runtime_accepts(llama_spec: dict[str, Any], uri: str) -> None:
    llama_spec["model"]["uri"] = uri
    InferenceServiceSpec.model_validate(llama_spec)
    assert parse_model_uri(uri).scheme == uri.split(":")[0]
