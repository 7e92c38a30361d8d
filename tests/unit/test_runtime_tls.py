"""Tier 1: the runtime's TLS (runtime/serving/tls.py): the flags, the refusals naming the flag, the
termination message, and a certificate renewed in place reaching new connections, over real TLS handshakes on
loopback (under uvloop, as the runtime serves), with files swapped the way the kubelet swaps a Secret
volume's."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import ssl
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import uvloop
from cryptography import x509

from e2e.lab._pki import SecretVolume, TlsDir, write_tls_dir
from pagoda.contract import vllmflags
from pagoda.runtime.cli import _parser
from pagoda.runtime.serving import tls
from pagoda.runtime.serving.config import ConfigError, ServeConfig, config_from_args

RUNTIME = str(Path(sys.executable).parent / "pagoda-runtime")


def parse(*argv: str) -> ServeConfig:
    ns: argparse.Namespace = _parser().parse_args(["serve", "--model", "file:///m", *argv])
    return config_from_args(ns, [])


def issue(directory: Path) -> TlsDir:
    """A CA and a serving certificate for localhost/127.0.0.1, as cert-manager's Secret lays them out."""
    return write_tls_dir(directory, "tiny", ["localhost"], ["127.0.0.1"])


def serial(pem_or_der: bytes) -> int:
    if pem_or_der.startswith(b"-----"):
        return x509.load_pem_x509_certificate(pem_or_der).serial_number
    return x509.load_der_x509_certificate(pem_or_der).serial_number


def test_the_flags_come_in_pairs() -> None:
    assert parse().tls is False
    with pytest.raises(ConfigError) as caught:
        parse("--tls-cert-file", "/tls/tls.crt")
    assert (
        str(caught.value)
        == "--tls-key-file: required with --tls-cert-file (TLS takes both files, or neither)"
    )
    with pytest.raises(ConfigError) as caught:
        parse("--tls-key-file", "/tls/tls.key")
    assert (
        str(caught.value)
        == "--tls-cert-file: required with --tls-key-file (TLS takes both files, or neither)"
    )
    with pytest.raises(ConfigError, match="^--tls-cert-file: String should have at least 1 character"):
        parse("--tls-cert-file", "", "--tls-key-file", "/k")
    config = parse("--tls-cert-file", "/tls/tls.crt", "--tls-key-file", "/tls/tls.key")
    assert config.tls and (config.tls_cert_file, config.tls_key_file) == ("/tls/tls.crt", "/tls/tls.key")


def test_unusable_files_are_refused_naming_the_flag(tmp_path: Path) -> None:
    one, other = issue(tmp_path / "one"), issue(tmp_path / "other")
    encrypted = tmp_path / "encrypted.key"
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(one.key.read_bytes(), password=None)
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    cases: list[tuple[Path | str, Path | str, str]] = [
        (tmp_path / "none.crt", one.key, f"--tls-cert-file: cannot read {tmp_path}/none.crt: No such file"),
        (one.cert, tmp_path / "none.key", f"--tls-key-file: cannot read {tmp_path}/none.key: No such file"),
        (one.key, one.key, f"--tls-cert-file: {one.key} holds no PEM certificate"),
        (one.cert, one.cert, f"--tls-key-file: {one.cert} holds no PEM private key"),
        (one.cert, encrypted, f"--tls-key-file: the private key in {encrypted} is encrypted"),
        (
            one.cert,
            other.key,
            f"--tls-key-file: the private key in {other.key} does not match the certificate in {one.cert}",
        ),
    ]
    for cert, key_file, message in cases:
        with pytest.raises(tls.TlsError) as caught:
            tls.load(str(cert), str(key_file))
        assert str(caught.value).startswith(message), (str(caught.value), message)
    assert tls.load(str(one.cert), str(one.key)).serial == serial(one.cert.read_bytes())


