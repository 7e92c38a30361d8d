"""benchmarks/bench_lora.py's merge of a LoRA adapter into a copy of its base model (the merged side): the
part of the LoRA benchmark that its tier-3 smoke run (tests/runtime/test_rt_bench_smoke.py, against a runtime
that serves no adapter) cannot reach. A merged layer computes what the base layer plus the adapter compute;
nothing else changes; an adapter it cannot merge exactly is refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pagoda.runtime.tools.tinyadapter import TARGET_MODULES, TinyAdapterSpec, make_tiny_adapter, module_shapes
from pagoda.runtime.tools.tinymodel import TinyModelSpec, make_tiny_model
from tests.repo import REPO

sys.path.insert(0, str(REPO / "benchmarks"))  # as when it runs as a script: it imports benchmarks/servers.py
import bench_lora  # noqa: E402

# The benchmark's model in small: the same writer, narrower and shallower.
SMALL = TinyModelSpec(
    hidden_size=32, intermediate_size=64, num_layers=2, num_kv_heads=2, corpus_bytes=100_000
)
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("bench-lora") / "tiny", SMALL)


def weight(layer: int, module: str) -> str:
    return f"model.layers.{layer}.{'self_attn' if module in ATTENTION else 'mlp'}.{module}.weight"


def test_a_merged_layer_computes_the_base_layer_plus_the_adapter(model: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    spec = TinyAdapterSpec(rank=8, alpha=16, seed=1)
    adapter = make_tiny_adapter(model, tmp_path / "adapter", spec)
    merged = bench_lora.merge_adapter(model, adapter, tmp_path / "merged")

    base, out = load_file(str(model / "model.safetensors")), load_file(str(merged / "model.safetensors"))
    lora = load_file(str(adapter / "adapter_model.safetensors"))
    adapted = {weight(layer, module) for layer in range(SMALL.num_layers) for module in TARGET_MODULES}
    assert set(out) == set(base)
    for key in set(base) - adapted:  # embeddings and norms: untouched
        assert torch.equal(out[key], base[key]), key
    x = torch.randn(
        3, SMALL.intermediate_size, generator=torch.Generator().manual_seed(9), dtype=torch.float64
    )
    config = json.loads((model / "config.json").read_text())
    for layer in range(SMALL.num_layers):
        for module, (fan_in, _) in module_shapes(config).items():
            key = f"base_model.model.{weight(layer, module).removesuffix('.weight')}"
            a, b = lora[f"{key}.lora_A.weight"].double(), lora[f"{key}.lora_B.weight"].double()
            w, merged_w = base[weight(layer, module)].double(), out[weight(layer, module)].double()
            inputs = x[:, :fan_in]
            # What vLLM computes for the adapter at run time: the base layer, plus B(A x) scaled by alpha / r.
            expected = inputs @ w.T + (spec.alpha / spec.rank) * ((inputs @ a.T) @ b.T)
            torch.testing.assert_close(inputs @ merged_w.T, expected, rtol=1e-5, atol=1e-6)
            assert not torch.equal(merged_w, w)
    for file in model.iterdir():  # the tokenizer and configs come along unchanged
        if file.suffix != ".safetensors":
            assert (merged / file.name).read_bytes() == file.read_bytes(), file.name


def test_an_adapter_it_cannot_merge_exactly_is_refused(model: Path, tmp_path: Path) -> None:
    dora = make_tiny_adapter(model, tmp_path / "dora")
    config = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps(config | {"use_dora": True}))
    with pytest.raises(ValueError, match="only plain LoRA adapters"):
        bench_lora.merge_adapter(model, dora, tmp_path / "merged-dora")
    # An adapter for a deeper model (only its config.json is read): layers the base lacks are not skipped.
    deeper = tmp_path / "deeper"
    deeper.mkdir()
    config = json.loads((model / "config.json").read_text())
    (deeper / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 3}))
    with pytest.raises(ValueError, match="merged 14 layers, the adapter has more"):
        bench_lora.merge_adapter(
            model, make_tiny_adapter(deeper, tmp_path / "deep"), tmp_path / "merged-deep"
        )
