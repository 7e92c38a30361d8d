"""The operator's management key on the real control plane: stored in its Secret on first start, its public
half in a ConfigMap per service that the pods mount; nothing secret in the user's namespace
(operator/kube/management.py, resources/management.py); one annotation rotates the key, the new public
key published in the ConfigMaps before the operator signs with it. Tier 3 checks the signatures against the
real runtime, e2e/test_lora.py through the chart's operator on the real node; that no call is refused during
a rotation, tests/unit/test_reconcile_management.py (kwok's pods run no runtime to call)."""

from __future__ import annotations

import base64
from pathlib import Path

from harness import MANAGEMENT_KEY_SECRET, OperatorProcess, wait_until
from isvc import create_ready
from kubernetes import client

from e2e.lab.cluster import Cluster
from pagoda import contract
from pagoda.contract.management import Signer
from pagoda.operator.kube.client import Kube
from pagoda.operator.kube.management import KEY_FIELD, NEXT_KEY_FIELD, PUBLISHED_ANNOTATION, ROTATE_ANNOTATION


def test_the_pods_get_the_public_half_of_the_stored_key_and_nothing_secret(
    operator: OperatorProcess, kube: client.CustomObjectsApi, raw: Kube, namespace: str
) -> None:
    create_ready(kube, "signed", namespace, replicas=1)
    stored = raw.get("v1", "secrets", *MANAGEMENT_KEY_SECRET)
    assert stored is not None, "the operator did not store its management key"
    public = Signer(base64.b64decode(stored["data"][KEY_FIELD])).public_pem

    config_map = raw.get("v1", "configmaps", namespace, "signed-management")
    assert config_map is not None
    assert config_map["data"] == {contract.MANAGEMENT_KEY_FILE: public}
    assert "PRIVATE" not in str(config_map)
    owner = config_map["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("InferenceService", "signed", True)
    assert raw.list("v1", "secrets", namespace) == [], "the operator put a Secret in the user's namespace"

    deployment = raw.get("apps/v1", "deployments", namespace, "signed")
    assert deployment is not None
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[args.index("--management-public-key-file") + 1] == contract.MANAGEMENT_PUBLIC_KEY_PATH
    volume = next(v for v in pod["volumes"] if v.get("configMap", {}).get("name") == "signed-management")
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert mount == {"name": volume["name"], "mountPath": contract.MANAGEMENT_KEY_DIR, "readOnly": True}


OVERLAP = 20  # seconds: the harness resyncs every 5 s, and kwok's pods mount no volume to wait for


class ShortOverlap(OperatorProcess):
    """The harness's operator with a rotation's overlap short enough for a test."""

    def args(self) -> list[str]:
        return [*super().args(), "--management-key-overlap-seconds", str(OVERLAP)]


def public_half(secret: dict[str, object] | None, field: str) -> str | None:
    data = (secret or {}).get("data") or {}
    assert isinstance(data, dict)
    value = data.get(field)
    return Signer(base64.b64decode(value)).public_pem if value else None


def test_one_annotation_rotates_the_key_through_every_configmap(
    cluster: Cluster,
    operator: OperatorProcess,
    kube: client.CustomObjectsApi,
    raw: Kube,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The Secret's and the ConfigMap's states in order: the new key stored beside the old, both public keys
    published (the old, still signing, first), then the new key alone in both."""
    operator.stop()  # in its place, the same operator with a short overlap
    rotating = ShortOverlap(cluster.kubeconfig, tmp_path)
    try:
        rotating.start()
        create_ready(kube, "rotated", namespace, replicas=1)
        old = public_half(raw.get("v1", "secrets", *MANAGEMENT_KEY_SECRET), KEY_FIELD)
        assert old is not None

        def published() -> str:
            found = raw.get("v1", "configmaps", namespace, "rotated-management")
            return str(((found or {}).get("data") or {}).get(contract.MANAGEMENT_KEY_FILE))

        wait_until(lambda: published() == old, "the ConfigMap to hold the stored key")
        secret_ns, secret_name = MANAGEMENT_KEY_SECRET
        cluster.kubectl("annotate", "secret", "-n", secret_ns, secret_name, f"{ROTATE_ANNOTATION}=now")

        stored = wait_until(
            lambda: (
                (s := raw.get("v1", "secrets", *MANAGEMENT_KEY_SECRET)) and NEXT_KEY_FIELD in s["data"] and s
            ),
            "the new key stored beside the old",
        )
        new = public_half(stored, NEXT_KEY_FIELD)
        assert new is not None and new != old and public_half(stored, KEY_FIELD) == old
        assert ROTATE_ANNOTATION not in stored["metadata"]["annotations"]
        assert PUBLISHED_ANNOTATION in stored["metadata"]["annotations"]
        wait_until(
            lambda: published() == old + new, "both public keys in the ConfigMap, the signing one first"
        )

        done = wait_until(
            lambda: (
                (s := raw.get("v1", "secrets", *MANAGEMENT_KEY_SECRET))
                and NEXT_KEY_FIELD not in s["data"]
                and s
            ),
            "the operator to sign with the new key",
            timeout=OVERLAP + 60,
        )
        assert public_half(done, KEY_FIELD) == new
        wait_until(lambda: published() == new, "the old public key dropped from the ConfigMap")
        log = rotating.log()
        assert log.index("Rotating the management key") < log.index("Signing with the new management key")
    finally:
        rotating.stop()
        operator.start()
