"""Tier 1: LoRA adapters without an engine: the tiny adapter's files, the checks of an adapter directory,
the LoRA flags, per-adapter counts and metrics, and the adapters API when LoRA is off."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from metric_contract import LORA_METRICS
from prometheus_client.parser import text_string_to_metric_families

from pagoda.runtime.cli import _parser
from pagoda.runtime.serving.adapters import AdapterManager, management_app
from pagoda.runtime.serving.config import ConfigError, ServeConfig, config_from_args
from pagoda.runtime.serving.engine import vllm_argv
from pagoda.runtime.serving.lora import (
    AdapterError,
    AdapterRemoved,
    AdapterTracker,
    TokenCounter,
    check_adapter_dir,
    parse_lora_flag,
    safetensors_shapes,
    shape_mismatch,
    vllm_error,
)
from pagoda.runtime.serving.metrics import ServerStatus, render
from pagoda.runtime.tools.tinyadapter import TARGET_MODULES, TinyAdapterSpec, make_tiny_adapter, module_shapes

RUNTIME = str(Path(sys.executable).parent / "pagoda-runtime")
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def base_model(directory: Path, **overrides: int) -> Path:
    """A Llama-shaped model directory: config.json and weights of the right shapes (zeros)."""
    import torch
    from safetensors.torch import save_file

    config = LLAMA | overrides
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, (fan_in, fan_out) in module_shapes(config).items():
            parent = "self_attn" if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            tensors[f"model.layers.{layer}.{parent}.{module}.weight"] = torch.zeros(fan_out, fan_in)
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("lora")
    base = base_model(root / "base")
    other = base_model(root / "other", hidden_size=48)
    return SimpleNamespace(
        root=root,
        base=base,
        adapter=make_tiny_adapter(base, root / "a", TinyAdapterSpec(rank=8, seed=1)),
        same=make_tiny_adapter(base, root / "a-again", TinyAdapterSpec(rank=8, seed=1)),
        reseeded=make_tiny_adapter(base, root / "b", TinyAdapterSpec(rank=8, seed=2)),
        rank16=make_tiny_adapter(base, root / "r16", TinyAdapterSpec(rank=16)),
        foreign=make_tiny_adapter(other, root / "foreign"),
    )


def test_tiny_adapter_is_peft_lora_with_the_models_shapes(models: SimpleNamespace) -> None:
    from safetensors.torch import load_file

    config = json.loads((models.adapter / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["bias"]) == ("LORA", 8, "none")
    assert config["target_modules"] == list(TARGET_MODULES)
    tensors = load_file(str(models.adapter / "adapter_model.safetensors"))
    assert len(tensors) == LLAMA["num_hidden_layers"] * len(TARGET_MODULES) * 2
    head_dim = LLAMA["hidden_size"] // LLAMA["num_attention_heads"]
    k_out = LLAMA["num_key_value_heads"] * head_dim
    a = tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight"]
    b = tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"]
    assert (tuple(a.shape), tuple(b.shape)) == ((8, 32), (k_out, 8))
    down_b = tensors["base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"]
    assert tuple(down_b.shape) == (32, 8) and float(down_b.abs().min()) > 0  # B is not PEFT's zeros
    shapes = safetensors_shapes(models.adapter / "adapter_model.safetensors")
    assert shapes["base_model.model.model.layers.0.mlp.up_proj.lora_A.weight"] == [8, 32]


def test_tiny_adapter_is_deterministic_per_seed(models: SimpleNamespace) -> None:
    weights = "adapter_model.safetensors"
    assert (models.adapter / weights).read_bytes() == (models.same / weights).read_bytes()
    assert (models.adapter / weights).read_bytes() != (models.reseeded / weights).read_bytes()


def test_make_tiny_adapter_cli(models: SimpleNamespace) -> None:
    out = models.root / "cli"
    args = [RUNTIME, "make-tiny-adapter", "--model", str(models.base), "--out", str(out), "--rank", "4"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 4
    bad = subprocess.run([*args[:-1], "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--rank" in bad.stderr


def test_a_fitting_adapter_passes_the_checks(models: SimpleNamespace) -> None:
    files = check_adapter_dir("sql", "file:///a", models.adapter, models.base, max_rank=8)
    assert (files.rank, files.base_model) == (8, str(models.base))


@pytest.mark.parametrize(
    ("adapter", "max_rank", "kind", "needle"),
    [
        ("missing", 16, "AdapterSourceNotFound", "does not exist"),
        ("base", 16, "AdapterInvalid", "no adapter_config.json"),
        ("rank16", 8, "AdapterRankTooLarge", "rank 16 is above this server's maximum 8 (--max-lora-rank)"),
        (
            "foreign",
            16,
            "AdapterBaseModelMismatch",
            "model.layers.0.mlp.down_proj is 32x64 in the base model",
        ),
    ],
)
def test_a_bad_adapter_is_named_with_its_problem(
    models: SimpleNamespace, adapter: str, max_rank: int, kind: str, needle: str
) -> None:
    path = models.root / "nope" if adapter == "missing" else getattr(models, adapter)
    with pytest.raises(AdapterError) as caught:
        check_adapter_dir("sql", "s3://b/sql", path, models.base, max_rank)
    assert (caught.value.kind, caught.value.status) == (kind, 422)
    assert str(caught.value).startswith("adapter sql (s3://b/sql): ") and needle in str(caught.value)


def test_unreadable_adapter_config_is_invalid(tmp_path: Path, models: SimpleNamespace) -> None:
    (tmp_path / "adapter_config.json").write_text("{not json")
    with pytest.raises(AdapterError, match="is not a PEFT LoRA config") as caught:
        check_adapter_dir("sql", "file:///x", tmp_path, models.base, 8)
    assert caught.value.kind == "AdapterInvalid"


def test_quantized_base_weights_are_left_to_vllm() -> None:
    adapter = {
        "base_model.model.m.q_proj.lora_A.weight": [8, 99],
        "base_model.model.m.q_proj.lora_B.weight": [7, 8],
    }
    assert shape_mismatch(adapter, {"m.q_proj.qweight": [4, 4]}) is None
    assert "m.q_proj is 7x32" in str(shape_mismatch(adapter, {"m.q_proj.weight": [7, 32]}))


def parse(*argv: str, extra: list[str] | None = None) -> ServeConfig:
    ns: argparse.Namespace = _parser().parse_args(["serve", "--model", "file:///m/tiny", *argv])
    return config_from_args(ns, extra or [])


def test_lora_flags_reach_vllm() -> None:
    config = parse(
        "--lora", "sql=file:///adapters/sql", "--lora", "chat=s3://bucket/chat", "--max-loras", "2",
        "--max-lora-rank", "16", "--max-cpu-loras", "4",
    )  # fmt: skip
    assert config.lora_enabled and config.lora == ("sql=file:///adapters/sql", "chat=s3://bucket/chat")
    argv = vllm_argv(config, "/m/tiny")
    i = argv.index("--enable-lora")
    assert argv[i + 1 : i + 7] == ["--max-loras", "2", "--max-lora-rank", "16", "--max-cpu-loras", "4"]
    assert "--lora-modules" not in argv  # the runtime loads the adapters itself


def test_lora_is_off_unless_asked_for_and_any_lora_flag_turns_it_on() -> None:
    assert not parse().lora_enabled and "--enable-lora" not in vllm_argv(parse(), "/m")
    assert parse("--enable-lora").lora_enabled
    assert parse("--max-lora-rank", "64").lora_enabled
    assert vllm_argv(parse("--enable-lora"), "/m")[-1] == "--enable-lora"  # vLLM's defaults otherwise


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lora", "sql"], "--lora: .*use NAME=SOURCE"),
        (["--lora", "Bad Name=file:///a"], "--lora: .*adapter name 'Bad Name'"),
        (["--lora", "sql=gs://b/a"], "--lora: .*adapter sql: source 'gs://b/a'"),
        (["--lora", "a=file:///a", "--lora", "a=file:///b", "--max-cpu-loras", "2"], "--lora: .*given twice"),
        (["--lora", "tiny=file:///a"], "--lora: .*the served model's name"),
        (
            ["--lora", "a=file:///a", "--lora", "b=file:///b"],
            "--lora: .*2 adapters but a replica holds at most 1",
        ),
        (["--max-lora-rank", "7"], "--max-lora-rank: .*must be one of 1, 8, 16"),
        (["--max-loras", "0"], "--max-loras: "),
        (["--max-loras", "4", "--max-cpu-loras", "2"], r"--max-cpu-loras: .*at least --max-loras \(4\)"),
    ],
)
def test_bad_lora_flags_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{message}"):
        parse(*argv)


@pytest.mark.parametrize("extra", [["--max-loras=4"], ["--enable_lora"], ["--lora-modules", "a=/a"]])
def test_lora_flags_after_dashdash_are_owned(extra: list[str]) -> None:
    with pytest.raises(ConfigError, match="is set by pagoda-runtime itself"):
        parse(extra=extra)


def test_parse_lora_flag_keeps_equals_in_the_source() -> None:
    assert parse_lora_flag("sql=s3://bucket/a=b") == ("sql", "s3://bucket/a=b")


def test_vllms_wrapped_worker_error_is_unwrapped() -> None:
    # What vLLM 0.32's add_lora raised on the CPU backend for an adapter of rank 16 (max 8).
    raw = (
        "Call to add_lora method failed: Worker failed with error 'LoRA rank 16 is greater than "
        "max_lora_rank 8.', please check the stack trace above for the root cause"
    )
    assert vllm_error(raw) == "LoRA rank 16 is greater than max_lora_rank 8."
    assert vllm_error("Call to add_lora method failed: boom") == "boom"


def outputs(*completions: tuple[int, int]) -> SimpleNamespace:
    """A RequestOutput's shape: (index, token count) per completion."""
    return SimpleNamespace(outputs=[SimpleNamespace(index=i, token_ids=[0] * n) for i, n in completions])


