"""The engine's progress watch: an engine with requests that produces no token for long is stalled.

/livez used to check only that the engine had not errored; an EngineCore that stops making progress (a
deadlock, a hung device, a SIGSTOP) left the pod live and ready for ever, its requests hanging. The runtime
samples the engine every second (lifecycle.py): busy when the engine reports requests waiting or running, or
when an inference request at the gate still waits for its response to begin (the engine's own gauges stop
moving when it does); progress is the engine's count of prompt and generated tokens. Busy with the count
unchanged for --stall-timeout seconds is a stall.

A response that has begun no longer counts: a client that reads a long stream slowly keeps its request open
after the engine finished it, which is no stall.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ProgressWatch:
    timeout: float  # seconds; 0: never stalled
    _tokens: float | None = field(default=None, init=False)
    _since: float | None = field(default=None, init=False)  # monotonic: last progress, or when work began

    def observe(self, now: float, busy: bool, tokens: float) -> float:
        """One sample; returns the seconds the engine has been busy without progress (0 when idle or
        moving)."""
        if not busy:
            self._since = None
        elif self._since is None or tokens != self._tokens:
            self._since = now
        self._tokens = tokens
        return 0.0 if self._since is None else now - self._since

    def stalled(self, idle_seconds: float) -> bool:
        return self.timeout > 0 and idle_seconds >= self.timeout
