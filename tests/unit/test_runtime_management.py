"""Only the operator may call a runtime's management API (runtime/management.py): Ed25519 signatures over the
call, checked by the runtime's gate (runtime/server.py) in front of the real adapters app (a runtime
without LoRA here: the gate is what is tested; tier 3 loads adapters through it)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from pagoda.runtime import contract, management
from pagoda.runtime.adapters import AdapterManager, management_app
from pagoda.runtime.cli import _parser
from pagoda.runtime.config import ConfigError, ServeConfig, config_from_args
from pagoda.runtime.server import PagodaApp, RuntimeState

POD = "http://10.244.0.7:8000"
HOST = "10.244.0.7:8000"
PATH = contract.ADAPTERS_PATH


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def private_key() -> bytes:
    return management.new_private_key()


@pytest.fixture
def signer(private_key: bytes) -> management.Signer:
    return management.Signer(private_key)


@pytest.fixture
def key_file(tmp_path: Path, signer: management.Signer) -> Path:
    path = tmp_path / contract.MANAGEMENT_KEY_FILE
    path.write_text(signer.public_pem)
    return path


def test_a_signed_call_verifies_once_and_only_as_signed(private_key: bytes, key_file: Path) -> None:
    clock = Clock()
    verifier = management.Verifier(key_file, clock)
    body = b'{"source": "s3://adapters/sql"}'
    header = management.Signer(private_key, clock).authorization("PUT", HOST, f"{PATH}/sql", body)
    verifier.check("PUT", HOST, f"{PATH}/sql", body, header)
    # The same call again in the same second is another signature (its nonce); the same header is a replay.
    again = management.Signer(private_key, clock).authorization("PUT", HOST, f"{PATH}/sql", body)
    verifier.check("PUT", HOST, f"{PATH}/sql", body, again)
    with pytest.raises(management.Unauthorized, match="replay"):
        verifier.check("PUT", HOST, f"{PATH}/sql", body, header)
    changed = [
        ("DELETE", HOST, f"{PATH}/sql", body),  # another method
        ("PUT", "10.244.0.8:8000", f"{PATH}/sql", body),  # another pod
        ("PUT", HOST, f"{PATH}/chat", body),  # another adapter
        ("PUT", HOST, f"{PATH}/sql", b'{"source": "s3://evil/x"}'),  # another body
    ]
    for method, host, path, other in changed:
        with pytest.raises(management.Unauthorized, match="does not verify"):
            management.Verifier(key_file, clock).check(method, host, path, other, header)


def test_a_stale_or_future_signature_is_refused(private_key: bytes, key_file: Path) -> None:
    clock = Clock()
    header = management.Signer(private_key, clock).authorization("GET", HOST, PATH, b"")
    for skew in (management.MAX_SKEW + 1, -management.MAX_SKEW - 1):
        at = Clock(clock.now + skew)
        with pytest.raises(management.Unauthorized, match="from this pod's clock"):
            management.Verifier(key_file, at).check("GET", HOST, PATH, b"", header)
    management.Verifier(key_file, Clock(clock.now + management.MAX_SKEW - 1)).check(
        "GET", HOST, PATH, b"", header
    )


def test_another_key_and_malformed_headers_are_refused_with_the_reason(key_file: Path) -> None:
    verifier = management.Verifier(key_file)
    stranger = management.Signer(management.new_private_key()).authorization("GET", HOST, PATH, b"")
    cases = {
        stranger: "does not verify",
        None: "needs an Pagoda-Ed25519 Authorization header",
        "Bearer s3cret": "accepts only Pagoda-Ed25519",
        "Pagoda-Ed25519 t=soon,sig=AAAA": "malformed",
        "Pagoda-Ed25519 sig=AAAA": "malformed",
    }
    for header, reason in cases.items():
        with pytest.raises(management.Unauthorized, match=reason):
            verifier.check("GET", HOST, PATH, b"", header)


def test_the_key_file_is_read_at_each_call_so_a_new_key_takes_over(key_file: Path) -> None:
    verifier = management.Verifier(key_file)
    old, new = (
        management.Signer(management.new_private_key()),
        management.Signer(management.new_private_key()),
    )
    key_file.write_text(old.public_pem)
    verifier.check("GET", HOST, PATH, b"", old.authorization("GET", HOST, PATH, b""))
    key_file.write_text(new.public_pem)  # the operator's key changed; its ConfigMap volume follows
    verifier.check("GET", HOST, PATH, b"", new.authorization("GET", HOST, PATH, b""))
    with pytest.raises(management.Unauthorized, match="does not verify"):
        verifier.check("GET", HOST, PATH, b"", old.authorization("GET", HOST, PATH, b""))


def test_the_runtime_refuses_to_start_with_a_key_it_cannot_read(tmp_path: Path, key_file: Path) -> None:
    assert ServeConfig(model="file:///m", management_public_key_file=str(key_file))
    (tmp_path / "rsa.pem").write_text("-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----\n")
    for bad in (tmp_path / "missing.pem", tmp_path / "rsa.pem"):
        with pytest.raises(ValueError, match="cannot read the operator's public key"):
            ServeConfig(model="file:///m", management_public_key_file=str(bad))
    ns = _parser().parse_args(
        ["serve", "--model", "file:///m", "--management-public-key-file", str(tmp_path / "missing.pem")]
    )
    with pytest.raises(ConfigError, match="--management-public-key-file: .*missing.pem"):
        config_from_args(ns, [])


# The gate, in front of the real adapters app.


def _app(key_file: Path | None) -> PagodaApp:
    state = RuntimeState("tiny", management_key=str(key_file) if key_file else None)
    state.management = management_app(AdapterManager("tiny", "/nonexistent", 1.0, enabled=False))
    return PagodaApp(state)


def _send(
    app: PagodaApp, method: str, path: str, body: Any = None, auth: str | None = None
) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=POD) as client:
            headers = {"authorization": auth} if auth else {}
            content = json.dumps(body).encode() if body is not None else None
            return await client.request(method, path, content=content, headers=headers)

    return asyncio.run(go())


def test_the_gate_lets_only_signed_calls_reach_the_adapters_api(
    signer: management.Signer, key_file: Path
) -> None:
    app = _app(key_file)
    unsigned = _send(app, "GET", PATH)
    assert unsigned.status_code == 401, unsigned.text
    assert unsigned.headers["www-authenticate"] == management.SCHEME
    assert unsigned.json()["error"]["type"] == "Unauthorized"
    put = {"source": "file:///models/adapters/sql"}
    assert _send(app, "PUT", f"{PATH}/sql", put).status_code == 401
    assert _send(app, "DELETE", f"{PATH}/sql").status_code == 401
    listed = _send(app, "GET", PATH, auth=signer.authorization("GET", HOST, PATH, b""))
    assert listed.status_code == 200 and listed.json()["enabled"] is False
    # A signed PUT reaches the adapters app with its body: it answers as a runtime without LoRA does.
    raw = json.dumps(put).encode()
    loaded = _send(app, "PUT", f"{PATH}/sql", put, auth=signer.authorization("PUT", HOST, f"{PATH}/sql", raw))
    assert loaded.status_code != 401 and "LoRA" in loaded.json()["error"]["message"], loaded.text


def test_without_the_operators_key_the_management_api_is_off_but_not_the_rest(
    signer: management.Signer,
) -> None:
    app = _app(None)
    refused = _send(app, "GET", PATH, auth=signer.authorization("GET", HOST, PATH, b""))
    assert refused.status_code == 403
    assert "--management-public-key-file" in refused.json()["error"]["message"]
    assert _send(app, "GET", "/livez").status_code == 200


def test_a_management_body_over_its_limit_gets_413(signer: management.Signer, key_file: Path) -> None:
    big = {"source": "x" * management.MAX_BODY}
    assert _send(_app(key_file), "PUT", f"{PATH}/sql", big).status_code == 413
