"""The profile's result from GuideLLM's JSON report: each concurrency step's latencies and throughput, the
highest concurrency that meets the SLO, and the compact JSON the termination message carries
(contract/payloads.py ProfileResult, which the operator reads into status.profile).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from pagoda.contract.payloads import ProfileResult, ProfileShape, ProfileSlo, ProfileStep
from pagoda.runtime.profiling.config import Slo

MAX_RESULT_BYTES = 4000  # the kubelet keeps 4096 bytes of a termination message
MAX_ERROR_RATIO = 0.05  # a step with more errored requests than this misses the SLO


def _at(data: Any, path: str) -> Any:
    """The value at a dotted `path` of a report's dicts; KeyError naming the path when it is missing."""
    for key in path.split("."):
        if not isinstance(data, Mapping) or key not in data:
            raise KeyError(f"GuideLLM's report has no {path}")
        data = data[key]
    return data


def _number(data: Any, path: str) -> float:
    value = _at(data, path)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise KeyError(f"GuideLLM's report has no number at {path} (got {value!r})")
    return float(value)


def _round(value: float) -> float:
    """Four significant digits: enough for a latency or a rate, short in the termination message."""
    return float(f"{value:.4g}") if math.isfinite(value) else 0.0


def step_summary(benchmark: Mapping[str, Any], slo: Slo) -> ProfileStep:
    """One concurrency step from one of GuideLLM 0.8.1's `benchmarks[i]` (its JSON output), read at:

    - `config.strategy.streams`: the step's concurrency;
    - `metrics.time_to_first_token_ms.successful.percentiles.p95` and
      `metrics.inter_token_latency_ms.successful.percentiles.p95`: the p95s, over successful requests;
    - `metrics.requests_per_second.successful.mean`, `metrics.output_tokens_per_second.successful.mean`;
    - `metrics.request_totals.successful` and `.errored`: `requests` counts both (requests the step's end
      cut off, `.incomplete`, are not counted), `errors` the errored ones.

    It meets the SLO when both p95s are within the objectives, at least one request succeeded and at most
    MAX_ERROR_RATIO of its requests errored."""
    metrics = _at(benchmark, "metrics")
    successful = int(_number(metrics, "request_totals.successful"))
    errors = int(_number(metrics, "request_totals.errored"))
    ttft = _number(metrics, "time_to_first_token_ms.successful.percentiles.p95")
    itl = _number(metrics, "inter_token_latency_ms.successful.percentiles.p95")
    requests = successful + errors
    meets = (
        successful > 0
        and errors <= MAX_ERROR_RATIO * requests
        and ttft <= slo.ttft_ms
        and itl <= slo.inter_token_ms
    )
    return ProfileStep(
        concurrency=int(_number(benchmark, "config.strategy.streams")),
        ttft_p95_ms=_round(ttft),
        inter_token_p95_ms=_round(itl),
        requests_per_second=_round(_number(metrics, "requests_per_second.successful.mean")),
        output_tokens_per_second=_round(_number(metrics, "output_tokens_per_second.successful.mean")),
        requests=requests,
        errors=errors,
        meets_slo=bool(meets),
    )


def summarize(report: Mapping[str, Any], slo: Slo, prompt_tokens: int, output_tokens: int) -> ProfileResult:
    """The profile's result from GuideLLM's JSON report (`benchmarks`, one per step, in the order run; see
    `step_summary`): the steps, and the highest concurrency that meets the SLO counting up from the first
    step and stopping at the first that misses it (null when the first does), with its throughput. Rounded
    to four significant digits; when the JSON would exceed MAX_RESULT_BYTES (more than config.MAX_STEPS
    steps) the last steps are left out of `steps`. KeyError or ValueError when the report lacks what is
    read."""
    benchmarks = _at(report, "benchmarks")
    if not isinstance(benchmarks, list) or not benchmarks:
        raise ValueError("GuideLLM's report has no benchmarks")
    steps = sorted((step_summary(b, slo) for b in benchmarks), key=lambda step: step.concurrency)
    chosen: ProfileStep | None = None
    for step in steps:
        if not step.meets_slo:
            break
        chosen = step
    # Every key is set, the nulls too: the result has them all (payloads.ProfileResult).
    result = ProfileResult(
        slo=ProfileSlo(ttft_ms=slo.ttft_ms, inter_token_ms=slo.inter_token_ms),
        shape=ProfileShape(prompt_tokens=prompt_tokens, output_tokens=output_tokens),
        concurrency=chosen.concurrency if chosen else None,
        requests_per_second=chosen.requests_per_second if chosen else None,
        output_tokens_per_second=chosen.output_tokens_per_second if chosen else None,
        steps=steps,
    )
    return fit(result)


def fit(result: ProfileResult) -> ProfileResult:
    """`result` with the last steps left out while its JSON exceeds MAX_RESULT_BYTES (config.MAX_STEPS steps
    alone fit; with the engine's candidates too the last steps may go; the capacity and the choice are
    outside the steps anyway)."""
    while len(result_json(result)) > MAX_RESULT_BYTES and len(result.steps or []) > 1:
        result = result.model_copy(update={"steps": (result.steps or [])[:-1]})
    return result


def result_json(result: ProfileResult) -> bytes:
    """The result as the termination message carries it: compact JSON, one line."""
    return json.dumps(result.wire(), separators=(",", ":")).encode()
