"""Who may call a runtime's management API: only the operator, which signs each call with its Ed25519 key,
for the one pod it calls.

The management API (contract.ADAPTERS_PATH: list, load and unload LoRA adapters) changes what a pod serves
and makes it download whatever a source names, so it must not answer whoever can reach the pod. The
operator holds a private key (a Secret in its own namespace, operator/management.py); each runtime pod holds
only the public key, in a file from a ConfigMap the operator writes (contract.MANAGEMENT_PUBLIC_KEY_PATH).
A stolen public key signs nothing, no Secret is copied into a user's namespace, and the operator needs no
access to the users' Secrets (the inference API's own apiKeySecret is not involved).

A signed call carries (version 2 of the scheme, contract.MANAGEMENT_SIGNATURE_VERSION)

    Authorization: Pagoda-Ed25519 v=2,pod=<pod UID>,t=<unix seconds>,n=<random nonce>,sig=<base64url>

over `pagoda-management-v2`, the method, the Host header, the pod's UID, the path with its query, t, n, and
the SHA-256 of the body, one per line (the nonce makes two identical calls in one second two signatures).
One key signs for every pod of every namespace, so a call is bound to the pod it is for: the runtime
(Verifier) accepts it only when

- `pod` is its own UID (contract.POD_UID_ENV, the downward API's metadata.uid): a call captured on its way
  to pod A and replayed to pod B within the window is refused by B, as is one replayed to a new pod that
  got A's IP;
- the Host header is its own address (PodIdentity.hosts: `<POD_IP>:<port>`, contract.POD_IP_ENV);
- the signature verifies, t is within MAX_SKEW seconds of its clock, and the signature was not accepted
  before (a replay to the same pod inside the window is refused too).

A runtime that is not told its pod IP (started by hand, outside Kubernetes) binds calls to the address it
serves on, `--host:--port` (`localhost:<port>` too for a loopback --host), and without a UID to calls signed
for pod "" (none); one serving on a wildcard address (0.0.0.0, the default) without POD_IP does not know its
address and refuses every management call, saying so. Version 1 (no pod, no version field) is refused
with a message that says to upgrade the operator and the runtime together (docs/install.md).

The public key file may hold several keys (PEM blocks one after the other): a call verifies if any of them
signed it. That is how the operator rotates its key without a 401 window (operator/kube/management.py,
docs/design/2026-12-05-management-key-rotation.md): it publishes the new key beside the old one, keeps
signing with the old until every pod's volume has both, then signs with the new and drops the old; a call
signed with a key no longer in the file is refused. The key the operator signs with comes first, so a
runtime older than this, which reads only the first block, keeps verifying its calls until the switch.

`cryptography` does the Ed25519 (the standard library has none); it is imported lazily so that the modules
importing this one load without it.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagoda.contract import (
    MANAGEMENT_AUTH_SCHEME,
    MANAGEMENT_MAX_SKEW_SECONDS,
    MANAGEMENT_SIGNATURE_VERSION,
    POD_IP_ENV,
    POD_UID_ENV,
)

SCHEME = MANAGEMENT_AUTH_SCHEME
VERSION = f"pagoda-management-v{MANAGEMENT_SIGNATURE_VERSION}".encode()
MAX_SKEW = float(MANAGEMENT_MAX_SKEW_SECONDS)  # seconds between the operator's clock and the pod's
MAX_BODY = 64 * 1024  # a management call's body (a source URI and a revision)
WILDCARDS = (
    "",
    "0.0.0.0",
    "::",
)  # a --host that is every address: not one a Host header can be checked against
MAX_UID = 128  # a pod UID is 36 characters; a longer `pod` field is not one
MAX_KEYS = 8  # public keys in one file: the signing key and the one a rotation brings, with room to spare
PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z ]+)-----.+?-----END \1-----", re.DOTALL)


class Unauthorized(Exception):
    """Why a management call is refused (the message says what to fix, never a secret)."""


def signed_bytes(
    method: str, host: str, pod: str, path: str, timestamp: int, nonce: str, body: bytes
) -> bytes:
    """What the signature covers."""
    digest = hashlib.sha256(body).hexdigest()
    parts = [method.upper(), host, pod, path, str(timestamp), nonce, digest]
    return b"\n".join([VERSION, *(part.encode() for part in parts)])


def host_header(address: str, port: int) -> str:
    """The Host header of a call to `address:port` (an IPv6 address in brackets), lower case."""
    bare = address.strip().strip("[]").lower()
    return f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"


@dataclass(frozen=True)
class PodIdentity:
    """Which pod a runtime is, as far as the management API's signatures go."""

    uid: str  # the pod's metadata.uid; "" when the runtime is not told one (outside Kubernetes)
    hosts: frozenset[str]  # the Host headers that name it; empty: it does not know its address

    @classmethod
    def from_env(cls, environ: Mapping[str, str], listen_host: str, port: int) -> PodIdentity:
        """From the downward API's variables (operator/resources/pod.py), else from --host and --port."""
        ip = (environ.get(POD_IP_ENV) or "").strip()
        addresses = [ip] if ip else [] if listen_host.strip() in WILDCARDS else [listen_host]
        if not ip and addresses and _loopback(listen_host):
            addresses.append("localhost")
        uid = (environ.get(POD_UID_ENV) or "").strip()
        return cls(uid, frozenset(host_header(a, port) for a in addresses))

    def describe(self) -> str:
        """For the log at start: what calls must be signed for."""
        hosts = ", ".join(sorted(self.hosts)) or "none known: every management call is refused"
        return f"pod={self.uid or '(none)'} hosts={hosts}"


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return host.strip().lower() == "localhost"


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
        self._key, self._clock, self.private_pem = key, clock, private_pem
        self.public_pem = (
            key.public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            .decode()
        )

    def authorization(self, method: str, host: str, path: str, body: bytes, *, pod: str) -> str:
        """The Authorization header of one call to the pod whose UID is `pod`, at `host` (its Host header)."""
        timestamp, nonce = int(self._clock()), secrets.token_hex(8)
        signature = self._key.sign(signed_bytes(method, host, pod, path, timestamp, nonce, body))
        sig = base64.urlsafe_b64encode(signature).decode()
        return f"{SCHEME} v={MANAGEMENT_SIGNATURE_VERSION},pod={pod},t={timestamp},n={nonce},sig={sig}"


