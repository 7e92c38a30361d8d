"""The runtime's management API key: the ConfigMap holding the operator's public key, and how the pods get it.

Every call the operator makes to a pod's management API (the adapters endpoints) is signed with the
operator's private key (kube/management.py); the pods check it against the public key in this
ConfigMap, mounted read-only (contract/management.py). Only a public key: nothing in the user's namespace can
sign. The runtime reads the file at each call, so a new operator key reaches running pods as the kubelet
updates the volume (about a minute), without a restart: the key is not part of the pod template. During a
rotation of the operator's key the file holds two public keys, one PEM block after the other, the key it
signs with first (kube/management.py KeyRing.public_pem); the runtime accepts either.
"""

from __future__ import annotations

from typing import Any

from pagoda.contract import MANAGEMENT_KEY_DIR, MANAGEMENT_KEY_FILE

from .meta import labels

MANAGEMENT_VOLUME = "management-key"


def management_config_map_name(name: str) -> str:
    """The operator's ConfigMap holding its public key for InferenceService `name`'s pods."""
    return f"{name}-management"


def management_config_map(name: str, namespace: str, public_key: str) -> dict[str, Any]:
    """`public_key`: one PEM public key, or several one after the other (a rotation)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": management_config_map_name(name),
            "namespace": namespace,
            "labels": labels(name),
        },
        "data": {MANAGEMENT_KEY_FILE: public_key},
    }


def management_volume(name: str) -> dict[str, Any]:
    return {"name": MANAGEMENT_VOLUME, "configMap": {"name": management_config_map_name(name)}}


def management_mount() -> dict[str, Any]:
    return {"name": MANAGEMENT_VOLUME, "mountPath": MANAGEMENT_KEY_DIR, "readOnly": True}
