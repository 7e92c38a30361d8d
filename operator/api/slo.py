"""spec.slo: the latency a user promises, and how the operator measures what one replica can do within it.

With spec.slo the operator runs a capacity profile (resources/profile.py): a Job that starts one replica's
runtime with the spec's model, engine and resources and loads it with GuideLLM at rising concurrency
(`pagoda-runtime profile`, docs/capacity.md). status.profile then holds the highest concurrency per replica
that meets both objectives, the throughput there and the whole curve. A new profile runs when what the
replica is made of changes (model, engine, resources, image) or the SLO does, or on request (the
pagoda.dev/profile annotation). With tuneEngine (the default) it also chooses the engine's batch settings
for the SLO (runtime/profiling/tune.py), which the replicas then run (resources/profile.py:
with_engine_choice).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, field_validator

from pagoda.contract import (
    PROFILE_OUTPUT_TOKENS,
    PROFILE_PROMPT_TOKENS,
    PROFILE_STEP_SECONDS,
    PROFILE_STREAMS,
    TUNE_MAX_RUNS,
)

from .base import ApiModel
from .rules import MSG_SLO_STREAMS, SLO_MAX_STEPS, SLO_PROFILE_RULES, validations

Stream = Annotated[int, Field(ge=1, le=4096)]


class RequestShape(ApiModel):
    """The requests the objectives hold for: synthetic prompts and outputs of these lengths."""

    prompt_tokens: int = Field(
        default=PROFILE_PROMPT_TOKENS,
        ge=1,
        le=131072,
        description="Tokens in each prompt (the input length).",
    )
    output_tokens: int = Field(
        default=PROFILE_OUTPUT_TOKENS,
        ge=1,
        le=32768,
        description="Tokens each request generates (the output length).",
    )


class ProfilePlan(ApiModel):
    """The concurrency steps of a capacity profile and how long each runs."""

    model_config = ConfigDict(json_schema_extra=validations(SLO_PROFILE_RULES))

    streams: list[Stream] = Field(
        default_factory=lambda: list(PROFILE_STREAMS),
        min_length=1,
        max_length=SLO_MAX_STEPS,
        description="Concurrent streams of each step, increasing (e.g. [1, 2, 4, 8, 16]). The profile stops "
        "counting at the first step that misses the SLO.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    step_seconds: int = Field(
        default=PROFILE_STEP_SECONDS,
        ge=5,
        le=600,
        description="How long each step sends requests, in seconds.",
    )

    @field_validator("streams")
    @classmethod
    def _increasing(cls, value: list[int]) -> list[int]:
        if any(b <= a for a, b in zip(value, value[1:], strict=False)):
            raise ValueError(MSG_SLO_STREAMS)
        return value

    @property
    def seconds(self) -> int:
        """The load's length: every step, at most."""
        return len(self.streams) * self.step_seconds


class SloSpec(ApiModel):
    """Latency objectives at the 95th percentile, for requests of `request`'s shape."""

    ttft_ms: float = Field(
        gt=0, le=600_000, description="Time to first token, 95th percentile, in milliseconds (e.g. 500)."
    )
    inter_token_ms: float = Field(
        gt=0,
        le=60_000,
        description="Time between two streamed tokens, 95th percentile, in milliseconds (e.g. 50).",
    )
    request: RequestShape = Field(default_factory=RequestShape, description="The request shape.")
    profile: ProfilePlan = Field(
        default_factory=ProfilePlan, description="The capacity profile's concurrency steps."
    )
    tune_engine: bool = Field(
        default=True,
        description="The profile also tries other batch settings for the engine fields the spec leaves unset "
        "(maxNumBatchedTokens, maxNumSeqs; the same flag in extraArgs counts as set), each a restart of its "
        "server, and the replicas run the ones with the most requests per second within the SLO "
        f"(status.profile.engine). The profile then takes up to {TUNE_MAX_RUNS} times as long.",
    )
