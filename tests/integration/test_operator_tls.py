"""spec.runtime.tls against the real API server: admission accepts it and refuses it with spec.routing
(the CRD's CEL rule, word for word the operator's message), and the operator's children carry it (the
Secret mounted, the runtime's flags, HTTPS probes, appProtocol https, a ServiceMonitor scraping over TLS
that the real ServiceMonitor CRD accepts); turning it off rolls the pods back to plain HTTP; the operator
calls a TLS pod only with a CA from its Secret to verify it against. That the runtime then serves HTTPS is
tier 3's (tests/runtime/test_rt_tls.py); the verification itself, against real HTTPS servers, tier 1's
(tests/unit/test_resources_tls.py)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from harness import OperatorProcess, wait_until
from isvc import GROUP, PLURAL, VERSION, condition, create, create_ready, get, manifest, patch, wait_ready
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from e2e.lab._pki import write_tls_dir
from pagoda import contract
from pagoda.operator.api import InferenceServiceSpec
from pagoda.operator.api.rules import MSG_TLS_ROUTING
from pagoda.operator.kube.client import Kube

TLS = {"tls": {"secretName": "tiny-tls"}}
MONITORED = {"monitoring": {"serviceMonitor": {"enabled": True}}}


def dry_run(cluster_api: Any, body: dict[str, Any]) -> dict[str, Any]:
    created: dict[str, Any] = client.CustomObjectsApi(cluster_api).create_namespaced_custom_object(
        GROUP, VERSION, body["metadata"]["namespace"], PLURAL, body, dry_run="All", field_validation="Strict"
    )
    return created


def test_admission_accepts_tls_and_refuses_it_with_routing(
    crd: None, cluster_api: Any, namespace: str
) -> None:
    accepted = dry_run(
        cluster_api,
        manifest("ok", namespace, runtime={"tls": {"secretName": "ok-tls", "insecureSkipVerify": True}}),
    )
    assert accepted["spec"]["runtime"]["tls"] == {"secretName": "ok-tls", "insecureSkipVerify": True}

    routed = manifest("bad", namespace, runtime=TLS, routing={})
    with pytest.raises(ApiException) as caught:
        dry_run(cluster_api, routed)
    assert caught.value.status == 422, caught.value.body
    message = json.loads(caught.value.body)["message"]
    assert "spec.runtime.tls" in message and MSG_TLS_ROUTING in message, message
    with pytest.raises(ValidationError) as invalid:  # an object stored before the rule: the same words
        InferenceServiceSpec.model_validate(routed["spec"])
    assert MSG_TLS_ROUTING in str(invalid.value)

    for tls, field in (({}, "spec.runtime.tls.secretName"), ({"secretName": "Not_A_Name"}, "secretName")):
        with pytest.raises(ApiException) as caught:
            dry_run(cluster_api, manifest("bad", namespace, runtime={"tls": tls}))
        assert field in json.loads(caught.value.body)["message"]


def runtime_container(raw: Kube, namespace: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = raw.get("apps/v1", "deployments", namespace, name)
    assert deployment is not None
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def test_the_deployment_service_and_service_monitor_carry_tls_and_drop_it_again(
    operator: OperatorProcess,
    kube: client.CustomObjectsApi,
    cluster_api: Any,
    raw: Kube,
    namespace: str,
    tmp_path: Path,
) -> None:
    # The Secret not there yet: reported (the operator looks for the Secrets the pods mount), then fixed.
    create(kube, "tiny", namespace, replicas=1, runtime=TLS, **MONITORED)
    cond = wait_until(
        lambda: (
            (c := condition(get(kube, "tiny", namespace), "Degraded")).get("reason") == "SecretNotFound" and c
        ),
        "Degraded=SecretNotFound",
    )
    assert "tiny-tls" in cond["message"]
    pki = write_tls_dir(tmp_path / "tls", "tiny", [f"tiny.{namespace}.svc"], [])
    files = {name: (pki.directory / name).read_bytes() for name in ("tls.crt", "tls.key", "ca.crt")}
    client.CoreV1Api(cluster_api).create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": "tiny-tls"},
            "type": "kubernetes.io/tls",
            "data": {name: base64.b64encode(data).decode() for name, data in files.items()},
        },
    )
    wait_ready(kube, "tiny", namespace, "Ready with the Secret")
    pod, container = runtime_container(raw, namespace, "tiny")
    args = container["args"]
    assert args[args.index("--tls-cert-file") + 1] == contract.TLS_CERT_PATH
    assert args[args.index("--tls-key-file") + 1] == contract.TLS_KEY_PATH
    volume = next(v for v in pod["volumes"] if v["name"] == "tls")
    assert volume["secret"] == {"secretName": "tiny-tls", "defaultMode": 0o440}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "tls")
    assert mount == {"name": "tls", "mountPath": contract.TLS_DIR, "readOnly": True}
    assert {
        container[p]["httpGet"]["scheme"] for p in ("startupProbe", "livenessProbe", "readinessProbe")
    } == {"HTTPS"}
    service = raw.get("v1", "services", namespace, "tiny")
    assert service is not None and service["spec"]["ports"][0]["appProtocol"] == "https"
    monitor = raw.get("monitoring.coreos.com/v1", "servicemonitors", namespace, "tiny")
    assert monitor is not None
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "tiny-tls", "key": contract.TLS_CA_KEY}},
        "serverName": f"tiny.{namespace}.svc",
    }

    # Off again: the pods roll back to plain HTTP, the Service and the ServiceMonitor follow.
    patch(kube, "tiny", namespace, {"runtime": {"tls": None}})
    wait_until(
        lambda: "--tls-cert-file" not in runtime_container(raw, namespace, "tiny")[1]["args"],
        "the Deployment without the TLS flags",
    )
    wait_ready(kube, "tiny", namespace, "Ready again without TLS")
    pod, container = runtime_container(raw, namespace, "tiny")
    assert all(v["name"] != "tls" for v in pod["volumes"])
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
    service = raw.get("v1", "services", namespace, "tiny")
    assert service is not None and "appProtocol" not in service["spec"]["ports"][0]
    monitor = raw.get("monitoring.coreos.com/v1", "servicemonitors", namespace, "tiny")
    assert monitor is not None
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "http" and "tlsConfig" not in endpoint


def test_a_tls_pod_is_not_called_until_the_secret_gives_a_ca_to_verify_it_against(
    operator: OperatorProcess,
    kube: client.CustomObjectsApi,
    cluster_api: Any,
    namespace: str,
    tmp_path: Path,
) -> None:
    """kwok's pods run nothing (their IPs are routed unreachable), so what shows here is the operator's
    choice before it connects: refused while the Secret has no ca.crt (CertificateNotVerified, naming it),
    then a connection tried (ReplicaUnreachable) once the Secret has one, without a restart."""
    pki = write_tls_dir(tmp_path / "tls", "verify", [f"verify.{namespace}.svc"], [])
    files = {name: (pki.directory / name).read_bytes() for name in ("tls.crt", "tls.key", "ca.crt")}
    data = {name: base64.b64encode(value).decode() for name, value in files.items()}
    core = client.CoreV1Api(cluster_api)
    without_ca = {k: v for k, v in data.items() if k != "ca.crt"}
    secret = {"metadata": {"name": "verify-tls"}, "type": "kubernetes.io/tls", "data": without_ca}
    core.create_namespaced_secret(namespace, secret)
    lora = {"adapters": [{"name": "sql", "uri": "hf://pagoda-test/sql-lora"}]}
    create_ready(
        kube, "verify", namespace, replicas=1, runtime={"tls": {"secretName": "verify-tls"}}, lora=lora
    )

    def adapter_reason() -> dict[str, Any] | None:
        entries = ((get(kube, "verify", namespace) or {}).get("status") or {}).get("adapters") or []
        return entries[0] if entries and entries[0].get("reason") else None

    entry = wait_until(
        lambda: (e := adapter_reason()) and e["reason"] == "CertificateNotVerified" and e,
        "the replica reported CertificateNotVerified",
    )
    assert f"Secret {namespace}/verify-tls has no ca.crt" in entry["message"], entry
    assert "Not calling the TLS pods name=verify" in operator.log()
    assert condition(get(kube, "verify", namespace), "Ready")["status"] == "True"  # serving is not affected

    core.patch_namespaced_secret("verify-tls", namespace, {"data": {"ca.crt": data["ca.crt"]}})
    entry = wait_until(
        lambda: (e := adapter_reason()) and e["reason"] == "ReplicaUnreachable" and e,
        "the operator to read the CA and try the pod",
        timeout=150,
    )
    assert "certificate" not in entry["message"], entry
