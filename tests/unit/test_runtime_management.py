"""Only the operator may call a runtime's management API (contract/management.py): Ed25519 signatures over the
call, each for one pod (its UID and its address), checked by the runtime's gate (runtime/serving/server.py) in
front of the real adapters app (a runtime without LoRA here: the gate is what is tested; tier 3 loads adapters
through it)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from pagoda import contract
from pagoda.contract import management
from pagoda.runtime.cli import _parser
from pagoda.runtime.serving.adapters import AdapterManager, management_app
from pagoda.runtime.serving.config import ConfigError, ServeConfig, config_from_args
from pagoda.runtime.serving.server import PagodaApp, RuntimeState

POD = "http://10.244.0.7:8000"
HOST = "10.244.0.7:8000"
UID = "0d9e5c4a-7b1f-4c39-9a51-6a3f2d8e1b20"  # the pod's metadata.uid
ME = management.PodIdentity(UID, frozenset({HOST}))  # pod A, as the downward API tells its runtime
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
    verifier = management.Verifier(key_file, ME, clock)
    body = b'{"source": "s3://adapters/sql"}'
    header = management.Signer(private_key, clock).authorization("PUT", HOST, f"{PATH}/sql", body, pod=UID)
    verifier.check("PUT", HOST, f"{PATH}/sql", body, header)
    # The same call again in the same second is another signature (its nonce); the same header is a replay.
    again = management.Signer(private_key, clock).authorization("PUT", HOST, f"{PATH}/sql", body, pod=UID)
    verifier.check("PUT", HOST, f"{PATH}/sql", body, again)
    with pytest.raises(management.Unauthorized, match="replay"):
        verifier.check("PUT", HOST, f"{PATH}/sql", body, header)
    changed = [
        ("DELETE", HOST, f"{PATH}/sql", body),  # another method
        ("PUT", "10.244.0.8:8000", f"{PATH}/sql", body),  # another address (of a pod that has both)
        ("PUT", HOST, f"{PATH}/chat", body),  # another adapter
        ("PUT", HOST, f"{PATH}/sql", b'{"source": "s3://evil/x"}'),  # another body
    ]
    two_addresses = management.PodIdentity(UID, frozenset({HOST, "10.244.0.8:8000"}))
    for method, host, path, other in changed:
        with pytest.raises(management.Unauthorized, match="does not verify"):
            management.Verifier(key_file, two_addresses, clock).check(method, host, path, other, header)
    # The pod named in the header is signed too: changing it to the receiving pod's does not help.
    other_pod = management.PodIdentity("another-uid", frozenset({HOST}))
    with pytest.raises(management.Unauthorized, match="does not verify"):
        management.Verifier(key_file, other_pod, clock).check(
            "PUT", HOST, f"{PATH}/sql", body, header.replace(f"pod={UID}", "pod=another-uid")
        )


def test_a_stale_or_future_signature_is_refused(private_key: bytes, key_file: Path) -> None:
    clock = Clock()
    header = management.Signer(private_key, clock).authorization("GET", HOST, PATH, b"", pod=UID)
    for skew in (management.MAX_SKEW + 1, -management.MAX_SKEW - 1):
        at = Clock(clock.now + skew)
        with pytest.raises(management.Unauthorized, match="from this pod's clock"):
            management.Verifier(key_file, ME, at).check("GET", HOST, PATH, b"", header)
    management.Verifier(key_file, ME, Clock(clock.now + management.MAX_SKEW - 1)).check(
        "GET", HOST, PATH, b"", header
    )


def test_another_key_and_malformed_headers_are_refused_with_the_reason(key_file: Path) -> None:
    verifier = management.Verifier(key_file, ME)
    stranger = management.Signer(management.new_private_key()).authorization("GET", HOST, PATH, b"", pod=UID)
    cases = {
        stranger: "does not verify",
        None: "needs an Pagoda-Ed25519 Authorization header",
        "Bearer s3cret": "accepts only Pagoda-Ed25519",
        "Pagoda-Ed25519 v=2,pod=a,t=soon,n=x,sig=AAAA": "malformed",
        "Pagoda-Ed25519 v=2,sig=AAAA": "malformed",
        f"Pagoda-Ed25519 v=2,pod={'u' * 200},t=1,n=x,sig=AAAA": "malformed",
        # Version 1 (an operator older than the runtime: no pod in what it signs), and one from the future.
        "Pagoda-Ed25519 t=1800000000,n=ab,sig=AAAA": "version '1' signature: .* upgrade the operator and",
        "Pagoda-Ed25519 v=3,pod=a,t=1,n=x,sig=AAAA": "version '3' signature",
    }
    for header, reason in cases.items():
        with pytest.raises(management.Unauthorized, match=reason):
            verifier.check("GET", HOST, PATH, b"", header)


def test_the_key_file_is_read_at_each_call_so_a_new_key_takes_over(key_file: Path) -> None:
    verifier = management.Verifier(key_file, ME)
    old, new = (
        management.Signer(management.new_private_key()),
        management.Signer(management.new_private_key()),
    )
    key_file.write_text(old.public_pem)
    verifier.check("GET", HOST, PATH, b"", old.authorization("GET", HOST, PATH, b"", pod=UID))
    key_file.write_text(new.public_pem)  # the operator's key changed; its ConfigMap volume follows
    verifier.check("GET", HOST, PATH, b"", new.authorization("GET", HOST, PATH, b"", pod=UID))
    with pytest.raises(management.Unauthorized, match="does not verify"):
        verifier.check("GET", HOST, PATH, b"", old.authorization("GET", HOST, PATH, b"", pod=UID))


def test_during_a_rotation_either_published_key_verifies_and_a_dropped_one_does_not(key_file: Path) -> None:
    """The operator's key rotation (kube/management.py): the file holds the old and the new public key,
    one PEM block after the other; then only the new one."""
    verifier = management.Verifier(key_file, ME)
    old, new = (management.Signer(management.new_private_key()) for _ in range(2))
    key_file.write_text(old.public_pem + new.public_pem)
    for signer in (old, new):
        verifier.check("GET", HOST, PATH, b"", signer.authorization("GET", HOST, PATH, b"", pod=UID))
    assert management.read_public_key(key_file).public_bytes_raw() == (
        management.read_public_keys(key_file)[0].public_bytes_raw()
    )  # the first block: the key the operator signs with, all a runtime older than this reads
    key_file.write_text(new.public_pem)  # the rotation's end: the old public key dropped
    verifier.check("GET", HOST, PATH, b"", new.authorization("GET", HOST, PATH, b"", pod=UID))
    with pytest.raises(management.Unauthorized, match="does not verify"):
        verifier.check("GET", HOST, PATH, b"", old.authorization("GET", HOST, PATH, b"", pod=UID))


def test_a_key_file_with_no_key_too_many_or_a_foreign_one_is_refused(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    one = management.Signer(management.new_private_key()).public_pem
    ec_key = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    cases = {
        "": "no PEM public key",
        one * (management.MAX_KEYS + 1): f"at most {management.MAX_KEYS}",
        one + ec_key: "not an Ed25519 public key",
    }
    path = tmp_path / "keys.pem"
    for text, reason in cases.items():
        path.write_text(text)
        with pytest.raises(management.Unauthorized, match=reason):
            management.read_public_keys(path)


POD_B = management.PodIdentity("5b7f1e0c-2d44-4e8a-b9c3-0f6a7e2d9c11", frozenset({"10.244.0.8:8000"}))


def test_a_call_signed_for_one_pod_is_refused_by_every_other(
    private_key: bytes, key_file: Path, signer: management.Signer
) -> None:
    """One key signs for every pod: a call captured on its way to pod A and replayed to pod B within the
    window is refused by B (its UID is not the one signed), however it is addressed; so is one re-signed
    for B's UID but sent with A's Host, and one replayed to a new pod that got A's IP."""
    body = b'{"source": "s3://adapters/sql"}'
    captured = signer.authorization("PUT", HOST, f"{PATH}/sql", body, pod=UID)
    pod_b = management.Verifier(key_file, POD_B)
    for host in (HOST, "10.244.0.8:8000"):  # as captured, and re-addressed to B
        with pytest.raises(
            management.Unauthorized, match=f"signed for pod '{UID}', and this is pod '{POD_B.uid}'"
        ):
            pod_b.check("PUT", host, f"{PATH}/sql", body, captured)
    for_b_at_a = signer.authorization("PUT", HOST, f"{PATH}/sql", body, pod=POD_B.uid)
    with pytest.raises(
        management.Unauthorized,
        match=r"the Host '10.244.0.7:8000' is not this pod's address \(10.244.0.8:8000\)",
    ):
        pod_b.check("PUT", HOST, f"{PATH}/sql", body, for_b_at_a)
    new_pod_at_as_ip = management.Verifier(key_file, management.PodIdentity("a-new-pod", frozenset({HOST})))
    with pytest.raises(management.Unauthorized, match="signed for pod"):
        new_pod_at_as_ip.check("PUT", HOST, f"{PATH}/sql", body, captured)
    management.Verifier(key_file, ME).check("PUT", HOST, f"{PATH}/sql", body, captured)  # A takes it


