"""LoRA adapters in step with the spec: each Ready runtime pod loads the spec's adapters at run time.

The adapters are not in the pod template (changing them must not restart a pod), so the operator loads them
through the runtime's adapters API (docs/lora.md): per pass, for each Ready pod that is not known to be in
step, `GET /v1/pagoda/adapters`, then `DELETE` the adapters the spec no longer names (the runtime drains
their requests first) and `PUT` those missing or with another source or revision. A new replica is Ready
(it serves the base model) before it serves the adapters: the pass after it turns Ready loads them, and the
status counts it as not serving them until then.

What a pass costs is bounded: at most `per_pass` pods are asked, all at once (a pass waits for the slowest
pod, not for the sum of them), and each call has a timeout; a pod in step is not asked again for
`recheck_after` seconds (a runtime restarted in place is a new view: the key includes the container restart
count). A pod that cannot
be reached is retried after `retry_after` seconds, doubling up to `max_retry_after`; a failed load is
retried after `failed_retry_after` seconds (the runtime keeps the Failed entry until then). A PUT or DELETE
that times out goes on in the runtime: the adapter counts as Loading (or Unloading) and the next pass looks.
While any adapter is not Ready the caller requeues after `requeue_after`.

Every call is signed with the operator's management key (contract/management.py) for the pod it goes to
(its UID and its address): the runtime answers no one else, and no other pod accepts it. The inference
API's key (spec.runtime.apiKeySecret) is not used. A pod that serves TLS (spec.runtime.tls) is called only
once its certificate verifies against the CA in that Secret, for the Service's DNS name (PodTrust): an
unverified connection would hand the signed call, and the answer, to whoever answers on the pod's IP.
"""

from __future__ import annotations

import base64
import functools
import http.client
import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from pagoda.contract import ADAPTERS_PATH, HTTP_PORT, TLS_CA_KEY
from pagoda.operator.api import InferenceServiceSpec
from pagoda.operator.kube.client import Kube, KubeError
from pagoda.operator.kube.podmemo import PodMemo, at_once, backoff, pod_ready
from pagoda.operator.resources.meta import OWNER_LABEL
from pagoda.operator.resources.tls import PodTls, pod_scheme, pod_tls, pod_url

log = logging.getLogger("pagoda.operator.tls")
Obj = dict[str, Any]
# (method, url, body or None, headers, timeout) -> (HTTP status, JSON body); raises OSError when the pod
# cannot be reached or does not answer in time.
Request = Callable[[str, str, bytes | None, dict[str, str], float], tuple[int, Obj]]
MESSAGE_MAX = 1024
# What a call to a pod can raise: unreachable, timed out, a connection closed mid-answer, bad JSON.
CALL_FAILED = (OSError, ValueError, http.client.HTTPException)
# What the spec asks of one adapter: its source URI and hub revision (None: the default branch).
Want = tuple[str, str | None]


class Signs(Protocol):
    """What signs the calls: the runtime's Signer, or the operator's KeyRing (kube/management.py)."""

    def authorization(self, method: str, host: str, path: str, body: bytes, *, pod: str) -> str: ...


class TlsRefused(OSError):
    """The operator does not call this TLS pod: it cannot verify the pod's certificate (PodTls.refused)."""


def http_request(
    method: str,
    url: str,
    body: bytes | None,
    headers: dict[str, str],
    timeout: float,
    tls: PodTls | None = None,
) -> tuple[int, Obj]:
    """One call to a pod: `url` is https for a pod with spec.runtime.tls (resources/tls.py pod_url), made
    only as `tls` says (https_call)."""
    if url.startswith("https:"):
        status, raw = https_call(tls, method, url, body, headers, timeout)
        return status, _json(raw)
    request = urllib.request.Request(url, data=body, headers=headers, method=method)  # noqa: S310 (pod IP)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return response.status, _json(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, _json(exc.read())


class _PodConnection(http.client.HTTPSConnection):
    """HTTPS to a pod's IP that checks its certificate for the service's DNS name (sent as SNI too), which
    the certificate carries, rather than for the IP, which it does not. The Host header stays the pod's
    address: the signature binds it and the runtime checks it (contract/management.py)."""

    def __init__(self, host: str, port: int, tls: PodTls, timeout: float) -> None:
        assert tls.context is not None
        super().__init__(host, port, timeout=timeout, context=tls.context)
        self._pod_context, self._server_name = tls.context, tls.server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._pod_context.wrap_socket(self.sock, server_hostname=self._server_name)