def test_token_counter_for_delta_and_cumulative_outputs() -> None:
    delta = TokenCounter(delta=True)
    for out in (outputs((0, 1)), outputs((0, 1), (1, 2)), outputs((1, 1))):
        delta.add(out)
    assert delta.total == 5
    cumulative = TokenCounter(delta=False)
    for out in (outputs((0, 1)), outputs((0, 3), (1, 2)), outputs((1, 4))):
        cumulative.add(out)
    assert cumulative.total == 7


def test_tracker_counts_and_drains_one_adapter_version() -> None:
    async def scenario() -> None:
        tracker = AdapterTracker()
        release = asyncio.Event()

        async def request() -> None:
            with tracker.serving("sql", 1) as counts:
                counts.generation_tokens += 3
                await release.wait()

        task = asyncio.create_task(request())
        await asyncio.sleep(0)
        assert tracker.in_flight == {1: 1}
        drain = asyncio.create_task(tracker.drain(1))
        await asyncio.sleep(0)
        assert not drain.done()
        with pytest.raises(AdapterRemoved), tracker.serving("sql", 1):
            pass
        with tracker.serving("sql", 2):  # the replacement version still serves
            pass
        release.set()
        await asyncio.wait_for(drain, 5)
        await task
        assert tracker.in_flight == {}
        assert (tracker.counts["sql"].requests, tracker.counts["sql"].generation_tokens) == (2, 3)

    asyncio.run(scenario())


