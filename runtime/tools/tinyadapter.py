"""`pagoda-runtime make-tiny-adapter`: a random-weight LoRA adapter in PEFT's format for a Llama-shaped model.

Written directly with torch and safetensors (what PEFT's `save_pretrained` writes, without PEFT): the shapes
come from the base model's config.json, and both factors are random and non-zero (PEFT initialises B to
zero, which would leave the model unchanged), so greedy outputs through the adapter differ from the base
model's. For tests and the demo; nothing is downloaded.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("pagoda.runtime.tools.tinyadapter")

# Llama's linear layers, as PEFT names them, and where each sits in a decoder layer.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_PARENT = {m: "self_attn" for m in TARGET_MODULES[:4]} | {m: "mlp" for m in TARGET_MODULES[4:]}
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


@dataclass(frozen=True)
class TinyAdapterSpec:
    rank: int = 8
    alpha: int = 16
    seed: int = 0
    scale: float = 0.05  # standard deviation of B; A is scaled by 1/sqrt(in_features)


def module_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each target module, from a Llama config.json."""
    h = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or h // heads)
    kv = int(config.get("num_key_value_heads") or heads) * head_dim
    i = int(config["intermediate_size"])
    return {
        "q_proj": (h, heads * head_dim),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (heads * head_dim, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }


def tensor_name(layer: int, module: str, factor: str) -> str:
    """PEFT's key: `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`."""
    return f"base_model.model.model.layers.{layer}.{_PARENT[module]}.{module}.lora_{factor}.weight"


def make_tiny_adapter(model: str | Path, out: str | Path, spec: TinyAdapterSpec | None = None) -> Path:
    """Write adapter_config.json and adapter_model.safetensors into `out` for the model at `model` (only its
    config.json is read); return `out`."""
    import torch
    from safetensors.torch import save_file

    spec = spec or TinyAdapterSpec()
    if spec.rank < 1:
        raise ValueError(f"rank must be at least 1 (got {spec.rank})")
    model_dir, target = Path(model), Path(out)
    config = json.loads((model_dir / "config.json").read_text())
    shapes = module_shapes(config)
    gen = torch.Generator().manual_seed(spec.seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(int(config["num_hidden_layers"])):
        for module, (fan_in, fan_out) in shapes.items():
            a = torch.randn(spec.rank, fan_in, generator=gen) / fan_in**0.5
            b = torch.randn(fan_out, spec.rank, generator=gen) * spec.scale
            tensors[tensor_name(layer, module, "A")] = a
            tensors[tensor_name(layer, module, "B")] = b
    adapter_config = {
        "base_model_name_or_path": str(model_dir),
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(TARGET_MODULES),
        "fan_in_fan_out": False,
        "inference_mode": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    target.mkdir(parents=True, exist_ok=True)
    (target / CONFIG_FILE).write_text(json.dumps(adapter_config, indent=2) + "\n")
    save_file(tensors, str(target / WEIGHTS_FILE), metadata={"format": "pt"})
    log.info("Wrote tiny adapter path=%s model=%s rank=%d seed=%d", target, model_dir, spec.rank, spec.seed)
    return target
