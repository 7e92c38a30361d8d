"""The operator's management key rotation (operator/kube/management.py KeyRing): one annotation on the
key Secret, then the new public key published beside the old before anything is signed with it, so a pod
whose volume follows late never refuses a call; a new leader carries a rotation on from the Secret. The
signatures are real and checked by the runtime's Verifier, reading a key file as a pod's volume has it."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import pytest

from pagoda import contract
from pagoda.contract import management
from pagoda.operator.kube.client import KubeError
from pagoda.operator.kube.management import (
    KEY_FIELD,
    NEXT_KEY_FIELD,
    PUBLISHED_ANNOTATION,
    ROTATE_ANNOTATION,
    KeyRing,
)

SECRET = ("pagoda-system", "pagoda-management-key")
HOST, UID, PATH = "10.244.0.7:8000", "uid-a", contract.ADAPTERS_PATH
ME = management.PodIdentity(UID, frozenset({HOST}))
OVERLAP, LAG = 180.0, 150.0  # the pods' volume follows the published keys LAG seconds late, under OVERLAP
Obj = dict[str, Any]


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Secrets:
    """The key Secret as the API server keeps it: a resourceVersion, 409 on a stale PUT or a second create,
    403 on writes when `read_only` (a chart without `update` on it)."""

    def __init__(self) -> None:
        self.secret: Obj | None = None
        self.version, self.read_only = 0, False

    def get(self, api_version: str, plural: str, namespace: str, name: str) -> Obj | None:
        assert (api_version, plural, (namespace, name)) == ("v1", "secrets", SECRET)
        return copy.deepcopy(self.secret)

    def create(self, manifest: Obj, plural: str) -> Obj:
        if self.secret is not None:
            raise KubeError(409, "AlreadyExists", "secrets already exists")
        return self._store(manifest)

    def replace(self, manifest: Obj, plural: str) -> Obj:
        if self.read_only:
            raise KubeError(403, "Forbidden", 'cannot update resource "secrets"')
        if self.secret is None or manifest["metadata"].get("resourceVersion") != str(self.version):
            raise KubeError(409, "Conflict", "the object has been modified")
        return self._store(manifest)

    def _store(self, manifest: Obj) -> Obj:
        self.version += 1
        self.secret = copy.deepcopy(manifest)
        self.secret["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.secret)

    def annotate(self, key: str, value: str) -> None:
        assert self.secret is not None
        self.secret["metadata"].setdefault("annotations", {})[key] = value
        self.version += 1
        self.secret["metadata"]["resourceVersion"] = str(self.version)

    def key(self, field: str = KEY_FIELD) -> str | None:
        """The public half of the stored private key `field`."""
        assert self.secret is not None
        value = self.secret["data"].get(field)
        return management.Signer(base64.b64decode(value)).public_pem if value else None


class Pod:
    """A pod's runtime whose key file follows the operator's published keys LAG seconds late."""

    def __init__(self, key_file: Path, ring: KeyRing, clock: Clock) -> None:
        self.key_file, self.ring, self.clock = key_file, ring, clock
        self.published = [(clock.now, ring.public_pem)]
        key_file.write_text(ring.public_pem)
        self.verifier = management.Verifier(key_file, ME, clock=clock)

    def tick(self) -> None:
        """The operator's pass (which publishes) and then its call to this pod, as the volume has it now."""
        self.ring.refresh()
        self.published.append((self.clock.now, self.ring.public_pem))
        seen = [pem for at, pem in self.published if at <= self.clock.now - LAG]
        if seen:
            self.key_file.write_text(seen[-1])
        self.verifier.check("GET", HOST, PATH, b"", self.ring.authorization("GET", HOST, PATH, b"", pod=UID))


def ring_of(secrets: Secrets, clock: Clock) -> KeyRing:
    return KeyRing(secrets, SECRET, overlap=OVERLAP, poll=10.0, clock=clock)  # type: ignore[arg-type]


def run(pod: Pod, clock: Clock, seconds: float) -> None:
    for _ in range(int(seconds // 10)):
        clock.now += 10
        pod.tick()  # never Unauthorized


def test_one_annotation_rotates_the_key_without_a_refused_call(tmp_path: Path) -> None:
    clock, secrets = Clock(), Secrets()
    ring = ring_of(secrets, clock)
    old = secrets.key()
    assert ring.public_pem == old and secrets.key(NEXT_KEY_FIELD) is None and secrets.secret is not None
    old_signer = management.Signer(base64.b64decode(secrets.secret["data"][KEY_FIELD]), clock)
    pod = Pod(tmp_path / "public-key.pem", ring, clock)
    run(pod, clock, 60)

    secrets.annotate(ROTATE_ANNOTATION, "now")
    started = clock.now
    run(pod, clock, 10)
    new = secrets.key(NEXT_KEY_FIELD)
    assert new is not None and secrets.key() == old
    assert ring.public_pem == old + new  # both published, the one signing first
    assert secrets.secret is not None and ROTATE_ANNOTATION not in secrets.secret["metadata"]["annotations"]

    run(pod, clock, OVERLAP - 20)  # still within the overlap: still signing with the old key
    assert secrets.key() == old and ring.public_pem == old + new
    run(pod, clock, 600)
    assert secrets.key() == new and secrets.key(NEXT_KEY_FIELD) is None and ring.public_pem == new
    switched = next(at for at, pem in pod.published if pem == new)
    assert switched >= started + OVERLAP
    assert (
        secrets.secret is not None and PUBLISHED_ANNOTATION not in secrets.secret["metadata"]["annotations"]
    )

    # Once the pods' volume has only the new key, a call signed with the old one is refused.
    assert (tmp_path / "public-key.pem").read_text() == new
    with pytest.raises(management.Unauthorized, match="does not verify"):
        pod.verifier.check("GET", HOST, PATH, b"", old_signer.authorization("GET", HOST, PATH, b"", pod=UID))


def test_a_new_leader_carries_the_rotation_on_and_a_deleted_secret_is_a_rotation(tmp_path: Path) -> None:
    clock, secrets = Clock(), Secrets()
    ring = ring_of(secrets, clock)
    old = secrets.key()
    secrets.annotate(ROTATE_ANNOTATION, "now")
    clock.now += 10
    ring.refresh()
    new = secrets.key(NEXT_KEY_FIELD)
    assert new is not None

    successor = ring_of(secrets, clock)  # the leader restarted mid-rotation: it reads where it stood
    assert successor.public_pem == old + new
    pod = Pod(tmp_path / "public-key.pem", successor, clock)
    run(pod, clock, OVERLAP + 20)
    assert successor.public_pem == new == secrets.key()

    secrets.secret = None  # `kubectl delete secret`: the leader stores the key it signs with, and a new one
    run(pod, clock, 10)
    assert secrets.key() == new and (newer := secrets.key(NEXT_KEY_FIELD)) is not None
    assert successor.public_pem == new + newer
    run(pod, clock, OVERLAP + 20)
    assert successor.public_pem == newer == secrets.key()


def test_without_update_on_the_secret_the_old_key_goes_on_signing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock, secrets = Clock(), Secrets()
    ring = ring_of(secrets, clock)
    old = secrets.key()
    pod = Pod(tmp_path / "public-key.pem", ring, clock)
    secrets.read_only = True
    secrets.annotate(ROTATE_ANNOTATION, "now")
    run(pod, clock, 60)
    assert ring.public_pem == old and secrets.key(NEXT_KEY_FIELD) is None
    assert "Management key rotation stalled secret=pagoda-system/pagoda-management-key" in caplog.text
    assert "403 Forbidden" in caplog.text
