"""The operator's management key on the real control plane: stored in its Secret on first start, its public
half in a ConfigMap per service that the pods mount; nothing secret in the user's namespace
(operator/reconcile/management.py, resources/management.py). Tier 3 checks the signatures against the real
runtime, e2e/test_lora.py through the chart's operator on the real node."""

from __future__ import annotations

import base64

from harness import MANAGEMENT_KEY_SECRET, OperatorProcess
from isvc import create_ready
from kubernetes import client

from pagoda.operator.reconcile.kube import Kube
from pagoda.operator.reconcile.management import KEY_FIELD
from pagoda.runtime import contract
from pagoda.runtime.management import Signer


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
