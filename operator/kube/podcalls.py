"""The operator's calls to its runtime pods: one HTTP call (http_request), over https for a pod that serves
TLS (spec.runtime.tls) only as a PodTls says (https_call: the pod's certificate verified for the Service's
DNS name), how a failed call reads in the status (pod_error, unreachable_reason), and how the operator trusts
the pods of each service (PodTrust, pod_transport). capacity.py and adapters.py make the calls.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from pagoda.contract import TLS_CA_KEY
from pagoda.operator.kube.client import Kube, KubeError
from pagoda.operator.resources.meta import OWNER_LABEL
from pagoda.operator.resources.tls import PodTls, pod_scheme, pod_tls

log = logging.getLogger("pagoda.operator.tls")

Obj = dict[str, Any]
# (method, url, body or None, headers, timeout) -> (HTTP status, JSON body); raises OSError when the pod
# cannot be reached or does not answer in time.
Request = Callable[[str, str, bytes | None, dict[str, str], float], tuple[int, Obj]]
# What a call to a pod can raise: unreachable, timed out, a connection closed mid-answer, bad JSON.
CALL_FAILED = (OSError, ValueError, http.client.HTTPException)
MESSAGE_MAX = 1024  # the most of a pod's error message that goes into the status


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


def _json(raw: bytes) -> Obj:
    """A JSON object from a pod's answer; {} for anything else (an error page, an empty body)."""
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def unreachable_reason(exc: BaseException) -> str:
    """CertificateNotVerified for a TLS pod not called (TlsRefused) or whose certificate did not verify (from
    another CA, or not for the Service's name); ReplicaUnreachable otherwise."""
    refused = isinstance(exc, TlsRefused | ssl.SSLCertVerificationError)
    return "CertificateNotVerified" if refused else "ReplicaUnreachable"


def pod_error(status: int, body: Obj) -> tuple[str, str]:
    """(type, message) of the runtime's OpenAI-format error."""
    error = body.get("error")
    if not isinstance(error, dict):
        error = {}
    kind = str(error.get("type") or f"HTTP{status}")
    return kind[:64], str(error.get("message") or f"the runtime answered HTTP {status}")[:MESSAGE_MAX]


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
