"""Tier 1: spec.runtime.tls in the API (pydantic and the CRD's CEL, one message), in the children (pod,
Service, ServiceMonitor, profile Job) and in the operator's calls to a pod (a real HTTPS server on
loopback, the call made as the operator makes it)."""

from __future__ import annotations

import copy
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from e2e._pki import write_tls_dir
from pagoda.operator.api import InferenceServiceSpec, error_messages
from pagoda.operator.api import rules as r
from pagoda.operator.reconcile.adapters import AdapterSync
from pagoda.operator.reconcile.cache import _slim_pod as slim_pod
from pagoda.operator.resources import desired_children
from pagoda.operator.resources.meta import service_url
from pagoda.operator.resources.tls import pod_scheme, pod_url
from pagoda.runtime import contract
from pagoda.runtime.management import Signer, new_private_key

TLS = {"secretName": "llama-tls"}
SQL = "hf://example-org/sql-lora"


def spec_of(document: dict[str, Any], **runtime: Any) -> InferenceServiceSpec:
    document = copy.deepcopy(document)
    document.setdefault("runtime", {}).update(runtime)
    return InferenceServiceSpec.model_validate(document)


def children(spec: InferenceServiceSpec, name: str = "llama", namespace: str = "llm") -> dict[str, Any]:
    return {c["kind"]: c for c in desired_children(name, namespace, spec, management_key="PEM")}


def runtime_container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def test_tls_mounts_the_secret_and_passes_the_runtime_flags(llama_spec: dict[str, Any]) -> None:
    made = children(spec_of(llama_spec, tls=TLS))
    pod = made["Deployment"]["spec"]["template"]["spec"]
    container = runtime_container(made["Deployment"])
    args = container["args"]
    assert args[args.index("--tls-cert-file") + 1] == contract.TLS_CERT_PATH == "/etc/pagoda/tls/tls.crt"
    assert args[args.index("--tls-key-file") + 1] == contract.TLS_KEY_PATH == "/etc/pagoda/tls/tls.key"
    assert args.index("--tls-key-file") < args.index("--") if "--" in args else True
    # The whole Secret as a folder (a subPath mount is never updated), read-only, the key not world-readable.
    assert {"name": "tls", "mountPath": contract.TLS_DIR, "readOnly": True} in container["volumeMounts"]
    assert not any("subPath" in m for m in container["volumeMounts"] if m["name"] == "tls")
    assert {"name": "tls", "secret": {"secretName": "llama-tls", "defaultMode": 0o440}} in pod["volumes"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS", probe
    assert pod_scheme(made["Deployment"]["spec"]["template"]) == "https"


def test_without_tls_nothing_changes(llama_spec: dict[str, Any]) -> None:
    made = children(spec_of(llama_spec))
    container = runtime_container(made["Deployment"])
    assert not any(a.startswith("--tls") for a in container["args"])
    assert all(m["name"] != "tls" for m in container["volumeMounts"])
    assert {container[p]["httpGet"]["scheme"] for p in ("startupProbe", "readinessProbe")} == {"HTTP"}
    assert "appProtocol" not in made["Service"]["spec"]["ports"][0]
    (endpoint,) = made["ServiceMonitor"]["spec"]["endpoints"]
    assert endpoint["scheme"] == "http" and "tlsConfig" not in endpoint
    assert pod_scheme(made["Deployment"]["spec"]["template"]) == "http"


def test_the_service_says_https(llama_spec: dict[str, Any]) -> None:
    (port,) = children(spec_of(llama_spec, tls=TLS))["Service"]["spec"]["ports"]
    assert port == {
        "name": "http",
        "port": 8000,
        "targetPort": "http",
        "protocol": "TCP",
        "appProtocol": "https",
    }
    assert service_url("llama", "llm", 8000, "https") == "https://llama.llm.svc:8000"


def test_prometheus_verifies_against_the_secrets_ca_and_the_services_name(llama_spec: dict[str, Any]) -> None:
    (endpoint,) = children(spec_of(llama_spec, tls=TLS))["ServiceMonitor"]["spec"]["endpoints"]
    assert endpoint == {
        "port": "http",
        "path": "/metrics",
        "interval": "15s",
        "scheme": "https",
        "tlsConfig": {
            "ca": {"secret": {"name": "llama-tls", "key": "ca.crt"}},
            "serverName": "llama.llm.svc",
        },
    }


def test_insecure_skip_verify_scrapes_without_verification(llama_spec: dict[str, Any]) -> None:
    spec = spec_of(llama_spec, tls={**TLS, "insecureSkipVerify": True})
    (endpoint,) = children(spec)["ServiceMonitor"]["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"] == {"insecureSkipVerify": True}


def test_the_profile_job_serves_plain_http_on_loopback(llama_spec: dict[str, Any]) -> None:
    """Its server is the profile's alone: no certificate, and TLS on or off names the same Job."""
    slo = {"slo": {"ttftMs": 500, "interTokenMs": 50}}
    with_tls = children(spec_of({**llama_spec, **slo}, tls=TLS))["Job"]
    without = children(spec_of({**llama_spec, **slo}))["Job"]
    assert with_tls == without
    container = runtime_container(with_tls)
    assert not any(a.startswith("--tls") for a in container["args"])
    assert all(v["name"] != "tls" for v in with_tls["spec"]["template"]["spec"]["volumes"])


def _object(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "llama", "namespace": "llm"},
        "spec": spec,
    }


