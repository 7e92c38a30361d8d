"""The operator's management key: the Ed25519 private key it signs every call to a runtime's management API
with (runtime/management.py has the scheme and the runtime's check).

With --management-key-secret NAMESPACE/NAME (the chart sets it to a Secret in the operator's own
namespace) the key is read from that Secret's `private-key.pem`, and made and stored there by the first
operator that finds none: every replica and every restart signs with the same key, so the pods' public key
(a ConfigMap per service, resources/management.py) stays put. Two replicas starting at once both try to
create it; the one that loses reads the winner's. Without the flag (a local run) the key is made in
memory for this process: each start writes a new public key, which the pods' ConfigMap volumes follow
within about a minute (until then the adapters calls get 401 and are retried).
"""

from __future__ import annotations

import base64
import logging

from pagoda.operator.reconcile.kube import Kube, KubeError
from pagoda.runtime import management

log = logging.getLogger("pagoda.operator.management")
KEY_FIELD = "private-key.pem"


class KeyUnavailable(RuntimeError):
    """The key Secret can be neither read nor created; the message says why and what to grant."""


def parse_namespaced_name(value: str, flag: str) -> tuple[str, str]:
    """NAMESPACE/NAME of a command-line `flag` (--management-key-secret, --leader-elect)."""
    namespace, _, name = value.partition("/")
    if not namespace or not name or "/" in name:
        raise ValueError(f"{flag}: give NAMESPACE/NAME (got {value!r})")
    return namespace, name


def load_signer(kube: Kube, secret: tuple[str, str] | None) -> management.Signer:
    """The operator's Signer: from the key Secret (made when missing), or a key of this process's own."""
    if secret is None:
        log.warning("Using a management key of this process only (no --management-key-secret)")
        return management.Signer(management.new_private_key())
    return management.Signer(_read_or_create(kube, *secret))


def _read_or_create(kube: Kube, namespace: str, name: str) -> bytes:
    where = f"Secret {namespace}/{name}"
    for _ in range(2):  # a create that lost a race: read the winner's
        try:
            found = kube.get("v1", "secrets", namespace, name)
        except KubeError as exc:
            raise KeyUnavailable(
                f"Cannot read the management key {where} (HTTP {exc.status}): {exc}"
            ) from exc
        if found is not None:
            value = (found.get("data") or {}).get(KEY_FIELD)
            if not value:
                raise KeyUnavailable(
                    f"The management key {where} has no {KEY_FIELD}: delete it to make a new one"
                )
            log.info("Loaded management key secret=%s/%s", namespace, name)
            return base64.b64decode(value)
        key = management.new_private_key()
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/part-of": "pagoda"},
            },
            "type": "Opaque",
            "data": {KEY_FIELD: base64.b64encode(key).decode()},
        }
        try:
            kube.create(secret, "secrets")
        except KubeError as exc:
            if exc.status == 409:
                continue
            raise KeyUnavailable(
                f"Cannot create the management key {where} (HTTP {exc.status}): {exc}"
            ) from exc
        log.info("Created management key secret=%s/%s", namespace, name)
        return key
    raise KeyUnavailable(f"The management key {where} was created and deleted again while starting")
