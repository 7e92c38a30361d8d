"""Who may call a runtime's management API: only the operator, which signs each call with its Ed25519 key.

The management API (contract.ADAPTERS_PATH: list, load and unload LoRA adapters) changes what a pod serves
and makes it download whatever a source names, so it must not answer whoever can reach the pod. The
operator holds a private key (a Secret in its own namespace, operator/management.py); each runtime pod holds
only the public key, in a file from a ConfigMap the operator writes (contract.MANAGEMENT_PUBLIC_KEY_PATH).
A stolen public key signs nothing, no Secret is copied into a user's namespace, and the operator needs no
access to the users' Secrets (the inference API's own apiKeySecret is not involved).

A signed call carries

    Authorization: Pagoda-Ed25519 t=<unix seconds>,n=<random nonce>,sig=<base64url signature>

over `pagoda-management-v1`, the method, the Host header, the path with its query, t, n, and the SHA-256
of the body, one per line (the nonce makes two identical calls in one second two signatures). The runtime
accepts it when the signature verifies, t is within MAX_SKEW seconds of its clock, and the signature was
not accepted before (a replay inside the window is refused too); the Host binds it to the pod it was sent
to.

`cryptography` does the Ed25519 (the standard library has none); it is imported lazily so that the modules
importing this one load without it.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCHEME = "Pagoda-Ed25519"
VERSION = b"pagoda-management-v1"
MAX_SKEW = 60.0  # seconds between the operator's clock and the pod's
MAX_BODY = 64 * 1024  # a management call's body (a source URI and a revision)


class Unauthorized(Exception):
    """Why a management call is refused (the message says what to fix, never a secret)."""


def signed_bytes(method: str, host: str, path: str, timestamp: int, nonce: str, body: bytes) -> bytes:
    """What the signature covers."""
    digest = hashlib.sha256(body).hexdigest()
    parts = [method.upper(), host, path, str(timestamp), nonce, digest]
    return b"\n".join([VERSION, *(part.encode() for part in parts)])


def new_private_key() -> bytes:
    """A fresh Ed25519 private key, PEM (PKCS#8)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class Signer:
    """The operator's side: signs management calls with a private key (PEM)."""

    def __init__(self, private_pem: bytes, clock: Callable[[], float] = time.time) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        key = serialization.load_pem_private_key(private_pem, password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError("the management key is not an Ed25519 private key")
        self._key, self._clock = key, clock
        self.public_pem = (
            key.public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            .decode()
        )

    def authorization(self, method: str, host: str, path: str, body: bytes) -> str:
        """The Authorization header of one call."""
        timestamp, nonce = int(self._clock()), secrets.token_hex(8)
        signature = self._key.sign(signed_bytes(method, host, path, timestamp, nonce, body))
        return f"{SCHEME} t={timestamp},n={nonce},sig={base64.urlsafe_b64encode(signature).decode()}"


class Verifier:
    """The runtime's side: checks a call's Authorization header against the public key in `key_file`,
    read again at each call (a ConfigMap volume swaps the file when the operator's key changes)."""

    def __init__(self, key_file: str | Path, clock: Callable[[], float] = time.time) -> None:
        self.key_file, self._clock = Path(key_file), clock
        self._seen: dict[bytes, float] = {}  # accepted signatures -> when they leave the window

    def check(self, method: str, host: str, path: str, body: bytes, authorization: str | None) -> None:
        """Returns when the call is the operator's; raises Unauthorized otherwise."""
        from cryptography.exceptions import InvalidSignature

        timestamp, nonce, signature = _parse(authorization)
        now = self._clock()
        if abs(now - timestamp) > MAX_SKEW:
            raise Unauthorized(
                f"the signature's time is {now - timestamp:+.0f} s from this pod's clock "
                f"(at most {MAX_SKEW:.0f})"
            )
        self._seen = {sig: until for sig, until in self._seen.items() if until > now}
        if signature in self._seen:
            raise Unauthorized("this signed call was already made once (a replay)")
        try:
            self.public_key().verify(signature, signed_bytes(method, host, path, timestamp, nonce, body))
        except InvalidSignature:
            raise Unauthorized("the signature does not verify with the operator's public key") from None
        self._seen[signature] = timestamp + MAX_SKEW

    def public_key(self) -> Any:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        try:
            key = serialization.load_pem_public_key(self.key_file.read_bytes())
        except (OSError, ValueError) as exc:
            problem = f"cannot read the operator's public key {self.key_file}: {exc}"
            raise Unauthorized(problem) from None
        if not isinstance(key, Ed25519PublicKey):
            raise Unauthorized(f"{self.key_file} is not an Ed25519 public key")
        return key


def _parse(authorization: str | None) -> tuple[int, str, bytes]:
    """(t, n, signature) of a `Pagoda-Ed25519 t=...,n=...,sig=...` header."""
    if not authorization:
        raise Unauthorized(
            f"the management API needs an {SCHEME} Authorization header signed by the operator"
        )
    scheme, _, params = authorization.partition(" ")
    if scheme != SCHEME:
        raise Unauthorized(f"the management API accepts only {SCHEME} signatures, not {scheme[:32]!r}")
    fields = dict(part.strip().partition("=")[::2] for part in params.split(","))
    try:
        return int(fields["t"]), fields["n"], base64.urlsafe_b64decode(fields["sig"].encode())
    except (KeyError, ValueError):
        raise Unauthorized(
            f"a malformed {SCHEME} header: it needs t=<unix seconds>,n=<nonce>,sig=<base64>"
        ) from None
