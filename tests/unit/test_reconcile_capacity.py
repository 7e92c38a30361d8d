"""status.capacity: each Ready pod is asked once for its KV-cache capacity; failures are retried later, and
a pass asks a bounded number of pods."""

from __future__ import annotations

import json
import threading
import urllib.error
from typing import Any

from pagoda.operator.kube.capacity import CapacityReader


def pod(uid: str, ready: bool = True, ip: str | None = "10.244.128.2") -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": {"uid": uid}, "status": status}


def answer(tokens: int, length: int = 2048) -> dict[str, Any]:
    return {
        "kvCacheTokens": tokens,
        "maxModelLen": length,
        "maxConcurrency": tokens / length,
        "blockSize": 16,
    }


class Runtimes:
    """Answers per pod IP, as the runtime's GET /v1/pagoda/capacity would; records each ask."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def __call__(self, url: str, timeout: float) -> dict[str, Any]:
        self.asked.append(url)
        ip = url.split("//", 1)[1].split(":", 1)[0]
        found = self.answers[ip]
        if isinstance(found, Exception):
            raise found
        return dict(found)


def test_the_smallest_ready_replica_is_reported_and_each_pod_is_asked_once() -> None:
    runtimes = Runtimes({"10.0.0.1": answer(131072), "10.0.0.2": answer(65536)})
    reader = CapacityReader(runtimes)
    pods = [pod("a", ip="10.0.0.1"), pod("b", ip="10.0.0.2"), pod("c", ready=False, ip="10.0.0.3")]
    assert reader.status(pods) == {"kvCacheTokens": 65536, "maxModelLen": 2048, "maxConcurrency": 32.0}
    assert reader.status(pods) == {"kvCacheTokens": 65536, "maxModelLen": 2048, "maxConcurrency": 32.0}
    assert runtimes.asked == [
        "http://10.0.0.1:8000/v1/pagoda/capacity",
        "http://10.0.0.2:8000/v1/pagoda/capacity",
    ]


def test_a_pod_that_cannot_answer_is_asked_again_only_after_the_retry_delay() -> None:
    loading = urllib.error.HTTPError("u", 503, "loading", {}, None)  # type: ignore[arg-type]
    runtimes = Runtimes({"10.0.0.1": loading})
    now = [0.0]
    reader = CapacityReader(runtimes, retry_after=60.0, clock=lambda: now[0])
    assert reader.status([pod("a", ip="10.0.0.1")]) is None
    now[0] = 30.0
    assert reader.status([pod("a", ip="10.0.0.1")]) is None
    assert len(runtimes.asked) == 1
    assert reader.next_ask([pod("a", ip="10.0.0.1")]) == 30.0
    runtimes.answers["10.0.0.1"] = answer(4096)
    now[0] = 61.0
    assert reader.next_ask([pod("a", ip="10.0.0.1")]) == 1.0  # due: repeat the pass now
    assert reader.status([pod("a", ip="10.0.0.1")]) == {
        "kvCacheTokens": 4096,
        "maxModelLen": 2048,
        "maxConcurrency": 2.0,
    }
    assert len(runtimes.asked) == 2
    assert reader.next_ask([pod("a", ip="10.0.0.1"), pod("b", ready=False)]) is None


def test_unreachable_pods_bad_answers_and_the_per_pass_bound() -> None:
    runtimes = Runtimes(
        {
            "10.0.0.1": OSError("No route to host"),
            "10.0.0.2": json.JSONDecodeError("x", "", 0),
            "10.0.0.3": {"kvCacheTokens": 0, "maxModelLen": 2048, "maxConcurrency": 0},
        }
    )
    reader = CapacityReader(runtimes, per_pass=2)
    pods = [pod(uid, ip=f"10.0.0.{uid}") for uid in ("1", "2", "3")]
    assert reader.status(pods) is None
    assert len(runtimes.asked) == 2  # the third pod waits for the next pass
    assert reader.status(pods) is None
    assert len(runtimes.asked) == 3
    assert reader.status([pod("x", ip=None)]) is None  # no IP yet: not asked
    assert len(runtimes.asked) == 3


def test_failed_asks_back_off_up_to_the_limit() -> None:
    runtimes = Runtimes({"10.0.0.1": OSError("No route to host")})
    now = [0.0]
    reader = CapacityReader(runtimes, retry_after=60.0, max_retry_after=200.0, clock=lambda: now[0])
    delays = []
    for _ in range(4):
        reader.status([pod("a", ip="10.0.0.1")])
        delay = reader.next_ask([pod("a", ip="10.0.0.1")])
        assert delay is not None
        delays.append(delay)
        now[0] += delay
    assert delays == [60.0, 120.0, 200.0, 200.0]
    assert len(runtimes.asked) == 4


def test_a_pass_asks_its_pods_at_once() -> None:
    """The asks of one pass are in flight together (a pass waits for the slowest pod, not for the sum): each
    fetch waits at a barrier that opens only when all four are waiting."""
    ips = [f"10.244.128.{n}" for n in range(2, 6)]
    barrier = threading.Barrier(len(ips), timeout=10)

    def fetch(url: str, timeout: float) -> dict[str, Any]:
        barrier.wait()  # BrokenBarrierError (a failed ask) unless the four asks overlap
        return answer(4096)

    reader = CapacityReader(fetch, per_pass=len(ips))
    status = reader.status([pod(f"u{n}", ip=ip) for n, ip in enumerate(ips)])
    assert status is not None and status["kvCacheTokens"] == 4096
    assert reader.next_ask([pod(f"u{n}", ip=ip) for n, ip in enumerate(ips)]) is None  # all four answered