def test_per_adapter_metrics() -> None:
    tracker = AdapterTracker()
    with tracker.serving("sql", 1) as counts:
        counts.generation_tokens += 12
    status = ServerStatus(model_name="tiny", adapters=tracker)
    found = {
        (s.name, s.labels.get("adapter")): s.value
        for family in text_string_to_metric_families(render(status, None).decode())
        for s in family.samples
    }
    assert found[("pagoda_lora_requests_total", "sql")] == 1
    assert found[("pagoda_lora_generation_tokens_total", "sql")] == 12
    assert {name for name, _ in found} >= LORA_METRICS
    without = render(ServerStatus(model_name="tiny"), None).decode()
    assert "pagoda_lora" not in without


def test_adapters_api_without_lora() -> None:
    from starlette.testclient import TestClient

    manager = AdapterManager("tiny", "/tmp/cache", drain_timeout=1, enabled=False)
    client = TestClient(management_app(manager))
    listed = client.get("/v1/pagoda/adapters")
    assert listed.status_code == 200 and listed.json()["enabled"] is False and listed.json()["adapters"] == []
    put = client.put("/v1/pagoda/adapters/sql", json={"source": "file:///adapters/sql"})
    assert put.status_code == 409 and put.json()["error"]["type"] == "LoRADisabled"
    assert "--enable-lora" in put.json()["error"]["message"]
    bad = client.put("/v1/pagoda/adapters/sql", json={"src": "x"})
    assert bad.status_code == 400 and '{"source": "<URI>"}' in bad.json()["error"]["message"]
    unknown = client.delete("/v1/pagoda/adapters/sql")
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "AdapterNotFound"
    bad_name = client.put("/v1/pagoda/adapters/-x-", json={"source": "file:///a"})
    assert bad_name.status_code == 400 and "adapter name '-x-'" in bad_name.json()["error"]["message"]
