"""`pagoda-runtime make-tiny-model DIR`: a tiny random-weight Llama with a locally trained tokenizer.

Nothing is downloaded. The tokenizer is a byte-level BPE trained with the `tokenizers` library on
Python's own standard-library sources (always present where Python is), and the weights are drawn from
a seeded generator, so the same seed writes the same model on the same Python version.
"""

from __future__ import annotations

import json
import logging
import sysconfig
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("pagoda.runtime.tools.tinymodel")

BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
SPECIAL_TOKENS = [BOS, EOS, PAD, UNK, "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

# A compact chat template: one role marker per message, generation prompt ends with the assistant marker.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    vocab_size: int = 2048
    hidden_size: int = 256
    intermediate_size: int = 512
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 4
    max_position_embeddings: int = 4096
    seed: int = 0
    corpus_bytes: int = 1_500_000


def _corpus(limit: int) -> list[str]:
    """Python standard-library sources, in a fixed order, up to `limit` bytes."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total >= limit:
            break
    if not texts:
        raise RuntimeError(f"no training text found under {stdlib}")
    return texts


def _train_tokenizer(spec: TinyModelSpec, out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(spec.corpus_bytes), trainer=trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "model_max_length": spec.max_position_embeddings,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def _write_configs(spec: TinyModelSpec, out: Path, vocab: dict[str, int]) -> None:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.hidden_size // spec.num_heads,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "bos_token_id": vocab[BOS],
        "eos_token_id": vocab[EOS],
        "pad_token_id": vocab[PAD],
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": vocab[BOS], "eos_token_id": vocab[EOS], "pad_token_id": vocab[PAD]}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def _write_weights(spec: TinyModelSpec, out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(spec.seed)
    h, i, head = spec.hidden_size, spec.intermediate_size, spec.hidden_size // spec.num_heads
    kv = spec.num_kv_heads * head

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * 0.02

    tensors: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rand(spec.vocab_size, h)}
    for n in range(spec.num_layers):
        p = f"model.layers.{n}."
        tensors[p + "self_attn.q_proj.weight"] = rand(h, h)
        tensors[p + "self_attn.k_proj.weight"] = rand(kv, h)
        tensors[p + "self_attn.v_proj.weight"] = rand(kv, h)
        tensors[p + "self_attn.o_proj.weight"] = rand(h, h)
        tensors[p + "mlp.gate_proj.weight"] = rand(i, h)
        tensors[p + "mlp.up_proj.weight"] = rand(i, h)
        tensors[p + "mlp.down_proj.weight"] = rand(h, i)
        tensors[p + "input_layernorm.weight"] = torch.ones(h)
        tensors[p + "post_attention_layernorm.weight"] = torch.ones(h)
    tensors["model.norm.weight"] = torch.ones(h)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def make_tiny_model(directory: str | Path, spec: TinyModelSpec | None = None) -> Path:
    """Write the tiny model into `directory` (created if missing) and return its path."""
    spec = spec or TinyModelSpec()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    _train_tokenizer(spec, out)
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    _write_configs(spec, out, vocab)
    _write_weights(spec, out)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    log.info("Wrote tiny model path=%s bytes=%d seed=%d", out, size, spec.seed)
    return out
