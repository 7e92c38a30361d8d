"""The engine's progress watch: an engine that holds requests and completes no step for long is stalled.

/livez used to check only that the engine had not errored; an EngineCore that stops making progress (a
deadlock, a hung device, a SIGSTOP) left the pod live and ready for ever, its requests hanging. The runtime
samples the engine every second (lifecycle.py):

- busy: the engine holds requests, as vLLM's frontend counts them (`AsyncLLM.get_num_unfinished_requests`:
  a request is counted once it is processed, media fetched and prompt tokenized, and handed to EngineCore;
  it stops counting when EngineCore reports it finished or it is aborted), or the engine's own last report
  said requests were waiting or running. A request still fetching its images or being tokenized is not the
  engine's work, and a client reading a long stream slowly after the engine finished it is no stall either.
  A request handed to a stopped EngineCore is counted all the same: the count is the frontend's own, not
  something the engine reports.
- progress: the engine's steps, counted as their statistics reach the frontend (`EngineSteps`, a vLLM stat
  logger). EngineCore sends them after every step while it holds requests, whether the step generated a token
  or computed one chunk of a long prefill; a stopped or wedged EngineCore sends none. vLLM's token counters
  are not enough: prompt tokens are counted only when a request's whole prefill is done.

Busy with no step for --stall-timeout seconds is a stall. docs/design/2026-12-05-stall-watchdog-progress.md
says why, and how the default timeout follows the work one step may hold (`default_stall_timeout`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The default never goes below this: a hung engine is caught within half a minute where steps are short.
MIN_DEFAULT_STALL_TIMEOUT_S = 30.0
# A slow prefill rate, in tokens per second, for the default timeout: an 8B model in bf16 on a few CPU cores
# without AMX computes about 20-60 prompt tokens a second (about 16 GFLOP a token at 0.3-1 TFLOP/s).
CONSERVATIVE_PREFILL_TOKENS_PER_S = 50.0
# Context length at which a chunk's attention over the tokens before it costs as much as the rest of the
# step (a Llama-8B-shaped model: 4 * layers * hidden flops a context token, 2 * parameters a new token).
ATTENTION_PARITY_TOKENS = 32_768
MAX_STALL_TIMEOUT_S = 3600.0  # ServeConfig's bound on --stall-timeout


def default_stall_timeout(step_tokens: int, max_model_len: int) -> float:
    """The stall timeout when --stall-timeout is not given: the longest one engine step can take, at a slow
    CPU's prefill rate, and never under 30 s. `step_tokens` is the engine's token budget per step
    (max_num_batched_tokens: 2048 on CPU by default, at least max_model_len where prefill is not chunked);
    the last chunk of a long prompt also attends over up to `max_model_len` tokens before it."""
    work = step_tokens * (1 + max_model_len / ATTENTION_PARITY_TOKENS)
    seconds = max(MIN_DEFAULT_STALL_TIMEOUT_S, work / CONSERVATIVE_PREFILL_TOKENS_PER_S)
    return float(min(MAX_STALL_TIMEOUT_S, round(seconds)))


@dataclass
class EngineSteps:
    """The engine's steps as the frontend receives them: one report of scheduler statistics per EngineCore
    step (vLLM sends one even when the step produced no output, as in the middle of a chunked prefill)."""

    count: int = 0

    def record(self, scheduler_stats: Any) -> None:
        if scheduler_stats is not None:
            self.count += 1


@dataclass
class ProgressWatch:
    timeout: float  # seconds; 0: never stalled
    _steps: float | None = field(default=None, init=False)
    _since: float | None = field(default=None, init=False)  # monotonic: last progress, or when work began

    def observe(self, now: float, busy: bool, steps: float) -> float:
        """One sample; returns the seconds the engine has been busy without completing a step (0 when idle
        or moving)."""
        if not busy:
            self._since = None
        elif self._since is None or steps != self._steps:
            self._since = now
        self._steps = steps
        return 0.0 if self._since is None else now - self._since

    def stalled(self, idle_seconds: float) -> bool:
        return self.timeout > 0 and idle_seconds >= self.timeout
