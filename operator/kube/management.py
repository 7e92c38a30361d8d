"""The operator's management keys: the Ed25519 private key it signs every call to a runtime's management API
with (contract/management.py has the scheme and the runtime's check), and its rotation.

With --management-key-secret NAMESPACE/NAME (the chart sets it to a Secret in the operator's own
namespace) the key is read from that Secret's `private-key.pem`, and made and stored there by the first
operator that finds none: every replica and every restart signs with the same key, so the pods' public key
(a ConfigMap per service, resources/management.py) stays put. Two replicas starting at once both try to
create it; the one that loses reads the winner's. Without the flag (a local run) the key is made in
memory for this process: each start writes a new public key, which the pods' ConfigMap volumes follow
within about a minute (until then the adapters calls get 401 and are retried).

Rotation (docs/design/2026-12-05-management-key-rotation.md) is one command: annotate the Secret
`pagoda.dev/rotate` (or delete it). The leader looks at the Secret every `poll` seconds (one GET) and moves
it through two states, each stored in the Secret itself, so a new leader carries on where the last stopped:

1. asked: it makes a new key, stores it as `next-private-key.pem` with the time it did
   (`pagoda.dev/next-key-published-at`), and drops the annotation. From then on every service's ConfigMap
   holds both public keys, the old one first, and the operator still signs with the old key.
2. `overlap` seconds later (a resync, by which every ConfigMap was rewritten, plus the kubelet's sync of
   ConfigMap volumes), every pod has both keys: the new key becomes `private-key.pem`, the old one is
   gone from the Secret, and the ConfigMaps hold only the new public key.

So no pod ever sees a call signed with a key it does not have: no 401 window. Deleting the Secret is a
rotation too, while the leader runs: it stores the key it signs with and a new one, as in 1. (Deleted while
no operator runs, the key is lost: the next start makes a new one, and calls get 401 until the pods have
it, about a minute.)
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pagoda.contract import management
from pagoda.operator.kube.client import Kube, KubeError

log = logging.getLogger("pagoda.operator.management")
KEY_FIELD = "private-key.pem"
NEXT_KEY_FIELD = "next-private-key.pem"
ROTATE_ANNOTATION = "pagoda.dev/rotate"
PUBLISHED_ANNOTATION = "pagoda.dev/next-key-published-at"
# The kubelet's sync of a ConfigMap volume: its sync period (1 min) and the jitter and cache delay on top.
KUBELET_SYNC_SECONDS = 120.0
Obj = dict[str, Any]


class KeyUnavailable(RuntimeError):
    """The key Secret can be neither read nor created; the message says why and what to grant."""


def parse_namespaced_name(value: str, flag: str) -> tuple[str, str]:
    """NAMESPACE/NAME of a command-line `flag` (--management-key-secret, --leader-elect)."""
    namespace, _, name = value.partition("/")
    if not namespace or not name or "/" in name:
        raise ValueError(f"{flag}: give NAMESPACE/NAME (got {value!r})")
    return namespace, name


class KeyRing:
    """The keys the operator signs with and publishes: a Signer for AdapterSync (`authorization`) and the
    pods' public keys (`public_pem`, for resources/management.py), both following the Secret as `refresh`
    finds it. Safe to share between reconcile workers."""

    def __init__(
        self,
        kube: Kube,
        secret: tuple[str, str] | None,
        *,
        overlap: float,
        poll: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kube, self._secret, self._overlap, self._poll, self._clock = kube, secret, overlap, poll, clock
        self._lock = threading.Lock()
        self._next_poll = clock() + poll  # just read at start
        self._signer = management.Signer(management.new_private_key(), clock)
        self._next: management.Signer | None = None
        if secret is None:
            log.warning("Using a management key of this process only (no --management-key-secret)")
        else:
            self._adopt(self._read_or_create())

    @property
    def public_pem(self) -> str:
        """The public keys the pods accept: the one signing first, then the one a rotation brings."""
        with self._lock:
            keys = [self._signer] + ([self._next] if self._next is not None else [])
        return "".join(key.public_pem for key in keys)

    def authorization(self, method: str, host: str, path: str, body: bytes, *, pod: str) -> str:
        with self._lock:
            signer = self._signer
        return signer.authorization(method, host, path, body, pod=pod)

    def refresh(self) -> None:
        """Look at the Secret (at most every `poll` seconds) and take the rotation's next step, if due. A
        failed read or write is logged and tried again at the next poll; the key known goes on signing."""
        if self._secret is None:
            return
        with self._lock:
            now = self._clock()
            if now < self._next_poll:
                return
            self._next_poll = now + self._poll
        try:
            self._adopt(self._step(self._kube.get("v1", "secrets", *self._secret)))
        except (KubeError, OSError, KeyUnavailable, ValueError) as exc:
            log.warning(
                "Management key rotation stalled secret=%s/%s (still signing with the key known; the "
                "operator needs get and update on that Secret): %s",
                *self._secret,
                exc,
            )

    def _step(self, found: Obj | None) -> Obj:
        """The Secret after this poll's step of a rotation (written back when it changed)."""
        if found is None:  # deleted while this leader runs: a rotation, from the key it signs with
            with self._lock:
                current = self._signer.private_pem
            created = self._create(self._rotating(current))
            log.info("Rotating the management key secret=%s/%s: it was deleted", *self._named())
            return created
        data, meta = found.get("data") or {}, found.get("metadata") or {}
        annotations = dict(meta.get("annotations") or {})
        if not data.get(KEY_FIELD):
            raise KeyUnavailable(f"the Secret has no {KEY_FIELD}: delete it to make a new key")
        if data.get(NEXT_KEY_FIELD):
            published = _seconds(annotations.get(PUBLISHED_ANNOTATION))
            if published is None:  # a next key stored by hand: published from now on, never switched at once
                annotations[PUBLISHED_ANNOTATION] = str(int(self._clock()))
                return self._replace({**found, "metadata": {**meta, "annotations": annotations}})
            if self._clock() < published + self._overlap:
                return found
            annotations.pop(PUBLISHED_ANNOTATION, None)
            annotations.pop(ROTATE_ANNOTATION, None)
            done = {**found, "data": {KEY_FIELD: data[NEXT_KEY_FIELD]}}
            switched = self._replace(done | {"metadata": {**meta, "annotations": annotations}})
            log.info("Signing with the new management key secret=%s/%s", *self._named())
            return switched
        if ROTATE_ANNOTATION not in annotations:
            return found
        rotating = self._rotating(base64.b64decode(data[KEY_FIELD]))
        annotations.pop(ROTATE_ANNOTATION)
        annotations.update(rotating["metadata"]["annotations"])
        started = self._replace(
            {**found, "data": rotating["data"], "metadata": {**meta, "annotations": annotations}}
        )
        log.info(
            "Rotating the management key secret=%s/%s: new public key published, signing with it in %.0f s",
            *self._named(),
            self._overlap,
        )
        return started

    def _named(self) -> tuple[str, str]:
        assert self._secret is not None
        return self._secret

    def _rotating(self, current: bytes) -> Obj:
        """The Secret of a rotation's first step: `current` still signs, a new key is published beside it."""
        secret = _secret_object(*self._named(), current)
        secret["data"][NEXT_KEY_FIELD] = base64.b64encode(management.new_private_key()).decode()
        secret["metadata"]["annotations"] = {PUBLISHED_ANNOTATION: str(int(self._clock()))}
        return secret

    def _replace(self, secret: Obj) -> Obj:
        """PUT the Secret back, only if nobody changed it since it was read (409 otherwise: the next poll
        reads it again). Needs `update` on this one Secret (the chart's Role)."""
        return self._kube.replace({"apiVersion": "v1", "kind": "Secret", **secret}, "secrets")

    def _create(self, secret: Obj) -> Obj:
        return self._kube.create(secret, "secrets")

    def _adopt(self, secret: Obj) -> None:
        """Sign and publish as the Secret says."""
        data = secret.get("data") or {}
        current = management.Signer(base64.b64decode(data[KEY_FIELD]), self._clock)
        upcoming = data.get(NEXT_KEY_FIELD)
        following = management.Signer(base64.b64decode(upcoming), self._clock) if upcoming else None
        with self._lock:
            if current.public_pem != self._signer.public_pem:
                self._signer = current
            if (following and following.public_pem) != (self._next and self._next.public_pem):
                self._next = following

    def _read_or_create(self) -> Obj:
        assert self._secret is not None
        namespace, name = self._secret
        where = f"Secret {namespace}/{name}"
        for _ in range(2):  # a create that lost a race: read the winner's
            try:
                found = self._kube.get("v1", "secrets", namespace, name)
            except KubeError as exc:
                raise KeyUnavailable(
                    f"Cannot read the management key {where} (HTTP {exc.status}): {exc}"
                ) from exc
            if found is not None:
                if not (found.get("data") or {}).get(KEY_FIELD):
                    raise KeyUnavailable(
                        f"The management key {where} has no {KEY_FIELD}: delete it to make a new one"
                    )
                log.info("Loaded management key secret=%s/%s", namespace, name)
                return found
            secret = _secret_object(namespace, name, management.new_private_key())
            try:
                created = self._create(secret)
            except KubeError as exc:
                if exc.status == 409:
                    continue
                raise KeyUnavailable(
                    f"Cannot create the management key {where} (HTTP {exc.status}): {exc}"
                ) from exc
            log.info("Created management key secret=%s/%s", namespace, name)
            return created or secret
        raise KeyUnavailable(f"The management key {where} was created and deleted again while starting")


def _seconds(value: object) -> float | None:
    try:
        return float(str(value)) if value is not None else None
    except ValueError:
        return None


def _secret_object(namespace: str, name: str, key: bytes) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "pagoda"}},
        "type": "Opaque",
        "data": {KEY_FIELD: base64.b64encode(key).decode()},
    }


def load_keys(kube: Kube, secret: tuple[str, str] | None, overlap: float) -> KeyRing:
    """The operator's KeyRing: from the key Secret (made when missing), or a key of this process's own."""
    return KeyRing(kube, secret, overlap=overlap)
