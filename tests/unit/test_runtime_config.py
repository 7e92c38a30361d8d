"""Tier 1: `pagoda-runtime serve` flag validation (no engine)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pagoda.runtime.cli import _parser
from pagoda.runtime.serving.config import ConfigError, ServeConfig, config_from_args
from pagoda.runtime.serving.engine import cpu_kv_cache_default_gib, vllm_argv

RUNTIME = str(Path(sys.executable).parent / "pagoda-runtime")


def parse(*argv: str, extra: list[str] | None = None) -> ServeConfig:
    ns: argparse.Namespace = _parser().parse_args(["serve", *argv])
    return config_from_args(ns, extra or [])


def test_defaults_match_the_contract() -> None:
    config = parse("--model", "pvc://models/llama")
    assert (config.host, config.port, config.cache_dir) == ("0.0.0.0", 8000, "/var/cache/pagoda")
    assert config.enable_prefix_caching is None and config.extra_args == ()
    assert config.name == "llama"
    assert config.max_request_body_bytes == 16 * 1024**2


def test_operator_style_command_line_is_accepted() -> None:
    config = parse(
        "--model", "hf://mistralai/Mistral-7B-Instruct-v0.3", "--served-model-name", "mistral",
        "--revision", "main", "--host", "0.0.0.0", "--port", "8000", "--dtype", "bfloat16",
        "--quantization", "awq", "--tensor-parallel-size", "2", "--max-model-len", "8192",
        "--gpu-memory-utilization", "0.9", "--block-size", "16", "--no-enable-prefix-caching",
        "--max-num-seqs", "64", "--drain-timeout", "120", "--cache-dir", "/var/cache/pagoda",
        extra=["--enforce-eager"],
    )  # fmt: skip
    assert config.tensor_parallel_size == 2 and config.enable_prefix_caching is False
    argv = vllm_argv(config, "/var/cache/pagoda/hf/x")
    assert argv[:4] == ["--model", "/var/cache/pagoda/hf/x", "--served-model-name", "mistral"]
    for pair in (["--quantization", "awq"], ["--max-model-len", "8192"], ["--block-size", "16"]):
        i = argv.index(pair[0])
        assert argv[i : i + 2] == pair
    assert "--no-enable-prefix-caching" in argv and argv[-1] == "--enforce-eager"


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--port", "0"], "--port"),
        (["--port", "http"], "--port"),
        (["--dtype", "float8"], "--dtype"),
        (["--quantization", "int3"], "--quantization"),
        (["--tensor-parallel-size", "0"], "--tensor-parallel-size"),
        (["--max-model-len", "-1"], "--max-model-len"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
        (["--block-size", "17"], "--block-size"),
        (["--max-num-seqs", "0"], "--max-num-seqs"),
        (["--drain-timeout", "-3"], "--drain-timeout"),
        (["--max-connection-age", "-1"], "--max-connection-age"),
        (["--max-connection-age", "soon"], "--max-connection-age"),
        (["--max-request-body-bytes", "0"], "--max-request-body-bytes"),
        (["--max-request-body-bytes", "-1"], "--max-request-body-bytes"),
        (["--max-request-body-bytes", "16MiB"], "--max-request-body-bytes"),
    ],
)
def test_invalid_values_name_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError, match=f"^{flag}: "):
        parse("--model", "file:///models/x", *argv)


def test_bad_model_uri_names_the_flag_and_the_uri() -> None:
    with pytest.raises(ConfigError, match=r"--model: .*gs://b/m"):
        parse("--model", "gs://b/m")


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--port=9000"], "--port"),
        (["--served_model_name", "other"], "--served-model-name"),
        (["--served_model_name=other"], "--served-model-name"),
        (["--enforce-eager", "--api_key", "k"], "--api-key"),
    ],
)
def test_extra_args_may_not_override_owned_flags(extra: list[str], flag: str) -> None:
    """In any spelling vLLM's parser accepts (it reads `_` in a flag name as `-`)."""
    with pytest.raises(ConfigError, match=f"arguments after --: .*{flag} is set by pagoda-runtime"):
        parse("--model", "file:///m", extra=extra)


def test_extra_args_that_only_look_like_owned_flags_pass() -> None:
    config = parse("--model", "file:///m", extra=["--model-impl", "vllm", "--portable=1", "--served-model"])
    assert config.extra_args == ("--model-impl", "vllm", "--portable=1", "--served-model")


def test_cli_exits_2_with_the_flag_in_the_message() -> None:
    r = subprocess.run(
        [RUNTIME, "serve", "--model", "file:///m", "--max-num-seqs", "lots"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert "--max-num-seqs" in r.stderr and "lots" in r.stderr


def test_cli_unknown_flag_exits_2() -> None:
    r = subprocess.run(
        [RUNTIME, "serve", "--model", "file:///m", "--bogus"], capture_output=True, timeout=120
    )
    assert r.returncode == 2 and b"--bogus" in r.stderr


GOOD_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
BROKEN_TEMPLATE = "{% for m in messages %}\n{{ m['content'] }\n{% endfor %}"


def test_chat_template_file_or_text_that_compiles_goes_to_vllm(tmp_path: Path) -> None:
    path = tmp_path / "chat.jinja"
    path.write_text(GOOD_TEMPLATE)
    for value in (str(path), GOOD_TEMPLATE, "tool_chat_template_llama3.1_json.jinja"):  # the last: vLLM's own
        config = parse("--model", "file:///m", "--chat-template", value)
        argv = vllm_argv(config, "/m")
        assert argv[argv.index("--chat-template") + 1] == value
    assert "--chat-template" not in vllm_argv(parse("--model", "file:///m"), "/m")


def test_chat_template_that_does_not_compile_names_the_flag_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "chat.jinja"
    path.write_text(BROKEN_TEMPLATE)
    for value in (str(path), BROKEN_TEMPLATE):
        with pytest.raises(ConfigError) as caught:
            parse("--model", "file:///m", "--chat-template", value)
        assert str(caught.value).startswith(
            "--chat-template: Value error, the Jinja chat template does not compile: line 2: unexpected '}'"
        )


def test_cli_refuses_a_broken_chat_template_with_an_invalid_config_message(tmp_path: Path) -> None:
    """Before the engine is imported: exit 2 and the termination message the operator reports."""
    path, message = tmp_path / "chat.jinja", tmp_path / "termination-log"
    path.write_text(BROKEN_TEMPLATE)
    r = subprocess.run(
        [RUNTIME, "serve", "--model", "file:///m", "--chat-template", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PAGODA_TERMINATION_MESSAGE_PATH": str(message)},
    )
    assert r.returncode == 2 and "--chat-template" in r.stderr
    assert message.read_text().startswith(
        "InvalidConfig: --chat-template: Value error, the Jinja chat template does not compile: line 2: "
    )


@pytest.mark.parametrize(("gib_total", "expected"), [(2, 1), (24, 3), (64, 8), (1024, 16)])
def test_cpu_kv_cache_default_is_bounded(gib_total: int, expected: int) -> None:
    assert cpu_kv_cache_default_gib(gib_total * 1024**3) == expected