def test_tls_with_routing_is_refused_with_one_message(
    llama_spec: dict[str, Any], cel_check: Callable[[dict[str, Any]], list[str]]
) -> None:
    llama_spec["runtime"] = {"tls": TLS}
    llama_spec["routing"] = {}
    with pytest.raises(ValidationError) as caught:
        InferenceServiceSpec.model_validate(llama_spec)
    assert r.MSG_TLS_ROUTING in error_messages(caught.value)
    assert r.MSG_TLS_ROUTING.startswith("spec.runtime.tls ") and "spec.routing" in r.MSG_TLS_ROUTING
    assert cel_check(_object(llama_spec)) == [r.MSG_TLS_ROUTING]
    del llama_spec["routing"]
    assert cel_check(_object(llama_spec)) == []
    InferenceServiceSpec.model_validate(llama_spec)


@pytest.mark.parametrize(
    ("tls", "field"),
    [
        ({}, "spec.runtime.tls.secretName"),
        ({"secretName": "Not_A_Name"}, "spec.runtime.tls.secretName"),
        ({"secretName": "ok", "caKey": "ca.crt"}, "spec.runtime.tls.caKey"),
        ({"secretName": "ok", "insecureSkipVerify": "maybe"}, "spec.runtime.tls.insecureSkipVerify"),
    ],
)
def test_a_bad_tls_field_is_named(llama_spec: dict[str, Any], tls: dict[str, Any], field: str) -> None:
    llama_spec["runtime"] = {"tls": tls}
    with pytest.raises(ValidationError) as caught:
        InferenceServiceSpec.model_validate(llama_spec)
    messages = error_messages(caught.value)
    assert any(message.startswith(field) for message in messages), messages


def test_pod_urls_follow_each_pods_probes() -> None:
    """During a rollout that turns TLS on, old pods are still called over http, new ones over https."""

    def pod(ip: str, scheme: str | None) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "runtime"}
        if scheme:
            container["readinessProbe"] = {"httpGet": {"path": "/readyz", "port": "http", "scheme": scheme}}
        return {"spec": {"containers": [container]}, "status": {"podIP": ip}}

    assert pod_url(pod("10.0.0.7", "HTTPS"), 8000, "/v1/x") == "https://10.0.0.7:8000/v1/x"
    assert pod_url(pod("10.0.0.7", "HTTP"), 8000, "/v1/x") == "http://10.0.0.7:8000/v1/x"
    assert pod_url(pod("fd00::7", "HTTPS"), 8000, "/v1/x") == "https://[fd00::7]:8000/v1/x"
    assert pod_url(pod("10.0.0.7", None), 8000, "/v1/x") == "http://10.0.0.7:8000/v1/x"


def test_the_operators_pod_cache_keeps_what_tells_the_scheme(llama_spec: dict[str, Any]) -> None:
    """The operator calls the pods it reads from its cache, which keeps little of a pod's spec."""
    for tls, scheme in ((TLS, "https"), (None, "http")):
        spec = spec_of(llama_spec, tls=tls) if tls else spec_of(llama_spec)
        template = children(spec)["Deployment"]["spec"]["template"]
        pod = {"metadata": {"name": "llama-0"}, "spec": template["spec"], "status": {"podIP": "10.0.0.7"}}
        assert pod_url(slim_pod(pod), 8000, "/v1/x") == f"{scheme}://10.0.0.7:8000/v1/x"


@pytest.fixture
def https_runtime(tmp_path: Path) -> Iterator[tuple[int, list[tuple[str, str, str]]]]:
    """An HTTPS server on loopback answering the adapters API as an empty runtime does, with a certificate
    that names neither 127.0.0.1 nor anything the operator knows; records (method, path, authorization)."""
    pki = write_tls_dir(tmp_path / "tls", "llama", ["llama.llm.svc"], [])
    seen: list[tuple[str, str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(("GET", self.path, self.headers.get("authorization", "")))
            body = json.dumps({"adapters": [{"name": "sql", "source": SQL, "state": "Loaded"}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.cert, pki.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def test_the_operator_calls_a_tls_pod_over_https(
    llama_spec: dict[str, Any], https_runtime: tuple[int, list[tuple[str, str, str]]]
) -> None:
    port, seen = https_runtime
    spec = spec_of({**llama_spec, "lora": {"adapters": [{"name": "sql", "uri": SQL}]}}, tls=TLS)
    template = children(spec)["Deployment"]["spec"]["template"]
    pod = {
        "metadata": {"name": "llama-0", "uid": "u1"},
        "spec": template["spec"],
        "status": {
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "runtime", "restartCount": 0}],
        },
    }
    sync = AdapterSync(Signer(new_private_key()), port=port)
    report = sync.sync(spec, [pod])
    assert seen and seen[0][:2] == ("GET", contract.ADAPTERS_PATH), report
    assert seen[0][2].startswith("Pagoda-Ed25519 ")
    assert report.status.get("adaptersReady") == "1/1", report.status
