"""LoRA adapters in step with the spec: each Ready runtime pod loads the spec's adapters at run time.

The adapters are not in the pod template (changing them must not restart a pod), so the operator loads them
through the runtime's adapters API (docs/lora.md; its JSON is contract/payloads.py's AdapterList, AdapterEntry
and AdapterSource): per pass, for each Ready pod that is not known to be in step, `GET /v1/pagoda/adapters`,
then `DELETE` the adapters the spec no longer names (the runtime drains their requests first) and `PUT` those
missing or with another source or revision. A new replica is Ready (it serves the base model) before it
serves the adapters: the pass after it turns Ready loads them, and the status counts it as not serving them
until then.

What a pass costs is bounded: at most `per_pass` pods are asked, all at once (a pass waits for the slowest
pod, not for the sum of them), and each call has a timeout; a pod in step is not asked again for
`recheck_after` seconds (a runtime restarted in place is a new view: the key includes the container restart
count). A pod that cannot be reached is retried after `retry_after` seconds, doubling up to
`max_retry_after`; a failed load is retried after `failed_retry_after` seconds (the runtime keeps the Failed
entry until then). A PUT or DELETE that times out goes on in the runtime: the adapter counts as Loading (or
Unloading) and the next pass looks. While any adapter is not Ready the caller requeues after `requeue_after`.

Every call is signed with the operator's management key (contract/management.py) for the pod it goes to
(its UID and its address): the runtime answers no one else, and no other pod accepts it. The inference
API's key (spec.runtime.apiKeySecret) is not used. A pod that serves TLS (spec.runtime.tls) is called only
once its certificate verifies against the CA in that Secret, for the Service's DNS name (PodTrust; the call
itself is podcalls.py's): an unverified connection would hand the signed call, and the answer, to whoever
answers on the pod's IP.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from pydantic import ValidationError

from pagoda.contract import ADAPTERS_PATH, HTTP_PORT
from pagoda.contract.payloads import AdapterEntry, AdapterList, AdapterSource
from pagoda.operator.api import InferenceServiceSpec
from pagoda.operator.kube.podcalls import (
    CALL_FAILED,
    MESSAGE_MAX,
    PodTrust,
    Request,
    http_request,
    pod_error,
    pod_transport,
    unreachable_reason,
)
from pagoda.operator.kube.podmemo import PodMemo, at_once, backoff, pod_ready
from pagoda.operator.resources.tls import pod_url

Obj = dict[str, Any]
# What the spec asks of one adapter: its source URI and hub revision (None: the default branch).
Want = tuple[str, str | None]


class Signs(Protocol):
    """What signs the calls: the runtime's Signer, or the operator's KeyRing (kube/management.py)."""

    def authorization(self, method: str, host: str, path: str, body: bytes, *, pod: str) -> str: ...


@dataclass
class PodView:
    """What the operator knows of one runtime's adapters."""

    adapters: dict[str, AdapterEntry] = field(default_factory=dict)  # name -> the runtime's entry
    checked_at: float | None = None  # None: never answered
    retry_at: float = 0.0  # while unreachable, when to ask again
    failures: int = 0
    problem: tuple[str, str] | None = None  # (reason, message) while it cannot be reached
    failed_at: dict[tuple[str, Want], float] = field(default_factory=dict)  # (name, want) -> when it failed
    desired: dict[str, Want] = field(default_factory=dict)  # the adapters it was last brought in step with


@dataclass
class AdapterReport:
    """The status fields (`adapters`, `adaptersReady`; empty without spec.lora) and when to look again."""

    status: Obj
    requeue_after: float | None = None


