"""Tier 1: spec.runtime.tls in the API (pydantic and the CRD's CEL, one message), in the children (pod,
Service, ServiceMonitor, profile Job) and in the operator's calls to a pod (a real HTTPS server on
loopback, the call made as the operator makes it: verified against the Secret's CA, for the Service's name,
or refused)."""

from __future__ import annotations

import base64
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

from e2e.lab._pki import TlsDir, write_tls_dir
from pagoda import contract
from pagoda.contract.management import Signer, new_private_key
from pagoda.operator.api import InferenceServiceSpec, error_messages
from pagoda.operator.api import rules as r
from pagoda.operator.kube.adapters import AdapterSync
from pagoda.operator.kube.cache import _slim_pod as slim_pod
from pagoda.operator.kube.capacity import CapacityReader
from pagoda.operator.kube.client import KubeError
from pagoda.operator.kube.podcalls import PodTrust
from pagoda.operator.resources import ChildInputs, OperatorSettings, desired_children
from pagoda.operator.resources.meta import service_url
from pagoda.operator.resources.tls import pod_scheme, pod_tls, pod_url

TLS = {"secretName": "llama-tls"}
SQL = "hf://example-org/sql-lora"


def spec_of(document: dict[str, Any], **runtime: Any) -> InferenceServiceSpec:
    document = copy.deepcopy(document)
    document.setdefault("runtime", {}).update(runtime)
    return InferenceServiceSpec.model_validate(document)


def children(spec: InferenceServiceSpec, name: str = "llama", namespace: str = "llm") -> dict[str, Any]:
    return {
        c["kind"]: c
        for c in desired_children(name, namespace, spec, ChildInputs(OperatorSettings(management_key="PEM")))
    }


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


Seen = list[tuple[str, str, str, str]]  # (method, path, Host, Authorization) of each call that got through


@pytest.fixture
def https_runtime() -> Iterator[Callable[[TlsDir], tuple[int, Seen]]]:
    """Serves HTTPS on loopback with a given certificate (none names 127.0.0.1), answering the adapters API
    and the capacity endpoint as a runtime with one adapter Loaded does; records what reaches it."""
    servers: list[ThreadingHTTPServer] = []

    def serve(pki: TlsDir) -> tuple[int, Seen]:
        seen: Seen = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(("GET", self.path, self.headers["host"], self.headers.get("authorization", "")))
                answer: dict[str, Any] = {"adapters": [{"name": "sql", "source": SQL, "state": "Loaded"}]}
                if self.path == contract.CAPACITY_PATH:
                    answer = {"kvCacheTokens": 4096, "maxModelLen": 2048, "maxConcurrency": 2.0}
                body = json.dumps(answer).encode()
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
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.server_address[1], seen

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


