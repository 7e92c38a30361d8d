"""A de-duplicating work queue of InferenceService keys, like client-go's workqueue.

Watch events only say "look at (namespace, name) again". A key waiting in the queue is not added twice,
and a key being reconciled is never handed to a second worker: events that arrive meanwhile mark it dirty
and it is queued once more when the running pass ends. So a burst of child events costs one pass, passes of
one object never overlap, and passes of different objects run in parallel on a bounded thread pool.
The queue holds no state that correctness depends on: after a restart the initial listing refills it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pagoda.operator.kube.client import KubeError, NotLeader
from pagoda.operator.kube.podmemo import backoff
from pagoda.operator.status.report import Problem

log = logging.getLogger("pagoda.operator.workqueue")
Key = tuple[str, str]  # (namespace, name)

MIN_BACKOFF = 1.0
MAX_BACKOFF = 300.0


@dataclass
class Outcome:
    """What one reconcile pass tells the queue (and the logs): what it did, and when to look again."""

    result: str  # applied | unchanged | error | gone
    requeue_after: float | None = None
    writes: int = 0
    problems: list[Problem] = field(default_factory=list)


class WorkQueue:
    def __init__(self) -> None:
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._dirty: set[Key] = set()
        self._processing: set[Key] = set()
        self._later: dict[Key, asyncio.TimerHandle] = {}
        self.failures: dict[Key, int] = {}  # consecutive failed passes, for the retry backoff

    def add(self, key: Key) -> None:
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.put_nowait(key)

    def add_after(self, key: Key, delay: float) -> None:
        """Queue `key` after `delay` seconds (an earlier pending retry wins)."""
        loop = asyncio.get_running_loop()
        pending = self._later.get(key)
        if pending is not None and pending.when() <= loop.time() + delay:
            return
        if pending is not None:
            pending.cancel()
        self._later[key] = loop.call_later(delay, self._fire, key)

    def _fire(self, key: Key) -> None:
        self._later.pop(key, None)
        self.add(key)

    async def get(self) -> Key:
        key = await self._queue.get()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: Key) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.put_nowait(key)

    def __len__(self) -> int:
        return self._queue.qsize()

    def in_progress(self) -> int:
        """Keys being reconciled right now."""
        return len(self._processing)


async def work(
    queue: WorkQueue, reconcile: Callable[[str, str], Outcome], executor: ThreadPoolExecutor
) -> None:
    """One worker: take a key, reconcile it in a thread, retry failures with exponential backoff."""
    loop = asyncio.get_running_loop()
    failures = queue.failures
    while True:
        key = await queue.get()
        try:
            outcome = await loop.run_in_executor(executor, reconcile, *key)
        except NotLeader:
            pass  # logged by the fence; not a failure to retry: the process exits, the new leader lists it
        except Exception as exc:  # a bug or an API outage must not stop the worker
            count = failures[key] = failures.get(key, 0) + 1
            delay = backoff(MIN_BACKOFF, MAX_BACKOFF, count)
            log.warning(
                "Failed to reconcile name=%s namespace=%s retry_in=%.0fs error=%r",
                key[1],
                key[0],
                delay,
                str(exc),
                # An API server's answer says enough; anything else is a bug, shown with its traceback.
                exc_info=not isinstance(exc, KubeError),
            )
            queue.add_after(key, delay)
        else:
            failures.pop(key, None)
            if outcome.requeue_after is not None:
                queue.add_after(key, outcome.requeue_after)
        finally:
            queue.done(key)
