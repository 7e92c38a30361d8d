"""Tier 3: the real runtime serving HTTPS (--tls-cert-file, --tls-key-file) on the tiny model: plain HTTP is
refused, a chat completion over HTTPS works through the `openai` client, and when the certificate files are
swapped the way the kubelet updates a cert-manager Secret's volume, new connections get the new certificate
from the same process, with no restart."""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from cryptography import x509
from rt_harness import ENGINE_FLAGS, RuntimeProcess, wait_until

from e2e.lab._pki import SecretVolume, TlsDir, write_tls_dir

pytestmark = pytest.mark.runtime


@dataclass
class TlsRuntime(RuntimeProcess):
    """The runtime on https://127.0.0.1, its probes verified against `trust`."""

    trust: ssl.SSLContext | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=10, verify=self.trust or True, **kwargs)


def peer_serial(port: int, trust: ssl.SSLContext) -> int:
    """The serial of the certificate a new connection to the runtime is shown (verified against `trust`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with trust.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def serial_of(tls: TlsDir) -> int:
    return x509.load_pem_x509_certificate(tls.cert.read_bytes()).serial_number


def test_https_renewal(tiny_model: Path, tmp_path: Path) -> None:
    first = write_tls_dir(tmp_path / "first", "tiny", ["localhost"], ["127.0.0.1"])
    # Another CA (write_tls_dir makes one per call) with another name: two CAs of one name in a trust store
    # would be one to OpenSSL, which then checks the renewed certificate against the wrong key.
    renewed = write_tls_dir(tmp_path / "renewed", "tiny-renewed", ["localhost"], ["127.0.0.1"])
    trust = ssl.create_default_context(cafile=str(first.ca_cert))
    trust.load_verify_locations(cafile=str(renewed.ca_cert))  # each has its own CA: trust both
    volume = SecretVolume(tmp_path / "secret")
    volume.write(first)
    tls_flags = [
        "--tls-cert-file",
        volume.cert,
        "--tls-key-file",
        volume.key,
    ]
    runtime = TlsRuntime(
        model=f"file://{tiny_model}",
        workdir=tmp_path / "s",  # short: vLLM's IPC socket path (107 bytes at most) lives under it
        flags=[*ENGINE_FLAGS, *tls_flags],
        trust=trust,
    )
    runtime.start()
    try:
        runtime.wait_ready()  # its probes over HTTPS, verified
        assert runtime.proc is not None
        pid = runtime.proc.pid

        # Plain HTTP on the same port gets no HTTP answer: the TLS handshake fails and the connection closes.
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{runtime.port}/readyz", timeout=10)
        # An untrusting client is refused too (the certificate is checked, not just present).
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{runtime.url}/readyz", timeout=10, verify=ssl.create_default_context())

        with httpx.Client(verify=trust, timeout=60) as http:
            chat = openai.OpenAI(
                base_url=runtime.url + "/v1", api_key="unused", http_client=http, max_retries=0
            )
            reply = chat.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "Say hello."}],
                max_tokens=8,
                temperature=0,
            )
            assert reply.choices[0].message.role == "assistant"
            assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 8
        assert peer_serial(runtime.port, trust) == serial_of(first)

        # cert-manager renewed it: the kubelet swaps the files; within the runtime's 5 s look, new
        # connections see the new certificate, from the same process.
        volume.write(renewed)
        wait_until(
            lambda: peer_serial(runtime.port, trust) == serial_of(renewed),
            "a new connection shown the renewed certificate",
            timeout=30,
            interval=0.5,
        )
        runtime.check_alive()
        assert runtime.proc.pid == pid and runtime.proc.poll() is None
        assert f"Reloaded TLS certificate serial={serial_of(renewed):x}" in runtime.log()
        with httpx.Client(verify=trust, timeout=60) as http:
            chat = openai.OpenAI(
                base_url=runtime.url + "/v1", api_key="unused", http_client=http, max_retries=0
            )
            assert [m.id for m in chat.models.list().data] == ["tiny"]
        assert runtime.get("/readyz").status_code == 200
    finally:
        runtime.terminate()