def test_only_the_pods_own_address_is_a_host_it_accepts(key_file: Path, signer: management.Signer) -> None:
    verifier = management.Verifier(key_file, ME)
    for wrong in ("10.244.0.8:8000", "10.244.0.7:8001", "10.244.0.7", "llama.llm.svc:8000", ""):
        header = signer.authorization("GET", wrong, PATH, b"", pod=UID)
        with pytest.raises(management.Unauthorized, match="is not this pod's address"):
            verifier.check("GET", wrong, PATH, b"", header)
    verifier.check("GET", HOST, PATH, b"", signer.authorization("GET", HOST, PATH, b"", pod=UID))
    six = management.PodIdentity.from_env({"POD_IP": "FD00::7", "POD_UID": UID}, "::", 8000)
    assert six.hosts == {"[fd00::7]:8000"}
    header = signer.authorization("GET", "[FD00::7]:8000", PATH, b"", pod=UID)
    management.Verifier(key_file, six).check("GET", "[FD00::7]:8000", PATH, b"", header)


def test_the_runtime_learns_which_pod_it_is_from_the_downward_api_or_its_host(
    key_file: Path, signer: management.Signer
) -> None:
    env = {contract.POD_UID_ENV: UID, contract.POD_IP_ENV: "10.244.0.7"}
    assert management.PodIdentity.from_env(env, "0.0.0.0", 8000) == ME
    # Outside Kubernetes: the address it serves on, and no UID (calls are signed for pod "").
    by_hand = management.PodIdentity.from_env({}, "127.0.0.1", 8123)
    assert by_hand == management.PodIdentity("", frozenset({"127.0.0.1:8123", "localhost:8123"}))
    assert management.PodIdentity.from_env({}, "10.0.0.5", 8000).hosts == {"10.0.0.5:8000"}
    header = signer.authorization("GET", "localhost:8123", PATH, b"", pod="")
    management.Verifier(key_file, by_hand).check("GET", "localhost:8123", PATH, b"", header)
    # On every address without POD_IP it cannot tell its own: every call is refused, saying why.
    lost = management.PodIdentity.from_env({}, "0.0.0.0", 8000)
    assert lost.hosts == frozenset() and "every management call is refused" in lost.describe()
    header = signer.authorization("GET", HOST, PATH, b"", pod="")
    with pytest.raises(management.Unauthorized, match="does not know its own address, .*: set POD_IP"):
        management.Verifier(key_file, lost).check("GET", HOST, PATH, b"", header)


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
    state = RuntimeState("tiny", management_key=str(key_file) if key_file else None, identity=ME)
    state.management = management_app(AdapterManager("tiny", "/nonexistent", 1.0, enabled=False))
    return PagodaApp(state)