def test_the_cli_exits_2_with_a_termination_message_naming_the_secret(tmp_path: Path) -> None:
    """Before the engine is imported: exit 2, no traceback, and the message the operator reports."""
    one, other = issue(tmp_path / "one"), issue(tmp_path / "other")
    message = tmp_path / "termination-log"
    r = subprocess.run(
        [RUNTIME, "serve", "--model", "file:///m", "--tls-cert-file", str(one.cert), "--tls-key-file",
         str(other.key)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PAGODA_TERMINATION_MESSAGE_PATH": str(message)},
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert f"pagoda-runtime serve: error: --tls-key-file: the private key in {other.key} does not match" in (
        r.stderr
    )
    text = message.read_text()
    assert text.startswith(f"TlsCertificateInvalid: --tls-key-file: the private key in {other.key} ")
    assert "spec.runtime.tls.secretName" in text


def test_vllms_own_tls_flags_stay_refused_pointing_at_the_runtimes() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ssl-certfile")
    parser.add_argument("--ssl-keyfile")
    with pytest.raises(ValueError) as caught:
        vllmflags.parse_refusing(parser, ["--ssl-certfile=/tls/tls.crt"])
    message = str(caught.value)
    assert message.startswith("--ssl-certfile is not supported by pagoda-runtime: ")
    assert "--tls-cert-file and --tls-key-file" in message and "spec.runtime.tls.secretName" in message


def test_the_profile_refuses_the_tls_flags(tmp_path: Path) -> None:
    from pagoda.runtime.profiling.config import profile_config

    ns = _parser().parse_args(
        ["profile", "--model", "file:///m", "--tls-cert-file", "/c", "--tls-key-file", "/k",
         "--slo-ttft-ms", "100", "--slo-itl-ms", "10", "--result", str(tmp_path / "result")]
    )  # fmt: skip
    with pytest.raises(ConfigError, match="--tls-cert-file, --tls-key-file: the profile's server listens"):
        profile_config(ns)


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _peer_serial(port: int, ca: Path) -> tuple[int, Connection]:
    """A new TLS connection to 127.0.0.1 (no SNI: an IP address, as kubelet probes and pod-IP calls),
    verified against `ca`: the serial of the certificate the server presented."""
    client = ssl.create_default_context(cafile=str(ca))
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    return serial(der), (reader, writer)


def _run(test: Callable[[int], object], reloader: tls.CertificateReloader) -> None:
    async def main() -> None:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(await reader.readline())
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=reloader.context)
        port = server.sockets[0].getsockname()[1]
        try:
            await test(port)  # type: ignore[misc]
        finally:
            server.close()

    uvloop.run(main())


def test_a_renewed_certificate_reaches_new_connections_without_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, renewed, foreign = issue(tmp_path / "first"), issue(tmp_path / "renewed"), issue(tmp_path / "x")
    volume = SecretVolume(tmp_path / "secret")
    volume.write(first)
    reloader = tls.CertificateReloader(volume.cert, volume.key)
    first_serial, renewed_serial = serial(first.cert.read_bytes()), serial(renewed.cert.read_bytes())
    caplog.set_level(logging.INFO, logger="pagoda.runtime")

    async def scenario(port: int) -> None:
        seen, before = await _peer_serial(port, first.ca_cert)
        assert seen == first_serial
        assert reloader.check() is False  # nothing changed
        volume.write(renewed)  # cert-manager renewed it (a new CA too: the clients below trust the new one)
        assert reloader.check() is True
        seen, after = await _peer_serial(port, renewed.ca_cert)
        assert seen == renewed_serial
        # The connection opened before the renewal still works, with the certificate it started with.
        assert serial(before[1].get_extra_info("ssl_object").getpeercert(binary_form=True)) == first_serial
        before[1].write(b"still here\n")
        assert await before[0].readline() == b"still here\n"
        # A pair that does not match (a key from another certificate): kept the renewed one, said why.
        broken = TlsDir(tmp_path / "broken", renewed.ca_cert, foreign.cert, renewed.key)
        broken.directory.mkdir()
        for name, path in (("tls.crt", foreign.cert), ("tls.key", renewed.key), ("ca.crt", renewed.ca_cert)):
            (broken.directory / name).write_bytes(path.read_bytes())
        volume.write(broken)
        assert reloader.check() is False
        seen, _ = await _peer_serial(port, renewed.ca_cert)
        assert seen == renewed_serial
        # The same files written again (a resync of the Secret): no reload.
        volume.write(renewed)
        assert reloader.check() is False
        assert reloader.reloads == 1
        for _, writer in (before, after):
            writer.close()

    _run(scenario, reloader)
    text = caplog.text
    assert f"Reloaded TLS certificate serial={renewed_serial:x} previous={first_serial:x}" in text
    assert f"Failed to reload TLS certificate, kept serial={renewed_serial:x}" in text
    assert "does not match the certificate" in text


def test_the_watcher_reloads_on_its_own(tmp_path: Path) -> None:
    """watch(), as the runtime runs it: the renewed certificate shows up within a few intervals."""
    first, renewed = issue(tmp_path / "first"), issue(tmp_path / "renewed")
    volume = SecretVolume(tmp_path / "secret")
    volume.write(first)
    reloader = tls.CertificateReloader(volume.cert, volume.key, interval=0.05)

    async def scenario(port: int) -> None:
        watcher = asyncio.create_task(reloader.watch())
        try:
            volume.write(renewed)
            for _ in range(200):
                if reloader.reloads:
                    break
                await asyncio.sleep(0.05)
            seen, (_, writer) = await _peer_serial(port, renewed.ca_cert)
            writer.close()
            assert seen == serial(renewed.cert.read_bytes())
        finally:
            watcher.cancel()

    _run(scenario, reloader)