class Secrets:
    """The API server's Secrets as PodTrust reads them: by name, or a 403 for a namespace it may not read."""

    def __init__(self, **secrets: dict[str, bytes]) -> None:
        self.secrets, self.reads, self.forbidden = secrets, 0, False

    def get(self, api_version: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert (api_version, plural) == ("v1", "secrets")
        self.reads += 1
        if self.forbidden:
            raise KubeError(403, "Forbidden", f'secrets "{name}" is forbidden: cannot get resource "secrets"')
        data = self.secrets.get(name)
        if data is None:
            return None
        return {
            "metadata": {"name": name},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }


def secret_of(pki: TlsDir, *, ca: bool = True) -> dict[str, bytes]:
    files = {"tls.crt": pki.cert, "tls.key": pki.key} | ({"ca.crt": pki.ca_cert} if ca else {})
    return {key: path.read_bytes() for key, path in files.items()}


def tls_pod(
    llama_spec: dict[str, Any], name: str = "llama", tls: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A Ready pod of InferenceService `name` in namespace llm made with spec.runtime.tls, on loopback."""
    spec = spec_of({**llama_spec, "lora": {"adapters": [{"name": "sql", "uri": SQL}]}}, tls=tls or TLS)
    template = children(spec, name)["Deployment"]["spec"]["template"]
    return {
        "metadata": {"name": f"{name}-0", "uid": f"uid-{name}", "namespace": "llm", **template["metadata"]},
        "spec": template["spec"],
        "status": {
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "runtime", "restartCount": 0}],
        },
    }


def trust(secrets: Secrets, **tls_of: dict[str, Any]) -> PodTrust:
    """The operator's PodTrust, with InferenceServices `tls_of` (name: spec.runtime.tls) in namespace llm."""
    owners = {("llm", name): {"spec": {"runtime": {"tls": tls}}} for name, tls in tls_of.items()}
    return PodTrust(secrets, lambda namespace, name: owners.get((namespace, name)))  # type: ignore[arg-type]


def sync_once(
    llama_spec: dict[str, Any], port: int, trusted: PodTrust | None, name: str = "llama"
) -> dict[str, Any]:
    """One pass of the operator's adapter sync over one TLS pod; the status it reports."""
    spec = spec_of({**llama_spec, "lora": {"adapters": [{"name": "sql", "uri": SQL}]}}, tls=TLS)
    sync = AdapterSync(Signer(new_private_key()), port=port, trust=trusted)
    status: dict[str, Any] = sync.sync(spec, [tls_pod(llama_spec, name)]).status
    return status


def test_a_tls_pod_is_called_once_its_certificate_verifies_against_the_secrets_ca(
    llama_spec: dict[str, Any], https_runtime: Callable[[TlsDir], tuple[int, Seen]], tmp_path: Path
) -> None:
    pki = write_tls_dir(tmp_path / "tls", "llama", ["llama.llm.svc"], [])
    port, seen = https_runtime(pki)
    secrets = Secrets(**{"llama-tls": secret_of(pki)})
    status = sync_once(llama_spec, port, trust(secrets, llama=TLS))
    assert status.get("adaptersReady") == "1/1", status
    (method, path, host, authorization) = seen[0]
    assert (method, path, host) == ("GET", contract.ADAPTERS_PATH, f"127.0.0.1:{port}")  # the Host signed
    assert authorization.startswith("Pagoda-Ed25519 ")

    reader = CapacityReader(port=port, trust=trust(secrets, llama=TLS))
    capacity = reader.status([tls_pod(llama_spec)])
    assert capacity == {"kvCacheTokens": 4096, "maxModelLen": 2048, "maxConcurrency": 2.0}
    assert seen[-1][1] == contract.CAPACITY_PATH


def test_a_pod_with_a_certificate_from_another_ca_or_for_another_name_gets_no_call(
    llama_spec: dict[str, Any], https_runtime: Callable[[TlsDir], tuple[int, Seen]], tmp_path: Path
) -> None:
    """Whoever answers on a pod's IP with a certificate the Secret's CA did not issue, or one issued for
    another service, is not sent the signed call (the handshake fails before any request)."""
    right = write_tls_dir(tmp_path / "right", "llama", ["llama.llm.svc"], [])
    impostor = write_tls_dir(tmp_path / "impostor", "llama", ["llama.llm.svc"], [])  # another CA
    port, seen = https_runtime(impostor)
    secrets = Secrets(**{"llama-tls": secret_of(right)})
    status = sync_once(llama_spec, port, trust(secrets, llama=TLS))
    (entry,) = status["adapters"]
    assert (entry["state"], entry["reason"]) == ("Loading", "CertificateNotVerified"), entry
    assert "certificate verify failed" in entry["message"]
    assert CapacityReader(port=port, trust=trust(secrets, llama=TLS)).status([tls_pod(llama_spec)]) is None

    port, seen_right = https_runtime(right)  # the right CA, but the pod is another service's
    status = sync_once(llama_spec, port, trust(secrets, other=TLS), name="other")
    (entry,) = status["adapters"]
    assert entry["reason"] == "CertificateNotVerified", entry
    assert "other.llm.svc" in entry["message"], entry
    assert seen == [] and seen_right == []


def test_without_a_ca_the_pods_are_not_called_unless_the_spec_skips_verification(
    llama_spec: dict[str, Any], https_runtime: Callable[[TlsDir], tuple[int, Seen]], tmp_path: Path
) -> None:
    pki = write_tls_dir(tmp_path / "tls", "llama", ["llama.llm.svc"], [])
    port, seen = https_runtime(pki)
    secrets = Secrets(**{"llama-tls": secret_of(pki, ca=False)})
    (entry,) = sync_once(llama_spec, port, trust(secrets, llama=TLS))["adapters"]
    assert entry["reason"] == "CertificateNotVerified", entry
    assert (
        "Secret llm/llama-tls has no ca.crt" in entry["message"] and "insecureSkipVerify" in entry["message"]
    )

    secrets.forbidden = True  # the operator may not read the Secret: said, not skipped
    (entry,) = sync_once(llama_spec, port, trust(secrets, llama=TLS))["adapters"]
    assert "HTTP 403" in entry["message"] and "get` on Secrets" in entry["message"], entry

    (entry,) = sync_once(llama_spec, port, None)["adapters"]  # no PodTrust at all: refused too
    assert entry["reason"] == "CertificateNotVerified", entry
    assert seen == []

    skip = {**TLS, "insecureSkipVerify": True}  # the spec's choice: encrypted, not authenticated
    reads = secrets.reads
    status = sync_once(llama_spec, port, trust(secrets, llama=skip))
    assert status.get("adaptersReady") == "1/1" and len(seen) == 1, status
    assert secrets.reads == reads, "insecureSkipVerify needs no read of the Secret"


def test_the_secret_is_read_once_and_only_its_ca_is_kept(llama_spec: dict[str, Any], tmp_path: Path) -> None:
    pki = write_tls_dir(tmp_path / "tls", "llama", ["llama.llm.svc"], [])
    secrets = Secrets(**{"llama-tls": secret_of(pki)})
    trusted = trust(secrets, llama=TLS)
    first = trusted.for_pod(tls_pod(llama_spec))
    assert trusted.for_pod(tls_pod(llama_spec)) is first and secrets.reads == 1
    assert first.verified and first.server_name == "llama.llm.svc" and first.refused is None
    assert first.context is not None and first.context.verify_mode == ssl.CERT_REQUIRED
    assert first.context.check_hostname
    assert "PRIVATE" not in repr(vars(first)) + repr(trusted._known)


def test_the_choice_follows_the_spec_and_the_secret() -> None:
    """Pure: what the operator does with a TLS pod, for each spec and Secret."""
    assert pod_tls("llm", "llama", None, None, None).refused == (
        "spec.runtime.tls is unset, so the operator has no CA for this pod's TLS"
    )
    skipped = pod_tls("llm", "llama", {"secretName": "s", "insecureSkipVerify": True}, None, None)
    assert (
        not skipped.verified and skipped.context is not None and skipped.context.verify_mode == ssl.CERT_NONE
    )
    refused = pod_tls("llm", "llama", {"secretName": "s"}, "not a certificate", None)
    assert (
        refused.refused is not None and "ca.crt of Secret llm/s is not a PEM certificate" in refused.refused
    )
    unreadable = pod_tls("llm", "llama", {"secretName": "s"}, None, "it does not exist")
    assert unreadable.refused is not None
    assert unreadable.refused.startswith("cannot read Secret llm/s for its ca.crt: it does not exist")
