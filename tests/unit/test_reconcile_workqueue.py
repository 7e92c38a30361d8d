"""The de-duplicating work queue: coalescing, no overlapping passes of one key, retries with backoff."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from pagoda.operator.kube.client import KubeError
from pagoda.operator.kube.workqueue import Outcome, WorkQueue, work


def idle(queue: WorkQueue) -> bool:
    """Nothing queued and nothing being reconciled (a key added meanwhile is one or the other)."""
    return len(queue) == 0 and queue.in_progress() == 0


def test_duplicate_keys_are_coalesced() -> None:
    async def scenario() -> list[tuple[str, str]]:
        queue = WorkQueue()
        for _ in range(5):
            queue.add(("ns", "a"))
        queue.add(("ns", "b"))
        got = [await queue.get(), await queue.get()]
        assert len(queue) == 0
        return got

    assert asyncio.run(scenario()) == [("ns", "a"), ("ns", "b")]


def test_key_added_while_processing_is_requeued_once_after_done() -> None:
    async def scenario() -> None:
        queue = WorkQueue()
        queue.add(("ns", "a"))
        key = await queue.get()
        queue.add(key)
        queue.add(key)
        assert len(queue) == 0  # not handed out while it is being processed
        assert queue.in_progress() == 1
        queue.done(key)
        assert queue.in_progress() == 0
        assert len(queue) == 1
        assert await queue.get() == key
        queue.done(key)
        assert idle(queue)

    asyncio.run(scenario())


def test_workers_never_overlap_one_key_and_retry_failures() -> None:
    calls: list[str] = []
    running: set[str] = set()
    overlap = threading.Event()
    lock = threading.Lock()

    def reconcile(namespace: str, name: str) -> Outcome:
        with lock:
            if name in running:
                overlap.set()
            running.add(name)
            calls.append(name)
            first_failure = name == "flaky" and calls.count("flaky") == 1
        try:
            if first_failure:
                raise RuntimeError("API outage")
            return Outcome("unchanged")
        finally:
            with lock:
                running.discard(name)

    async def scenario() -> None:
        queue = WorkQueue()
        executor = ThreadPoolExecutor(max_workers=4)
        workers = [asyncio.create_task(work(queue, reconcile, executor)) for _ in range(4)]
        queue.add(("ns", "flaky"))
        for _ in range(20):
            queue.add(("ns", "a"))
            await asyncio.sleep(0)
        async with asyncio.timeout(10):
            while calls.count("flaky") < 2 or not idle(queue):  # noqa: ASYNC110 (polls another thread)
                await asyncio.sleep(0.01)
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        executor.shutdown()
        assert queue.failures == {}

    asyncio.run(scenario())
    assert not overlap.is_set()
    assert calls.count("flaky") == 2  # failed once, retried after the 1 s backoff, then succeeded
    assert 1 <= calls.count("a") <= 20


@pytest.mark.parametrize(
    ("error", "traceback"),
    [(KubeError(503, "ServiceUnavailable", "etcd is down"), False), (KeyError("replicas"), True)],
)
def test_a_failed_pass_is_retried_and_a_bug_logged_with_its_traceback(
    error: Exception, traceback: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """An API server's error is logged as it answered; any other exception is a bug in a pass (a builder's,
    say), logged with its traceback. Both are retried with back-off, never taken for a bad spec."""

    def reconcile(namespace: str, name: str) -> Outcome:
        raise error

    async def scenario() -> WorkQueue:
        queue = WorkQueue()
        executor = ThreadPoolExecutor(max_workers=1)
        worker = asyncio.create_task(work(queue, reconcile, executor))
        queue.add(("ns", "a"))
        async with asyncio.timeout(10):
            while not queue.failures:  # noqa: ASYNC110 (polls another thread)
                await asyncio.sleep(0.01)
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        executor.shutdown()
        return queue

    with caplog.at_level(logging.WARNING, logger="pagoda.operator"):
        queue = asyncio.run(scenario())
    assert queue.failures == {("ns", "a"): 1}
    [record] = [r for r in caplog.records if r.getMessage().startswith("Failed to reconcile")]
    assert bool(record.exc_info) is traceback