def _send(
    app: PagodaApp,
    method: str,
    path: str,
    body: Any = None,
    auth: str | None = None,
    host: str | None = None,
) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=POD) as client:
            headers = {"authorization": auth} if auth else {}
            if host is not None:
                headers["host"] = host
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
    listed = _send(app, "GET", PATH, auth=signer.authorization("GET", HOST, PATH, b"", pod=UID))
    assert listed.status_code == 200 and listed.json()["enabled"] is False
    # A signed PUT reaches the adapters app with its body: it answers as a runtime without LoRA does.
    raw = json.dumps(put).encode()
    loaded = _send(
        app, "PUT", f"{PATH}/sql", put, auth=signer.authorization("PUT", HOST, f"{PATH}/sql", raw, pod=UID)
    )
    assert loaded.status_code != 401 and "LoRA" in loaded.json()["error"]["message"], loaded.text


def test_the_gate_refuses_a_call_signed_for_another_pod_naming_the_mismatch(
    signer: management.Signer, key_file: Path
) -> None:
    app = _app(key_file)
    for_b = signer.authorization("GET", HOST, PATH, b"", pod=POD_B.uid)
    refused = _send(app, "GET", PATH, auth=for_b)
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == management.SCHEME
    assert f"signed for pod '{POD_B.uid}', and this is pod '{UID}'" in refused.json()["error"]["message"]
    elsewhere = signer.authorization("GET", "10.244.0.8:8000", PATH, b"", pod=UID)
    refused = _send(app, "GET", PATH, auth=elsewhere, host="10.244.0.8:8000")
    assert refused.status_code == 401 and "is not this pod's address" in refused.json()["error"]["message"]
    assert (
        _send(app, "GET", PATH, auth=signer.authorization("GET", HOST, PATH, b"", pod=UID)).status_code == 200
    )


def test_without_the_operators_key_the_management_api_is_off_but_not_the_rest(
    signer: management.Signer,
) -> None:
    app = _app(None)
    refused = _send(app, "GET", PATH, auth=signer.authorization("GET", HOST, PATH, b"", pod=UID))
    assert refused.status_code == 403
    assert "--management-public-key-file" in refused.json()["error"]["message"]
    assert _send(app, "GET", "/livez").status_code == 200


def test_a_management_body_over_its_limit_gets_413(signer: management.Signer, key_file: Path) -> None:
    big = {"source": "x" * management.MAX_BODY}
    assert _send(_app(key_file), "PUT", f"{PATH}/sql", big).status_code == 413