class Verifier:
    """The runtime's side: checks a call's Authorization header against the public keys in `key_file`,
    read again at each call (a ConfigMap volume swaps the file when the operator's keys change), and that
    the call is for this pod (`identity`)."""

    def __init__(
        self, key_file: str | Path, identity: PodIdentity, clock: Callable[[], float] = time.time
    ) -> None:
        self.key_file, self.identity, self._clock = Path(key_file), identity, clock
        self._seen: dict[bytes, float] = {}  # accepted signatures -> when they leave the window

    def check(self, method: str, host: str, path: str, body: bytes, authorization: str | None) -> None:
        """Returns when the call is the operator's, for this pod; raises Unauthorized otherwise."""
        from cryptography.exceptions import InvalidSignature

        pod, timestamp, nonce, signature = _parse(authorization)
        if pod != self.identity.uid:
            raise Unauthorized(
                f"this call was signed for pod {pod or '(none)'!r}, and this is pod "
                f"{self.identity.uid or '(none)'!r} (a call to another pod, replayed here?)"
            )
        if not self.identity.hosts:
            raise Unauthorized(
                f"this runtime does not know its own address, so it cannot check the Host: set {POD_IP_ENV} "
                "(the operator's pods have it from the downward API) or serve on one --host"
            )
        if host.strip().lower() not in self.identity.hosts:
            own = ", ".join(sorted(self.identity.hosts))
            raise Unauthorized(f"the Host {host[:128]!r} is not this pod's address ({own})")
        now = self._clock()
        if abs(now - timestamp) > MAX_SKEW:
            raise Unauthorized(
                f"the signature's time is {now - timestamp:+.0f} s from this pod's clock "
                f"(at most {MAX_SKEW:.0f})"
            )
        self._seen = {sig: until for sig, until in self._seen.items() if until > now}
        if signature in self._seen:
            raise Unauthorized("this signed call was already made once (a replay)")
        signed = signed_bytes(method, host, pod, path, timestamp, nonce, body)
        for key in read_public_keys(self.key_file):
            try:
                key.verify(signature, signed)
            except InvalidSignature:
                continue
            self._seen[signature] = timestamp + MAX_SKEW
            return
        raise Unauthorized("the signature does not verify with the operator's public key")


def read_public_key(key_file: str | Path) -> Any:
    """The first of the operator's public keys in `key_file` (the one it signs with); see read_public_keys."""
    return read_public_keys(key_file)[0]


def read_public_keys(key_file: str | Path) -> list[Any]:
    """The operator's Ed25519 public keys in `key_file`, PEM blocks one after the other (at most MAX_KEYS);
    Unauthorized when it cannot be read, holds none, or one of them is not an Ed25519 public key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        blocks = [m.group(0) for m in PEM_BLOCK.finditer(Path(key_file).read_bytes())]
        if not blocks:
            raise ValueError("no PEM public key in it")
        if len(blocks) > MAX_KEYS:
            raise ValueError(f"{len(blocks)} keys in it, at most {MAX_KEYS}")
        keys = [serialization.load_pem_public_key(block) for block in blocks]
    except (OSError, ValueError) as exc:
        raise Unauthorized(f"cannot read the operator's public key {key_file}: {exc}") from None
    if not all(isinstance(key, Ed25519PublicKey) for key in keys):
        raise Unauthorized(f"{key_file} holds a key that is not an Ed25519 public key")
    return keys


def _parse(authorization: str | None) -> tuple[str, int, str, bytes]:
    """(pod, t, n, signature) of a `Pagoda-Ed25519 v=2,pod=...,t=...,n=...,sig=...` header."""
    if not authorization:
        raise Unauthorized(
            f"the management API needs an {SCHEME} Authorization header signed by the operator"
        )
    scheme, _, params = authorization.partition(" ")
    if scheme != SCHEME:
        raise Unauthorized(f"the management API accepts only {SCHEME} signatures, not {scheme[:32]!r}")
    fields = dict(part.strip().partition("=")[::2] for part in params.split(","))
    version = fields.get("v", "1")
    if version != str(MANAGEMENT_SIGNATURE_VERSION):
        raise Unauthorized(
            f"a version {version[:8]!r} signature: this runtime takes version {MANAGEMENT_SIGNATURE_VERSION} "
            "(signed for one pod); upgrade the operator and the runtime together (docs/install.md)"
        )
    try:
        pod = fields["pod"]
        if len(pod) > MAX_UID:
            raise ValueError(pod)
        return pod, int(fields["t"]), fields["n"], base64.urlsafe_b64decode(fields["sig"].encode())
    except (KeyError, ValueError):
        raise Unauthorized(
            f"a malformed {SCHEME} header: it needs v={MANAGEMENT_SIGNATURE_VERSION},pod=<pod UID>,"
            "t=<unix seconds>,n=<nonce>,sig=<base64>"
        ) from None
