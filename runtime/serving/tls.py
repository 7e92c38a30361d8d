"""TLS on the runtime's one port (`--tls-cert-file`, `--tls-key-file`), and a certificate renewed in place.

The operator mounts a Secret of type kubernetes.io/tls (cert-manager's key names: tls.crt, tls.key) and
passes its two files. cert-manager renews the certificate before it expires by rewriting the Secret; the
kubelet then swaps the mounted files in at once (a symlink to a new folder), within about a minute. The
runtime looks at the files every RELOAD_SECONDS: when they changed, it loads them into a new SSLContext,
and every new connection is handed that context during its handshake (the context uvicorn listens with
switches each connection in its SNI callback, which OpenSSL calls for every ClientHello, with or without a
server name). Connections already open keep the certificate they started with; nothing restarts.

A pair that cannot be used (unreadable, not PEM, an encrypted key, a key that does not match the certificate)
is refused at start with a message naming the flag (cli.py writes it as the termination message), and at a
reload it is logged and the certificate in use is kept, until the files change again.

`cryptography` parses the files for the messages; OpenSSL (the standard library's ssl) serves them.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import logging
import os
import ssl
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("pagoda.runtime")

RELOAD_SECONDS = 5.0
CERT_FLAG, KEY_FLAG = "--tls-cert-file", "--tls-key-file"


class TlsError(ValueError):
    """The certificate or key cannot be served; the message names the flag and the file."""


@dataclass(frozen=True)
class Loaded:
    """A certificate and key loaded into a server context."""

    context: ssl.SSLContext
    digest: str  # sha256 of both files' bytes
    serial: int
    not_after: datetime.datetime


def _read(flag: str, path: str) -> bytes:
    try:
        with open(path, "rb") as source:
            return source.read()
    except OSError as exc:
        raise TlsError(f"{flag}: cannot read {path}: {exc.strerror or exc}") from None


def load(cert_file: str, key_file: str) -> Loaded:
    """The pair as a server SSLContext (TLS 1.2 or later); TlsError naming the flag when it cannot be
    served."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert_pem, key_pem = _read(CERT_FLAG, cert_file), _read(KEY_FLAG, key_file)
    try:
        cert = x509.load_pem_x509_certificates(cert_pem)[0]
    except ValueError:
        raise TlsError(f"{CERT_FLAG}: {cert_file} holds no PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:  # cryptography's word for "it needs a password"
        raise TlsError(
            f"{KEY_FLAG}: the private key in {key_file} is encrypted; the runtime takes an unencrypted PEM "
            "key (as cert-manager writes it)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - ValueError (not a key), UnsupportedAlgorithm
        raise TlsError(f"{KEY_FLAG}: {key_file} holds no PEM private key ({type(exc).__name__})") from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
        raise TlsError(
            f"{KEY_FLAG}: the private key in {key_file} does not match the certificate in {cert_file} "
            f"({CERT_FLAG})"
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:  # the files changed since they were read, or OpenSSL refuses
        raise TlsError(
            f"{CERT_FLAG}, {KEY_FLAG}: OpenSSL cannot load {cert_file} and {key_file}: {exc}"
        ) from None
    digest = hashlib.sha256(cert_pem + b"\0" + key_pem).hexdigest()
    return Loaded(context, digest, cert.serial_number, cert.not_valid_after_utc)


def _signature(paths: tuple[str, ...]) -> tuple[Any, ...]:
    """What changes when a file is replaced (the kubelet's symlink swap, or an edit in place)."""
    out: list[Any] = []
    for path in paths:
        try:
            st = os.stat(path)  # follows the kubelet's symlinks to the files themselves
        except OSError:
            out.append(None)
            continue
        out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


class CertificateReloader:
    """The context uvicorn listens with (`context`), handing each new connection the newest certificate."""

    def __init__(self, cert_file: str, key_file: str, interval: float = RELOAD_SECONDS) -> None:
        self.paths = (cert_file, key_file)
        self.interval = interval
        self._seen = _signature(self.paths)
        self.current = load(cert_file, key_file)  # TlsError: refused at start
        self.context = self.current.context
        self.context.sni_callback = self._hand_over
        self.reloads = 0
        _warn_if_expired(self.current)

    def _hand_over(self, conn: Any, server_name: str | None, context: ssl.SSLContext) -> None:
        """OpenSSL's ClientHello callback: the connection continues with the newest context."""
        newest = self.current.context
        if conn.context is not newest:
            conn.context = newest

    def check(self) -> bool:
        """Blocking (a few small reads): reload when the files changed; whether the certificate did."""
        seen = _signature(self.paths)
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            loaded = load(*self.paths)
        except TlsError as exc:
            log.warning("Failed to reload TLS certificate, kept serial=%x error=%s", self.current.serial, exc)
            return False
        if loaded.digest == self.current.digest:
            return False
        old, self.current = self.current, loaded
        self.reloads += 1
        log.info(
            "Reloaded TLS certificate serial=%x previous=%x not_after=%s",
            loaded.serial,
            old.serial,
            loaded.not_after.isoformat(),
        )
        _warn_if_expired(loaded)
        return True

    async def watch(self) -> None:
        """Every `interval` seconds, until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                await asyncio.to_thread(self.check)
            except Exception as exc:  # noqa: BLE001 - a watcher that dies would never reload again
                log.warning("Failed to check TLS certificate files error=%s", exc)


def _warn_if_expired(loaded: Loaded) -> None:
    if loaded.not_after <= datetime.datetime.now(datetime.UTC):
        log.warning(
            "Serving an expired TLS certificate serial=%x not_after=%s; renew it (its Certificate)",
            loaded.serial,
            loaded.not_after.isoformat(),
        )