class AdapterSync:
    """Keeps every Ready pod's adapters in step with spec.lora; safe to share between reconcile workers."""

    def __init__(
        self,
        signer: Signs,
        request: Request | None = None,
        *,
        trust: PodTrust | None = None,
        port: int = HTTP_PORT,
        timeout: float = 3.0,
        load_timeout: float = 10.0,
        per_pass: int = 8,
        recheck_after: float = 600.0,
        retry_after: float = 10.0,
        max_retry_after: float = 600.0,
        failed_retry_after: float = 300.0,
        requeue_after: float = 5.0,
        remembered: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._signer, self._request, self._trust, self._port = signer, request, trust, port
        self._timeout, self._load_timeout = timeout, load_timeout
        self._per_pass, self._recheck_after = per_pass, recheck_after
        self._retry_after, self._max_retry_after = retry_after, max_retry_after
        self._failed_retry_after, self._requeue_after = failed_retry_after, requeue_after
        self._clock = clock
        self._views: PodMemo[PodView] = PodMemo(remembered)

    def sync(self, spec: InferenceServiceSpec, pods: list[Obj]) -> AdapterReport:
        """Bring the Ready pods of a service in step with its spec.lora, and report."""
        if spec.lora is None:
            return AdapterReport({})
        desired = {adapter.name: (adapter.uri, adapter.revision) for adapter in spec.lora.adapters}
        ready = [pod for pod in pods if pod_ready(pod) and (pod.get("status") or {}).get("podIP")]
        ready.sort(key=lambda pod: str((pod.get("metadata") or {}).get("name") or ""))  # a stable status
        self._sync_pods(ready, desired)
        return self._report(ready, desired)

    def _call(
        self, request: Request, method: str, url: str, uid: str, body: AdapterSource | None, timeout: float
    ) -> tuple[int, Obj]:
        """One call to a pod's management API, signed for that pod (`uid`, and the Host in `url`)."""
        data = json.dumps(body.wire()).encode() if body is not None else None
        parts = urlsplit(url)
        signature = self._signer.authorization(method, parts.netloc, parts.path, data or b"", pod=uid)
        headers = {"content-type": "application/json", "authorization": signature}
        return request(method, url, data, headers, timeout)

    def _request_for(self, pod: Obj) -> Request:
        """The given `request` (tests), else http_request, verifying a TLS pod as PodTrust says."""
        if self._request is not None:
            return self._request
        return functools.partial(http_request, tls=pod_transport(self._trust, pod))

    def _sync_pods(self, pods: list[Obj], desired: dict[str, Want]) -> None:
        due: list[
            tuple[str, str, str, PodView, Request]
        ] = []  # (view key, URL, pod UID, what was known, how)
        now = self._clock()
        for pod in pods:
            key = view_key(pod)
            view = self._views.get(key) or PodView()
            if self._due(view, desired, now):
                uid = str((pod.get("metadata") or {}).get("uid") or "")
                url = pod_url(pod, self._port, ADAPTERS_PATH)
                due.append((key, url, uid, view, self._request_for(pod)))
        due = due[: self._per_pass]
        synced = at_once(lambda one: self._sync_pod(one[4], one[1], one[2], one[3], desired), due)
        for (key, *_), view in zip(due, synced, strict=True):
            self._views.put(key, view)

    def _due(self, view: PodView, desired: dict[str, Want], now: float) -> bool:
        if view.checked_at is None:
            return now >= view.retry_at
        if view.desired != desired:  # the spec changed since this pod was last brought in step
            return True
        at = self._next_look(view, desired)
        return now >= (at if at is not None else view.checked_at + self._recheck_after)

    def _sync_pod(
        self, request: Request, base: str, uid: str, view: PodView, desired: dict[str, Want]
    ) -> PodView:
        try:
            status, body = self._call(request, "GET", base, uid, None, self._timeout)
        except CALL_FAILED as exc:
            return self._unreachable(view, unreachable_reason(exc), f"GET {ADAPTERS_PATH}: {exc}")
        if status != 200:
            reason = "Unauthorized" if status in (401, 403) else "ReplicaNotAnswering"
            return self._unreachable(view, reason, f"GET {ADAPTERS_PATH}: {pod_error(status, body)[1]}")
        # An entry the operator cannot read is left out (payloads.AdapterList): loaded again, or not unloaded.
        listed = AdapterList.model_validate(body).adapters or []
        entries = {entry.name: entry for entry in listed}
        failed_at = dict(view.failed_at)
        for name, entry in list(entries.items()):  # DELETE first: it makes room for the PUTs
            if name in desired or entry.state == "Unloading":
                continue
            try:
                status, body = self._call(request, "DELETE", f"{base}/{name}", uid, None, self._load_timeout)
            except CALL_FAILED:  # it drains on; the next pass looks
                entries[name] = entry.model_copy(update={"state": "Unloading"})
                continue
            if status in (200, 404):
                del entries[name]
        now = self._clock()
        for name, want in desired.items():
            current = entries.get(name)
            if current is not None and serves(current, want):
                if current.state in ("Loaded", "Loading"):
                    continue
                failed = failed_at.get((name, want))
                if (
                    current.state == "Failed"
                    and failed is not None
                    and now < failed + self._failed_retry_after
                ):
                    continue
            source, revision = want
            put = AdapterSource(source=source, **({"revision": revision} if revision is not None else {}))
            loading = AdapterEntry(name=name, source=source, revision=revision, state="Loading")
            try:
                status, body = self._call(request, "PUT", f"{base}/{name}", uid, put, self._load_timeout)
            except CALL_FAILED:
                entries[name] = loading  # it loads on
                continue
            if status == 200:
                entries[name] = _entry(body) or loading  # one it cannot read: the next pass looks
                failed_at.pop((name, want), None)
            else:
                kind, message = pod_error(status, body)
                failure = {"state": "Failed", "reason": kind, "error": message}
                entries[name] = loading.model_copy(update=failure)
                failed_at[(name, want)] = self._clock()
        return PodView(adapters=entries, checked_at=self._clock(), failed_at=failed_at, desired=dict(desired))

    def _unreachable(self, view: PodView, reason: str, message: str) -> PodView:
        failures = view.failures + 1
        delay = backoff(self._retry_after, self._max_retry_after, failures)
        return PodView(
            adapters=view.adapters,
            checked_at=None,
            retry_at=self._clock() + delay,
            failures=failures,
            problem=(reason, message[:MESSAGE_MAX]),
            failed_at=view.failed_at,
        )

    def _next_look(self, view: PodView, desired: dict[str, Want]) -> float | None:
        """When this pod should be looked at again (clock time); None when it is in step."""
        if view.checked_at is None:
            return view.retry_at
        looks = []
        for name, want in desired.items():
            entry = view.adapters.get(name)
            if entry is None or not serves(entry, want) or entry.state not in ("Loaded", "Failed"):
                looks.append(view.checked_at + self._requeue_after)
            elif entry.state == "Failed":
                failed = view.failed_at.get((name, want), view.checked_at)
                looks.append(failed + self._failed_retry_after)
        if any(name not in desired for name in view.adapters):  # still draining
            looks.append(view.checked_at + self._requeue_after)
        return min(looks) if looks else None

    def _report(self, pods: list[Obj], desired: dict[str, Want]) -> AdapterReport:
        now = self._clock()
        views = [self._views.get(view_key(pod)) or PodView(retry_at=now) for pod in pods]
        entries, ready_count = [], 0
        for name, want in desired.items():
            serving = 0
            failed: AdapterEntry | None = None
            for view in views:
                entry = view.adapters.get(name)
                if view.checked_at is not None and entry is not None and serves(entry, want):
                    if entry.state == "Loaded":
                        serving += 1
                    elif entry.state == "Failed" and failed is None:
                        failed = entry
            item: Obj = {"name": name, "readyReplicas": serving, "replicas": len(views)}
            if failed is not None:
                item.update(state="Failed", reason=failed.reason or "AdapterLoadFailed")
                item["message"] = (failed.error or "")[:MESSAGE_MAX]
            elif views and serving == len(views):
                item["state"] = "Ready"
                ready_count += 1
            else:
                item["state"] = "Loading"
                problem = next((v.problem for v in views if v.problem), None)
                if problem is not None:
                    item.update(reason=problem[0], message=problem[1])
                elif not views:
                    item.update(reason="NoReadyReplicas", message="No replica is Ready to load it into")
            entries.append(item)
        status: Obj = {"adapters": entries, "adaptersReady": f"{ready_count}/{len(desired)}"}
        looks = [at for at in (self._next_look(v, desired) for v in views) if at is not None]
        return AdapterReport(status, max(min(looks) - now, 1.0) if looks else None)


def serves(entry: AdapterEntry, want: Want) -> bool:
    """Whether the runtime's entry is the adapter the spec asks for: the same source and revision (an entry
    without `revision` is the default branch)."""
    return entry.source == want[0] and entry.revision == want[1]


def _entry(body: Obj) -> AdapterEntry | None:
    """The runtime's answer to a PUT (payloads.AdapterEntry); None when it is not one."""
    try:
        return AdapterEntry.model_validate(body)
    except ValidationError:
        return None


def view_key(pod: Obj) -> str:
    """The pod's uid and its containers' restart count: a runtime restarted in place starts with none of the
    adapters loaded at run time."""
    restarts = sum(
        int(c.get("restartCount") or 0) for c in (pod.get("status") or {}).get("containerStatuses") or []
    )
    return f"{(pod.get('metadata') or {}).get('uid')}/{restarts}"


def failure_events(previous: Obj, status: Obj) -> list[tuple[str, str]]:
    """(reason, message) of a Warning Event for each adapter whose failure is new or has a new reason."""
    before = {str(a.get("name")): a for a in previous.get("adapters") or []}
    events = []
    for entry in status.get("adapters") or []:
        old = before.get(entry["name"]) or {}
        if entry.get("state") == "Failed" and (
            old.get("state") != "Failed" or old.get("reason") != entry.get("reason")
        ):
            events.append(
                ("AdapterFailed", f"Adapter {entry['name']}: {entry.get('reason')}: {entry.get('message')}")
            )
    return events