def https_call(
    tls: PodTls | None, method: str, url: str, body: bytes | None, headers: dict[str, str], timeout: float
) -> tuple[int, bytes]:
    """(HTTP status, body) of one call to a TLS pod; TlsRefused, without connecting, when `tls` gives no way
    to verify it; ssl.SSLCertVerificationError when its certificate is not from the Secret's CA or does not
    name the Service."""
    if tls is None or tls.context is None:
        raise TlsRefused(
            tls.refused if tls is not None and tls.refused else "no CA to verify this TLS pod against"
        )
    parts = urlsplit(url)
    connection = _PodConnection(parts.hostname or "", parts.port or 443, tls, timeout)
    try:
        connection.request(
            method, f"{parts.path}?{parts.query}" if parts.query else parts.path, body, headers
        )
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


class PodTrust:
    """How the operator verifies the pods of each service that serves TLS: against the `ca.crt` of its
    spec.runtime.tls Secret, for `<name>.<namespace>.svc` (resources/tls.py pod_tls), as Prometheus does.

    The spec comes from `owner` (the watch-fed cache's InferenceService), the Secret from one GET: the only
    Secret of a user's the operator reads the data of (it needs `get` on Secrets, docs/install.md), and only
    `ca.crt` is kept. What it finds is remembered for `remember` seconds (a new CA is picked up within that;
    the pods' certificates, renewed from the same CA, need nothing), a Secret it cannot use for
    `retry_after` seconds, logged each time it is looked at again. Safe to share between reconcile workers.
    """

    def __init__(
        self,
        kube: Kube,
        owner: Callable[[str, str], Obj | None],
        *,
        remember: float = 300.0,
        retry_after: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube, self._owner, self._clock = kube, owner, clock
        self._remember, self._retry_after = remember, retry_after
        self._known: dict[tuple[str, str, str], tuple[PodTls, float]] = {}  # (ns, name, tls) -> (it, until)
        self._lock = threading.Lock()

    def for_pod(self, pod: Obj) -> PodTls:
        """How to call `pod` (one that serves TLS), from its service's spec as it stands."""
        meta = pod.get("metadata") or {}
        namespace, name = (
            str(meta.get("namespace") or ""),
            str((meta.get("labels") or {}).get(OWNER_LABEL) or ""),
        )
        tls = (((self._owner(namespace, name) or {}).get("spec") or {}).get("runtime") or {}).get("tls")
        tls = tls if isinstance(tls, dict) else None
        key = (namespace, name, json.dumps(tls, sort_keys=True))
        with self._lock:
            known = self._known.get(key)
            if known is not None and self._clock() < known[1]:
                return known[0]
        found = self._resolve(namespace, name, tls)
        until = self._clock() + (self._retry_after if found.refused else self._remember)
        with self._lock:
            self._known = {k: v for k, v in self._known.items() if v[1] > self._clock()}
            self._known[key] = (found, until)
        return found

    def _resolve(self, namespace: str, name: str, tls: Obj | None) -> PodTls:
        ca, unreadable = None, None
        if tls is not None and not tls.get("insecureSkipVerify"):
            ca, unreadable = self._read_ca(namespace, str(tls.get("secretName") or ""))
        found = pod_tls(namespace, name, tls, ca, unreadable)
        if found.refused:
            log.warning("Not calling the TLS pods name=%s namespace=%s: %s", name, namespace, found.refused)
        elif not found.verified:
            log.info(
                "Calling the TLS pods name=%s namespace=%s unverified (insecureSkipVerify)", name, namespace
            )
        return found

    def _read_ca(self, namespace: str, secret: str) -> tuple[str | None, str | None]:
        """(ca.crt, None), or (None, why the Secret cannot be read)."""
        try:
            found = self._kube.get("v1", "secrets", namespace, secret)
        except KubeError as exc:
            grant = (
                " (the operator needs `get` on Secrets here, docs/install.md)" if exc.status == 403 else ""
            )
            return None, f"HTTP {exc.status}{grant}: {exc.message}"[:MESSAGE_MAX]
        except OSError as exc:  # the API server did not answer: looked at again after retry_after
            return None, str(exc)[:MESSAGE_MAX]
        if found is None:
            return None, "it does not exist"
        value = (found.get("data") or {}).get(TLS_CA_KEY)
        if not value:
            return None, None
        try:
            return base64.b64decode(value).decode(), None
        except (ValueError, UnicodeDecodeError):
            return None, f"its {TLS_CA_KEY} is not base64 of a PEM text"


def pod_transport(trust: PodTrust | None, pod: Obj) -> PodTls | None:
    """How `pod` is called: None for plain http; for a TLS pod, as `trust` says (refused without one)."""
    if pod_scheme(pod) != "https":
        return None
    return (
        trust.for_pod(pod) if trust is not None else PodTls("", refused="the operator has no CA for TLS pods")
    )


def _json(raw: bytes) -> Obj:
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _error(status: int, body: Obj) -> tuple[str, str]:
    """(type, message) of the runtime's OpenAI-format error."""
    error = body.get("error")
    if not isinstance(error, dict):
        error = {}
    kind = str(error.get("type") or f"HTTP{status}")
    return kind[:64], str(error.get("message") or f"the runtime answered HTTP {status}")[:MESSAGE_MAX]


@dataclass
class PodView:
    """What the operator knows of one runtime's adapters."""

    adapters: dict[str, Obj] = field(default_factory=dict)  # name -> the runtime's entry
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
        self, request: Request, method: str, url: str, uid: str, body: Obj | None, timeout: float
    ) -> tuple[int, Obj]:
        """One call to a pod's management API, signed for that pod (`uid`, and the Host in `url`)."""
        data = json.dumps(body).encode() if body is not None else None
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
            return self._unreachable(view, reason, f"GET {ADAPTERS_PATH}: {_error(status, body)[1]}")
        entries = {str(e.get("name")): e for e in body.get("adapters") or [] if isinstance(e, dict)}
        failed_at = dict(view.failed_at)
        for name, entry in list(entries.items()):  # DELETE first: it makes room for the PUTs
            if name in desired or entry.get("state") == "Unloading":
                continue
            try:
                status, body = self._call(request, "DELETE", f"{base}/{name}", uid, None, self._load_timeout)
            except CALL_FAILED:
                entries[name] = {**entry, "state": "Unloading"}  # it drains on; the next pass looks
                continue
            if status in (200, 404):
                del entries[name]
        now = self._clock()
        for name, want in desired.items():
            current = entries.get(name)
            if current is not None and serves(current, want):
                if current.get("state") in ("Loaded", "Loading"):
                    continue
                failed = failed_at.get((name, want))
                if (
                    current.get("state") == "Failed"
                    and failed is not None
                    and now < failed + self._failed_retry_after
                ):
                    continue
            source, revision = want
            put: Obj = {"source": source} | ({"revision": revision} if revision is not None else {})
            ask = {"name": name, **put}
            try:
                status, body = self._call(request, "PUT", f"{base}/{name}", uid, put, self._load_timeout)
            except CALL_FAILED:
                entries[name] = {**ask, "state": "Loading"}  # it loads on
                continue
            if status == 200:
                entries[name] = body
                failed_at.pop((name, want), None)
            else:
                kind, message = _error(status, body)
                entries[name] = {**ask, "state": "Failed", "reason": kind, "error": message}
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
            entry = view.adapters.get(name) or {}
            if not serves(entry, want) or entry.get("state") not in ("Loaded", "Failed"):
                looks.append(view.checked_at + self._requeue_after)
            elif entry.get("state") == "Failed":
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
            failed: Obj | None = None
            for view in views:
                entry = view.adapters.get(name) or {}
                if view.checked_at is not None and serves(entry, want):
                    if entry.get("state") == "Loaded":
                        serving += 1
                    elif entry.get("state") == "Failed" and failed is None:
                        failed = entry
            item: Obj = {"name": name, "readyReplicas": serving, "replicas": len(views)}
            if failed is not None:
                item.update(state="Failed", reason=str(failed.get("reason") or "AdapterLoadFailed"))
                item["message"] = str(failed.get("error") or "")[:MESSAGE_MAX]
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


def unreachable_reason(exc: BaseException) -> str:
    """CertificateNotVerified for a TLS pod not called (TlsRefused) or whose certificate did not verify (from
    another CA, or not for the Service's name); ReplicaUnreachable otherwise."""
    refused = isinstance(exc, TlsRefused | ssl.SSLCertVerificationError)
    return "CertificateNotVerified" if refused else "ReplicaUnreachable"


def serves(entry: Obj, want: Want) -> bool:
    """Whether the runtime's entry is the adapter the spec asks for: the same source and revision (an entry
    without `revision` is the default branch)."""
    return entry.get("source") == want[0] and entry.get("revision") == want[1]


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
