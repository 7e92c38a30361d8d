"""The engine's batch settings chosen for goodput at the SLO (`pagoda-runtime profile --tune-engine`).

vLLM's batch limits are tuned for throughput, whatever the latency objective: `max_num_batched_tokens` (the
tokens one engine step carries: every running decode plus chunks of arriving prompts) and `max_num_seqs`
(the requests one step carries). Which one to move, and which way, depends on the objective the load
breaks first (docs/design/2026-12-04-engine-settings-for-goodput.md):

- **inter-token latency binds**: every decode waits for the prompt chunks its step carries, so a smaller
  token budget (half, a quarter, an eighth of the engine's) bounds that wait.
- **time to first token binds**: prompts wait for room in a step, so a larger budget (twice, four times)
  prefills them in fewer steps.
- then, whichever binds, a narrower batch with the best budget so far: as many requests of the SLO's shape
  as the KV cache holds whole (beyond that vLLM preempts running requests and computes them again), the
  best run's capacity, and half-way to the step that missed. The excess waits in the queue, where only its
  time to first token pays, instead of slowing every running request or being preempted.

Only the settings the replica leaves unset are tried (a flag, or the same vLLM flag after `--`, always
wins). Each candidate is a whole profile against a server restarted with it, at most
contract.TUNE_MAX_RUNS servers in all, the replica's own settings first (the baseline). The winner has the
highest goodput (requests per second at the highest step that meets the SLO); one that beats the baseline
by less than MIN_GAIN is not worth a change, and the baseline stays. A candidate that beats it is checked
against a second run of the baseline (two runs of the same server differ by 10-15% on a busy machine,
docs/benchmarks.md): it wins only if it beats the better of the two.

Pure functions: runtime/profiling/profile.py starts the servers and measures them; the operator applies the
choice to the replicas (operator/resources/profile.py), with contract/tune.py's `unset` deciding for both
which settings are free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pagoda import contract
from pagoda.contract.payloads import EngineCandidate, EngineChoice, ProfileResult
from pagoda.contract.tune import FLAGS, unset

if TYPE_CHECKING:
    from pagoda.runtime.serving.config import ServeConfig

MIN_GAIN = 1.05  # a candidate must beat the baseline's goodput by 5% to be chosen
MIN_TOKEN_BUDGET = 64  # the smallest token budget tried: a step must hold a chunk worth scheduling
SMALLER_BUDGETS = (2, 4, 8)  # inter-token latency binds: the engine's budget divided by these
LARGER_BUDGETS = (2, 4)  # time to first token binds: multiplied by these

Objective = Literal["ttft", "interToken"]


@dataclass(frozen=True)
class Batch:
    """A candidate's batch settings; None leaves one as the replica has it (vLLM's default when unset)."""

    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None

    def flags(self) -> list[str]:
        """The serve flags that set it."""
        out: list[str] = []
        for flag, field in FLAGS.items():
            if (value := getattr(self, field)) is not None:
                out += [flag, str(value)]
        return out


@dataclass(frozen=True)
class Limits:
    """The batch limits a started server runs with, as vLLM resolved them (its /v1/pagoda/capacity)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    kv_cache_tokens: int | None = None


@dataclass(frozen=True)
class Run:
    """One server profiled: its settings, what it ran with, and the profile's result (None: it did not
    start, or its load failed; `error` says why)."""

    batch: Batch
    limits: Limits | None
    result: ProfileResult | None
    error: str | None = None

    @property
    def goodput(self) -> float | None:
        """Requests per second at the highest step that meets the SLO."""
        return self.result.requests_per_second if self.result is not None else None


def tunable(serve: ServeConfig) -> frozenset[str]:
    """The batch fields the replica's flags leave unset: not a serve flag, not after `--`."""
    return unset({field: getattr(serve, field) for field in FLAGS.values()}, serve.extra_args)


def binding(result: ProfileResult) -> Objective | None:
    """The objective the first step that misses the SLO misses by more (measured / objective), or None when
    every step meets it or even the first misses it (at one stream no batch setting has anything to
    share: the model and device are too slow for the SLO)."""
    for index, step in enumerate(result.steps or []):
        if step.meets_slo:
            continue
        if index == 0:
            return None
        ttft = step.ttft_p95_ms / result.slo.ttft_ms
        itl = step.inter_token_p95_ms / result.slo.inter_token_ms
        return "ttft" if ttft >= itl else "interToken"
    return None


