"""How much a service's replicas hold: the KV-cache capacity each runtime reports once its model is loaded.

The runtime answers `GET /v1/pagoda/capacity` with contract/payloads.py's Capacity: `{"kvCacheTokens",
"maxModelLen", "maxConcurrency", "blockSize", "startup", "modelCache"}` (runtime/serving/capacity.py,
runtime/serving/startup.py, runtime/models/modelcache.py; 503 while loading). The numbers are fixed for a
pod's life, so the operator asks each Ready pod once and remembers the answer by pod uid; a failed ask is
retried after `retry_after` seconds, doubling with each failure up to `max_retry_after` (a pod the operator
cannot reach, e.g. behind a NetworkPolicy, costs one short ask every half hour). What a pass costs is
bounded: at most `per_pass` asks, each with a short timeout, and none for a pod already answered. The memory
and the back-off are podmemo.py's, shared with adapters.py. `status.capacity` is the smallest replica's
(during a rollout the old and new pods can differ; the smaller is what a client can count on). Each pod's
start-up phases go into `status.startup` (startup.py).
"""

from __future__ import annotations

import functools
import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from pagoda.contract import CAPACITY_PATH, HTTP_PORT
from pagoda.contract.payloads import Capacity
from pagoda.operator.kube.podcalls import PodTrust, https_call, pod_transport
from pagoda.operator.kube.podmemo import PodMemo, at_once, backoff, pod_ready
from pagoda.operator.resources.tls import PodTls, pod_url
from pagoda.operator.status.startup import model_cache_status, record

Obj = dict[str, Any]
Fetch = Callable[[str, float], Obj]


def http_fetch(url: str, timeout: float, tls: PodTls | None = None) -> Obj:
    """GET `url` (a pod's, over http or, with spec.runtime.tls, https verified as `tls` says: podcalls.py)."""
    if url.startswith("https:"):
        status, raw = https_call(tls, "GET", url, None, {}, timeout)
        if status != 200:
            raise OSError(f"{url} answered HTTP {status}")
        body = json.loads(raw)
    else:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (a pod IP)
            body = json.load(response)
    if not isinstance(body, dict):
        raise ValueError(f"{url} answered {body!r}, not an object")
    return body


def _answer(body: Obj) -> Capacity | None:
    """The runtime's answer read with its model (contract/payloads.py); None without a capacity. A start-up
    record or a model cache that is not one reads as absent: the capacity still counts."""
    try:
        found = Capacity.model_validate(body)
    except ValidationError:
        return None
    if found.kv_cache_tokens <= 0 or found.max_model_len <= 0:
        return None
    return found


def _capacity(found: Capacity) -> Obj:
    """The fields of the runtime's answer that go into the status."""
    return {
        "kvCacheTokens": found.kv_cache_tokens,
        "maxModelLen": found.max_model_len,
        "maxConcurrency": round(found.max_concurrency, 2),
    }


class CapacityReader:
    """Asks Ready pods for their capacity, once per pod; safe to share between reconcile workers."""

    def __init__(
        self,
        fetch: Fetch | None = None,
        *,
        trust: PodTrust | None = None,
        port: int = HTTP_PORT,
        timeout: float = 2.0,
        retry_after: float = 60.0,
        max_retry_after: float = 1800.0,
        per_pass: int = 4,
        remembered: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch, self._trust, self._port, self._timeout = fetch, trust, port, timeout
        self._retry_after, self._max_retry_after = retry_after, max_retry_after
        self._per_pass, self._clock = per_pass, clock
        # pod uid -> its answer (_answer), or (the monotonic time after which a failed ask may be repeated,
        # failures)
        self._known: PodMemo[Capacity | tuple[float, int]] = PodMemo(remembered)

    def status(self, pods: list[Obj]) -> Obj | None:
        """`status.capacity` from the Ready pods of one service (asking those not asked yet); None when no
        Ready pod has answered."""
        answers: list[Obj] = []
        to_ask: list[tuple[str, Callable[[], Obj], tuple[float, int] | None]] = []  # (uid, ask, last failure)
        for pod in pods:
            uid = str((pod.get("metadata") or {}).get("uid") or "")
            ip = (pod.get("status") or {}).get("podIP")
            if not uid or not ip or not pod_ready(pod):
                continue
            known = self._known.get(uid)
            if isinstance(known, Capacity):
                answers.append(_capacity(known))
                continue
            if (known is not None and self._clock() < known[0]) or len(to_ask) >= self._per_pass:
                continue
            to_ask.append((uid, self._asking(pod), known))
        asked = at_once(self._ask, [ask for _, ask, _ in to_ask])
        for (uid, _, known), answer in zip(to_ask, asked, strict=True):
            failures = known[1] + 1 if known is not None else 1
            delay = backoff(self._retry_after, self._max_retry_after, failures)
            self._known.put(uid, answer if answer is not None else (self._clock() + delay, failures))
            if answer is not None:
                answers.append(_capacity(answer))
        if not answers:
            return None
        return min(answers, key=lambda a: (a["kvCacheTokens"], a["maxConcurrency"]))

    def startups(self, pods: list[Obj]) -> list[Obj]:
        """The start-up records (startup.py's `record`) of the Ready pods that have answered (in `status`)."""
        found = []
        for pod in pods:
            known = self._known.get(str((pod.get("metadata") or {}).get("uid") or ""))
            if pod_ready(pod) and isinstance(known, Capacity) and known.startup is not None:
                start = record(pod, known.startup)
                if start is not None:
                    found.append(start)
        return found

    def model_caches(self, pods: list[Obj]) -> Obj | None:
        """`status.modelCache` from the Ready pods that have answered: per node, what the newest pod there
        saw in the node's cache when it became Ready."""
        reports = []
        for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or "")):
            known = self._known.get(str((pod.get("metadata") or {}).get("uid") or ""))
            node = (pod.get("spec") or {}).get("nodeName")
            if pod_ready(pod) and node and isinstance(known, Capacity) and known.model_cache is not None:
                reports.append((str(node), known.model_cache))
        return model_cache_status(reports)

    def next_ask(self, pods: list[Obj]) -> float | None:
        """Seconds until a Ready pod that has not answered may be asked again (when to repeat the pass);
        None when every Ready pod has answered."""
        waits = []
        for pod in pods:
            known = self._known.get(str((pod.get("metadata") or {}).get("uid") or ""))
            if pod_ready(pod) and (pod.get("status") or {}).get("podIP") and not isinstance(known, Capacity):
                waits.append(max(known[0] - self._clock(), 1.0) if known is not None else 1.0)
        return min(waits) if waits else None

    def _asking(self, pod: Obj) -> Callable[[], Obj]:
        """The GET of `pod`'s capacity: with the given `fetch` (tests), else http_fetch, verifying a TLS pod
        as the PodTrust says (adapters.py)."""
        url = pod_url(pod, self._port, CAPACITY_PATH)
        if self._fetch is not None:
            return functools.partial(self._fetch, url, self._timeout)
        return functools.partial(http_fetch, url, self._timeout, pod_transport(self._trust, pod))

    def _ask(self, ask: Callable[[], Obj]) -> Capacity | None:
        try:
            return _answer(ask())
        except (OSError, ValueError):  # unreachable, 503 while loading (HTTPError is an OSError), bad JSON
            return None
