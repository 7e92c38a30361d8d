"""spec.engine: the vLLM engine settings, passed to the runtime as command-line flags."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from pagoda import contract
from pagoda.contract.chattemplate import compile_error

from .base import ApiModel, ObjectName
from .rules import (
    CHAT_TEMPLATE_RULES,
    ENGINE_RULES,
    MSG_BATCHED_TOKENS,
    MSG_CHAT_TEMPLATE,
    MSG_EXTRA_ARGS,
    MSG_GPU_MEMORY,
    OWNED_FLAG_PATTERN,
    validations,
)

# The spec's "none" beside the runtime's methods (it gives no --quantization then).
if TYPE_CHECKING:
    Quantization = str
else:
    Quantization = Literal[("none", *contract.QUANTIZATIONS)]

# A ConfigMap's data key, as the API server accepts it.
CONFIG_MAP_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
# Of an inline template: chat templates are a few KiB (the largest common ones about 20 KiB); a larger one
# goes in a ConfigMap (up to 1 MiB).
MAX_INLINE_TEMPLATE = 65536


class ConfigMapKeyRef(ApiModel):
    """A key of a ConfigMap in the same namespace."""

    name: ObjectName = Field(description="ConfigMap name.")
    key: str = Field(
        min_length=1,
        max_length=253,
        pattern=CONFIG_MAP_KEY_PATTERN,
        description="Key within the ConfigMap's data (not binaryData).",
    )


class ChatTemplate(ApiModel):
    """A Jinja chat template for the engine instead of the model's own (vLLM's --chat-template)."""

    model_config = ConfigDict(json_schema_extra=validations(CHAT_TEMPLATE_RULES))

    inline: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_INLINE_TEMPLATE,
        description="The template itself. One that does not compile is refused (Degraded, InvalidSpec, "
        "with its line and jinja2's message) and nothing rolls out.",
    )
    config_map: ConfigMapKeyRef | None = Field(
        default=None,
        description="The template from a key of a ConfigMap in the same namespace. The operator reads it, "
        "compiles it and copies it into its own ConfigMap <name>-chat-template, which the pods mount; one "
        "that is missing or does not compile is reported (Degraded, ChatTemplateNotFound or "
        "ChatTemplateInvalid) and nothing rolls out. ConfigMaps are not watched: an edit rolls the pods "
        "within one resync of the operator (--resync-seconds, 5 minutes by default).",
    )

    @field_validator("inline")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        # Compiled (not rendered) with jinja2's sandbox as vLLM renders it (contract/chattemplate.py): a
        # template that cannot compile would fail every chat request of every pod it rolled out to.
        if value is not None and (error := compile_error(value)) is not None:
            raise ValueError(f"the Jinja template does not compile: {error}")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> ChatTemplate:
        if (self.inline is None) == (self.config_map is None):
            raise ValueError(MSG_CHAT_TEMPLATE)
        return self


class EngineSpec(ApiModel):
    """vLLM engine settings; each maps to one runtime flag."""

    model_config = ConfigDict(json_schema_extra=validations(ENGINE_RULES))

    dtype: contract.Dtype = Field(default="auto", description="Weight and activation dtype (--dtype).")
    quantization: Quantization = Field(
        default="none",
        description="Quantization method of the weights (--quantization); none for full precision.",
    )
    tensor_parallel_size: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="GPUs one replica shards the model over (--tensor-parallel-size). Must equal "
        "resources.gpu.count; defaults to it.",
    )
    max_model_len: int | None = Field(
        default=None,
        ge=16,
        le=10_000_000,
        description="Maximum context length in tokens (--max-model-len); the model's own when unset.",
    )
    gpu_memory_utilization: float = Field(
        default=0.90,
        description="Fraction of each GPU's memory vLLM may use for weights and KV cache, in (0, 1] "
        "(--gpu-memory-utilization).",
    )
    block_size: contract.BlockSize = Field(
        default=16, description="KV-cache block size in tokens for PagedAttention (--block-size)."
    )
    enable_prefix_caching: bool = Field(
        default=True,
        description="Reuse KV cache across requests sharing a prompt prefix (--enable-prefix-caching).",
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="Maximum sequences batched together per step (--max-num-seqs); vLLM's default for the "
        "device when unset, or the capacity profile's choice (spec.slo.tuneEngine).",
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=1,
        le=10_000_000,
        description="Maximum tokens one engine step carries, decodes and prompt chunks together "
        "(--max-num-batched-tokens); vLLM's default for the device when unset, or the capacity profile's "
        "choice (spec.slo.tuneEngine).",
    )
    chat_template: ChatTemplate | None = Field(
        default=None,
        description="A Jinja chat template for /v1/chat/completions instead of the one in the model's "
        "tokenizer config (--chat-template), inline or from a ConfigMap; checked with jinja2's sandbox, "
        "the environment vLLM renders it in, before any pod gets it.",
    )
    extra_args: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list,
        max_length=64,
        description="Further vLLM engine arguments, passed verbatim after `--` (e.g. [--enforce-eager]).",
    )

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _fraction(cls, value: float) -> float:
        if not 0.0 < value <= 1.0:
            raise ValueError(MSG_GPU_MEMORY)
        return value

    @field_validator("extra_args")
    @classmethod
    def _not_owned(cls, value: list[str]) -> list[str]:
        if any(re.match(OWNED_FLAG_PATTERN, arg) for arg in value):
            raise ValueError(MSG_EXTRA_ARGS)
        return value

    @model_validator(mode="after")
    def _batch_holds_its_sequences(self) -> EngineSpec:
        if not batch_holds_its_sequences(self.max_num_batched_tokens, self.max_num_seqs):
            raise ValueError(MSG_BATCHED_TOKENS)
        return self


def batch_holds_its_sequences(tokens: int | None, seqs: int | None) -> bool:
    """vLLM's rule for a step: a token budget of at least the batch's width (either unset: its default)."""
    return tokens is None or seqs is None or tokens >= seqs
