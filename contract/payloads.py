"""The JSON that crosses between the runtime and the operator, as pydantic models: defined once, built by the
side that sends it, read by the other.

- `Capacity`: what a runtime answers on contract.CAPACITY_PATH once its model is loaded (runtime/serving/
  capacity.py and server.py; operator/kube/capacity.py), with its start-up record (`StartupRecord`,
  runtime/serving/startup.py; operator/status/startup.py) and its node's model cache (`ModelCacheReport`,
  runtime/models/modelcache.py).
- `ProfileResult`: what `pagoda-runtime profile` writes as its termination message (runtime/profiling/
  result.py and profile.py; operator/status/profile.py).
- `AdapterList` and `AdapterEntry`: the management adapters API's answers (runtime/serving/adapters.py;
  operator/kube/adapters.py), and `AdapterSource`, the body of the operator's PUT.

Names are camelCase on the wire (the field's alias); a producer dumps with `wire()`, which leaves out what it
never set: an optional key it leaves out is absent, not null, and a null it sets (a profile that met the SLO
at no step has a null concurrency) stays. The operator checks a pod's answer rather than trusting it, and
these models say how: a field the operator needs is required; one it can do without is optional, and
`Lenient` (a value of the wrong type or out of range is read as absent) or `OnErrorOmit` (an unreadable item
of a list or object is left out) keep one bad value from discarding the rest of an answer. Unknown keys are
ignored, so that an older operator reads a newer runtime's answer; tests/unit/test_contract_payloads.py holds
each producer's keys to its model's.

Only the standard library and pydantic: the operator and the runtime both import this, and neither side.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    OnErrorOmit,
    Strict,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic.alias_generators import to_camel

T = TypeVar("T")


def _or_none(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except ValidationError:
        return None


# An optional value that reads as absent (None) when it is not what the model says.
Lenient = Annotated[T | None, WrapValidator(_or_none)]


def _whole(value: Any) -> Any:
    """A float that is a whole number as that int (JSON has one kind of number); anything else unchanged."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


# A count of bytes or tokens that a pod reports: a whole number at least 0 (not a bool, not a string).
ByteCount = Annotated[int, BeforeValidator(_whole), Strict(), Field(ge=0)]
# Seconds a pod reports: a finite number at least 0 (not a bool, not a string).
Seconds = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]


class Payload(BaseModel):
    """Base of the payloads: camelCase on the wire, unknown keys ignored (a newer runtime may add some)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    def wire(self) -> dict[str, Any]:
        """The JSON object: the keys the producer set (an optional one it left out stays out), by alias."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


# --- contract.CAPACITY_PATH ---------------------------------------------------------------------------------


class StartupRecord(Payload):
    """The runtime's start-up phases (runtime/serving/startup.py StartupClock), under `startup` once ready.
    Times are RFC 3339 strings (contract.rfc3339); `phases` maps a contract.STARTUP_PHASES name to its
    seconds, in that order, and leaves out a phase it could not read."""

    started_at: Annotated[str, Strict()]
    seconds: Lenient[Seconds] = None
    phases: dict[str, OnErrorOmit[Seconds]]
    ready_at: Lenient[Annotated[str, Strict()]] = None
    model_bytes: Lenient[ByteCount] = None  # the model folder's size, after modelFetch
    fetched_bytes: Lenient[ByteCount] = None  # what modelFetch downloaded: 0 on a cache hit


class CachedModel(Payload):
    """One model in the node's model cache (runtime/models/modelcache.py)."""

    uri: Annotated[str, Strict()]
    bytes: ByteCount
    in_use: Lenient[Annotated[bool, Strict()]] = None
    last_used: Lenient[Annotated[str, Strict()]] = None  # RFC 3339
    revision: Lenient[Annotated[str, Strict()]] = None  # an hf:// model's


class ModelCacheReport(Payload):
    """The node's model cache as this pod saw it (spec.model.cache.scope Node), under `modelCache`: its
    models, biggest first, and its bound."""

    bytes: Lenient[ByteCount] = None
    models: Lenient[list[OnErrorOmit[CachedModel]]] = None
    max_bytes: Lenient[ByteCount] = None


