"""The memory and back-off that the capacity reader and the adapter sync share (kube/podmemo.py)."""

from __future__ import annotations

import threading

from pagoda.operator.kube.podmemo import PodMemo, backoff, pod_ready


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff(60, 1800, n) for n in (1, 2, 3, 5, 6, 20)] == [60, 120, 240, 960, 1800, 1800]
    assert backoff(10, 600, 0) == 10  # no failure yet counts as the first


def test_memo_forgets_the_least_recently_written_first() -> None:
    memo: PodMemo[int] = PodMemo(limit=2)
    memo.put("a", 1)
    memo.put("b", 2)
    memo.put("a", 3)  # a written again: b is now the oldest
    memo.put("c", 4)
    assert (memo.get("a"), memo.get("b"), memo.get("c"), len(memo)) == (3, None, 4, 2)


def test_memo_is_safe_to_share_between_workers() -> None:
    memo: PodMemo[int] = PodMemo(limit=50)

    def write(worker: int) -> None:
        for n in range(2000):
            memo.put(f"{worker}-{n % 100}", n)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(memo) == 50


def test_pod_ready_skips_pods_being_deleted() -> None:
    ready = {"metadata": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert pod_ready(ready)
    assert not pod_ready({**ready, "metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})
    assert not pod_ready({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
