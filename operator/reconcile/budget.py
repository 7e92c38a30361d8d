"""A fleet-wide budget of things at once, shared by every pass of the operator: how many services may roll for
an upgrade (reconcile/rollouts.py, the chart's rollouts.maxConcurrent) and how many capacity profile Jobs may
run (reconcile/profile.py, profiles.maxConcurrent).

What is busy is not the budget's to remember: each ask passes the services the cluster shows busy (their
Deployment rolling, their profile Job running, from the operator's cache), so a restarted operator (or a new
leader) starts from what runs. The budget remembers only its queue and its grants: a grant holds a slot from
the pass that gets it until the cache shows the service busy (or GRANT_TTL_S passes, should its write never
land). The budget is the leader's, in memory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Gauge

Key = tuple[str, str]  # (namespace, name) of an InferenceService


@dataclass(frozen=True)
class Turn:
    """A service's answer from a budget: `granted`, or its place in the queue (1: next)."""

    granted: bool
    position: int = 0
    queued: int = 0  # services waiting, itself included
    busy: int = 0  # slots taken (the budget's things under way)
    limit: int = 1


class FleetBudget:
    """At most `limit` services busy at once (thread-safe). Services ask in the order they first asked (then
    by name); a waiting service asks again at each of its passes; one that has not asked for STALE_S (deleted,
    or its pass no longer runs) leaves the queue, so that it never holds up those behind it. `setting` names
    the limit in errors (e.g. "rollouts.maxConcurrent"); `gauge` counts the services waiting."""

    GRANT_TTL_S = 60.0
    STALE_S = 60.0

    def __init__(
        self, limit: int, setting: str, gauge: Gauge, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if limit < 1:
            raise ValueError(f"{setting} must be at least 1, got {limit}")
        self.limit = limit
        self._gauge = gauge
        self._clock = clock
        self._lock = threading.Lock()
        self._queue: dict[Key, float] = {}  # service -> when it first asked
        self._granted: dict[Key, float] = {}  # service -> when it was granted
        self._asked: dict[Key, float] = {}  # waiting service -> when it last asked

    def ask(self, key: Key, busy: set[Key]) -> Turn:
        """`key` wants a slot; `busy`: the services the cluster shows holding one."""
        with self._lock:
            now = self._clock()
            self._granted = {
                k: t for k, t in self._granted.items() if now - t < self.GRANT_TTL_S and k not in busy
            }
            if key in self._granted:  # granted, its write not seen yet
                return Turn(True, busy=len(busy | set(self._granted)), limit=self.limit)
            self._queue.setdefault(key, now)
            self._asked[key] = now
            for gone in [k for k, t in self._asked.items() if now - t > self.STALE_S]:
                self._queue.pop(gone, None)
                self._asked.pop(gone, None)
            taken = (busy | set(self._granted)) - {key}
            order = sorted(self._queue, key=lambda k: (self._queue[k], k))
            position = order.index(key)
            if len(taken) + position < self.limit:
                del self._queue[key]
                del self._asked[key]
                self._granted[key] = now
                self._gauge.set(len(self._queue))
                return Turn(True, busy=len(taken) + 1, limit=self.limit)
            self._gauge.set(len(order))
            return Turn(False, position + 1, len(order), len(taken), self.limit)

    def finished(self, key: Key) -> None:
        """`key`'s granted work is over (the cache shows it done): its slot is free."""
        with self._lock:
            self._granted.pop(key, None)

    def forget(self, key: Key) -> None:
        """`key` no longer waits (it no longer needs a slot, or it is gone)."""
        with self._lock:
            self._queue.pop(key, None)
            self._asked.pop(key, None)
            self._gauge.set(len(self._queue))

    def queued(self) -> list[Key]:
        with self._lock:
            return sorted(self._queue, key=lambda k: (self._queue[k], k))
