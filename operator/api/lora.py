"""spec.lora: LoRA adapters served beside the base model, and the engine limits that go with them.

The limits are runtime flags (--max-loras, --max-lora-rank, --max-cpu-loras) in the pod template: changing
them rolls the pods. The adapters are not in the pod template: the operator loads and unloads them in every
Ready replica at run time through the runtime's adapters API (kube/adapters.py), so adding, changing or
removing one restarts nothing.
"""

from __future__ import annotations

import re

from pydantic import ConfigDict, Field, field_validator, model_validator

from pagoda import contract

from .base import ApiModel
from .rules import (
    ADAPTER_RULES,
    LORA_RULES,
    MSG_ADAPTER_REVISION,
    MSG_ADAPTER_URI,
    MSG_LORA_ADAPTERS,
    MSG_LORA_CPU,
    URI_PATTERN,
    validations,
)

LoraRank = contract.LoraRank  # vLLM's MaxLoRARanks
MAX_ADAPTERS = 64


class LoraAdapter(ApiModel):
    """One adapter: its model name on the OpenAI API and where its weights are."""

    model_config = ConfigDict(json_schema_extra=validations(ADAPTER_RULES))

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=contract.ADAPTER_NAME_PATTERN,
        description="Model name clients send as `model`: 1-63 letters, digits, '.', '_' or '-', starting "
        "and ending with a letter or digit; not the base model's served name.",
    )
    uri: str = Field(
        max_length=2048,
        description="Where the adapter is, with the base model's schemes and credentials "
        "(spec.model.credentialsSecret): hf://org/name, s3://bucket/path, pvc://claim/path (the claim is "
        f"mounted read-only at {contract.MODELS_DIR}/<claim>) or file:///path. Changing it replaces the "
        "adapter in "
        "each replica without a gap.",
    )
    revision: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description="Hub revision (branch, tag or commit) of an hf:// adapter, as spec.model.revision is for "
        "the model; only with an hf:// uri. Changing it replaces the adapter in each replica without a gap.",
    )

    @field_validator("uri")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if not re.match(URI_PATTERN, value):
            raise ValueError(MSG_ADAPTER_URI)
        return value

    @model_validator(mode="after")
    def _revision_needs_hf(self) -> LoraAdapter:
        if self.revision is not None and not self.uri.startswith("hf://"):
            raise ValueError(MSG_ADAPTER_REVISION)
        return self

    @property
    def pvc_claim(self) -> str | None:
        if not self.uri.startswith("pvc://"):
            return None
        return self.uri.removeprefix("pvc://").split("/", 1)[0]


class LoraSpec(ApiModel):
    """LoRA adapters and the engine's LoRA limits (runtime flags; changing a limit restarts the pods,
    changing the adapters does not)."""

    model_config = ConfigDict(json_schema_extra=validations(LORA_RULES))

    max_loras: int = Field(
        default=1,
        ge=1,
        le=MAX_ADAPTERS,
        description="Adapters in one batch, resident on the GPU (--max-loras); each slot reserves memory "
        "for an adapter of maxLoraRank.",
    )
    max_lora_rank: LoraRank = Field(
        default=16,
        description="The highest rank an adapter may have (--max-lora-rank): 1, 8, 16, 32, 64, 128, 256, "
        "320 or 512. An adapter of a higher rank fails to load (AdapterRankTooLarge).",
    )
    max_cpu_loras: int | None = Field(
        default=None,
        ge=1,
        le=MAX_ADAPTERS,
        description="Adapters one replica holds in memory, and so the most it serves (--max-cpu-loras); at "
        "least maxLoras, which is its default.",
    )
    adapters: list[LoraAdapter] = Field(
        default_factory=list,
        max_length=MAX_ADAPTERS,
        description="The adapters every replica serves, loaded at run time (no restart); at most "
        "maxCpuLoras.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @model_validator(mode="after")
    def _limits(self) -> LoraSpec:
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(MSG_LORA_CPU)
        if len(self.adapters) > self.held:
            raise ValueError(MSG_LORA_ADAPTERS)
        names = [adapter.name for adapter in self.adapters]
        if len(set(names)) != len(names):
            raise ValueError(f"spec.lora.adapters: duplicate names in {names}")
        return self

    @property
    def held(self) -> int:
        """Adapters one replica holds (--max-cpu-loras, defaulting to --max-loras)."""
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras
