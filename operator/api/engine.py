"""spec.engine: the vLLM engine settings, passed to the runtime as command-line flags."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import ConfigDict, Field, field_validator

from pagoda.runtime import contract

from .base import ApiModel
from .rules import ENGINE_RULES, MSG_EXTRA_ARGS, MSG_GPU_MEMORY, OWNED_FLAG_PATTERN, validations

# The spec's "none" beside the runtime's methods (it gives no --quantization then).
if TYPE_CHECKING:
    Quantization = str
else:
    Quantization = Literal[("none", *contract.QUANTIZATIONS)]


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
        description="Maximum sequences batched together per step (--max-num-seqs).",
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