def budget_candidates(baseline: Run, free: frozenset[str]) -> list[Batch]:
    """The token budgets to try after the baseline (see the module's docstring). A budget below the
    batch's width would be refused by vLLM: the width follows it down when it is free, else that budget
    is not tried."""
    if "max_num_batched_tokens" not in free or baseline.limits is None or baseline.result is None:
        return []
    objective = binding(baseline.result)
    budget, width = baseline.limits.max_num_batched_tokens, baseline.limits.max_num_seqs
    if objective == "interToken":
        budgets = [budget // d for d in SMALLER_BUDGETS if budget // d >= MIN_TOKEN_BUDGET]
    elif objective == "ttft":
        budgets = [budget * m for m in LARGER_BUDGETS]
    else:
        return []
    out: list[Batch] = []
    for tokens in budgets:
        if tokens >= width:
            out.append(Batch(max_num_batched_tokens=tokens))
        elif "max_num_seqs" in free:
            out.append(Batch(max_num_batched_tokens=tokens, max_num_seqs=tokens))
    return out


def width_candidates(
    best: Run, baseline: Run, free: frozenset[str], request_tokens: int, room: int
) -> list[Batch]:
    """At most `room` narrower batches to try with the best token budget so far, when a step missed the
    SLO: the requests of `request_tokens` (prompt and output) the KV cache holds whole, the best run's
    capacity, and half-way to the step that missed; each below the width and budget the best ran with."""
    if "max_num_seqs" not in free or baseline.result is None or binding(baseline.result) is None:
        return []
    if best.result is None or best.limits is None:
        return []
    widths: list[int] = []
    if best.limits.kv_cache_tokens:
        widths.append(best.limits.kv_cache_tokens // request_tokens)
    if (capacity := best.result.concurrency) is not None:
        missed = [s.concurrency for s in best.result.steps or [] if s.concurrency > capacity]
        widths += [capacity] + ([(capacity + missed[0]) // 2] if missed else [])
    ceiling = min(best.limits.max_num_seqs, best.limits.max_num_batched_tokens)
    out: list[Batch] = []
    for width in dict.fromkeys(widths):  # in order, once each
        if 1 <= width < ceiling and len(out) < room:
            out.append(Batch(best.batch.max_num_batched_tokens, width))
    return out


def baseline_goodput(runs: Sequence[Run]) -> float | None:
    """The best goodput of the baseline's runs (the replica's own settings, measured once or twice)."""
    measured = [run.goodput for run in runs if run.batch == Batch() and run.goodput is not None]
    return max(measured, default=None)


def choose(runs: Sequence[Run]) -> Run:
    """The candidate with the highest goodput (the first of equals) if it beats the baseline's best run by
    MIN_GAIN (a baseline that met the SLO at no step is beaten by any candidate that did); else the
    baseline's first run, runs[0]."""
    candidates = [run for run in runs if run.batch != Batch() and run.goodput is not None]
    if not candidates:
        return runs[0]
    best = max(candidates, key=lambda run: run.goodput or 0.0)
    baseline = baseline_goodput(runs)
    if baseline is not None and (best.goodput or 0.0) < MIN_GAIN * baseline:
        return runs[0]
    return best


def engine_result(runs: Sequence[Run], chosen: Run) -> EngineChoice:
    """The result's `engine`: the chosen settings (None where it leaves the replica's), the goodputs with
    them and with the baseline, and every run's settings and capacity, in order. Every key is set, the nulls
    too (payloads.EngineChoice)."""
    return EngineChoice(
        max_num_batched_tokens=chosen.batch.max_num_batched_tokens,
        max_num_seqs=chosen.batch.max_num_seqs,
        goodput=chosen.goodput,
        baseline_goodput=baseline_goodput(runs),
        candidates=[
            EngineCandidate(
                max_num_batched_tokens=run.batch.max_num_batched_tokens,
                max_num_seqs=run.batch.max_num_seqs,
                concurrency=run.result.concurrency if run.result else None,
                requests_per_second=run.goodput,
            )
            for run in runs
        ],
    )


# The baseline, the budgets, a width at least, and the baseline again to confirm a winner.
assert contract.TUNE_MAX_RUNS >= 1 + len(SMALLER_BUDGETS) + 1 + 1
MIN_RUNS = 3  # the baseline, one candidate, the baseline again