class Capacity(Payload):
    """The answer on contract.CAPACITY_PATH: the KV cache's size and the batch limits as vLLM resolved them
    (runtime/serving/capacity.py), fixed for the pod's life, with the start-up record and the model cache."""

    kv_cache_tokens: int  # tokens the KV cache holds
    max_model_len: int  # tokens per request at most
    max_concurrency: float  # requests of max_model_len tokens that fit at once
    block_size: int | None = None  # tokens per KV-cache block
    max_num_seqs: int | None = None  # sequences in one engine step, at most
    max_num_batched_tokens: int | None = None  # tokens in one engine step, at most
    startup: Lenient[StartupRecord] = None
    model_cache: Lenient[ModelCacheReport] = None


# --- the profile's termination message ----------------------------------------------------------------------


class ProfileSlo(Payload):
    """The objectives profiled against, each on the 95th percentile, in milliseconds."""

    ttft_ms: float
    inter_token_ms: float


class ProfileShape(Payload):
    """The synthetic requests' shape, in tokens."""

    prompt_tokens: int
    output_tokens: int


class ProfileStep(Payload):
    """One concurrency step as measured (runtime/profiling/result.py step_summary)."""

    concurrency: int
    ttft_p95_ms: float
    inter_token_p95_ms: float
    requests_per_second: float
    output_tokens_per_second: float
    requests: int
    errors: int
    meets_slo: bool


class EngineCandidate(Payload):
    """One server `--tune-engine` profiled: its batch settings (null: the replica's) and its capacity (null:
    it failed, or met the SLO at no step)."""

    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    concurrency: int | None = None
    requests_per_second: float | None = None


class EngineChoice(Payload):
    """`engine`, with `--tune-engine` (runtime/profiling/tune.py engine_result): the chosen batch settings
    (null where it leaves the replica's), the goodputs with them and with the baseline, and every run."""

    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    goodput: float | None = None
    baseline_goodput: float | None = None
    candidates: list[EngineCandidate] | None = None


class ProfileResult(Payload):
    """The profile's result: the highest concurrency that meets the SLO (null when the first step misses
    it) with its throughput, and every step measured; `engine` with `--tune-engine`. The runtime writes the
    nulls; the operator reads a missing key as null."""

    slo: ProfileSlo
    shape: ProfileShape | None = None
    concurrency: int | None = None
    requests_per_second: float | None = None
    output_tokens_per_second: float | None = None
    steps: list[ProfileStep] | None = None
    engine: EngineChoice | None = None


# --- contract.ADAPTERS_PATH ---------------------------------------------------------------------------------


class AdapterSource(Payload):
    """The body of `PUT contract.ADAPTERS_PATH/{name}`: the adapter's source URI, and for an hf:// source
    its revision (absent: the default branch)."""

    source: str
    revision: str | None = None


class AdapterEntry(Payload):
    """One adapter as the runtime reports it (runtime/serving/adapters.py Adapter): always its name, source
    and state (Loading, Loaded, Unloading, Failed; Unloaded in a DELETE's answer); `revision` for an hf://
    source pinned to one; what it serves while Loaded or Unloading; why it failed when Failed."""

    name: str
    source: str
    state: str
    revision: str | None = None
    path: str | None = None
    rank: int | None = None
    loaded_at: float | None = None  # epoch seconds
    in_flight: int | None = None
    requests: int | None = None
    reason: str | None = None  # the error's type, e.g. AdapterRankTooLarge
    error: str | None = None


class AdapterList(Payload):
    """The answer to `GET contract.ADAPTERS_PATH`: whether the runtime takes adapters (`--enable-lora`), its
    bounds, and its adapters by name; an entry the operator cannot read is left out."""

    enabled: Lenient[bool] = None
    max_adapters: Lenient[int] = None
    max_rank: Lenient[int] = None
    adapters: Lenient[list[OnErrorOmit[AdapterEntry]]] = None
