"""What the operator remembers about each runtime pod it talks to over HTTP (capacity.py asks each Ready pod
for its KV-cache capacity, adapters.py brings each Ready pod's LoRA adapters in step): one bounded,
thread-safe memory per purpose, keyed per pod, and one back-off rule for pods that do not answer.

Reconcile workers share these objects, so every read and write takes the lock; the memory forgets the pods
it has not touched for longest once it holds `limit` of them (pods come and go, uids are never reused).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from pagoda.operator.status.pods import pod_condition

T = TypeVar("T")
V = TypeVar("V")
Obj = dict[str, Any]


def pod_ready(pod: Obj) -> bool:
    """Ready and not being deleted: a pod worth asking."""
    return not (pod.get("metadata") or {}).get("deletionTimestamp") and pod_condition(pod, "Ready")


def backoff(first: float, most: float, failures: int) -> float:
    """Seconds before trying again after `failures` failures in a row: `first`, doubling, at most `most`.
    The operator's one back-off: a pod it cannot reach (capacity, adapters) costs one short ask per `most`,
    and a failed pass is retried by the work queue."""
    return float(min(first * 2 ** max(failures - 1, 0), most))


def at_once(call: Callable[[T], V], items: list[T]) -> list[V]:
    """`call` on every item at the same time (a thread each), the results in order: a pass that talks to
    several pods waits for the slowest, not for the sum of them."""
    if len(items) <= 1:
        return [call(item) for item in items]
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        return list(pool.map(call, items))


class PodMemo(Generic[V]):
    """pod key -> what was learnt of it; bounded, least recently written forgotten first."""

    def __init__(self, limit: int = 10_000) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._items: OrderedDict[str, V] = OrderedDict()

    def get(self, key: str) -> V | None:
        with self._lock:
            return self._items.get(key)

    def put(self, key: str, value: V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._limit:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
