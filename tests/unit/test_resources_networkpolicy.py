"""spec.networkPolicy's builder: the runtime pods admit their own namespace, the trusted namespaces, the
Gateway's and allowFrom on the runtime port only; the picker's metrics port admits only its own namespace
and the trusted ones; disabled, no NetworkPolicy is built (so the controller deletes one it made)."""

from __future__ import annotations

from typing import Any

from pagoda.contract import HTTP_PORT
from pagoda.operator.api import InferenceServiceSpec
from pagoda.operator.resources import ChildInputs, OperatorSettings, desired_children, selector
from pagoda.operator.resources.networkpolicy import NAMESPACE_NAME_LABEL
from pagoda.operator.resources.routing import GRPC_PORT, HEALTH_PORT, METRICS_PORT, picker_selector

BASE: dict[str, Any] = {
    "model": {"uri": "file:///models/tiny", "servedName": "tiny"},
    "resources": {"gpu": {"count": 1}},
}
TRUSTED = ("pagoda-system", "monitoring", "llm")  # "llm", the service's own, adds nothing


def policies(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    inputs = ChildInputs(OperatorSettings(trusted_namespaces=TRUSTED))
    built = desired_children("tiny", "llm", InferenceServiceSpec.model_validate(spec), inputs)
    return {child["metadata"]["name"]: child for child in built if child["kind"] == "NetworkPolicy"}


def namespaces(peers: list[dict[str, Any]]) -> list[str | None]:
    """Each peer's namespace name (None: the policy's own namespace)."""
    return [
        peer["namespaceSelector"]["matchLabels"][NAMESPACE_NAME_LABEL]
        if "namespaceSelector" in peer
        else None
        for peer in peers
    ]


def test_by_default_the_runtime_port_admits_the_own_and_trusted_namespaces_only() -> None:
    built = policies(BASE)
    assert list(built) == ["tiny"]
    spec = built["tiny"]["spec"]
    assert spec["podSelector"] == {"matchLabels": selector("tiny")}
    assert spec["policyTypes"] == ["Ingress"]  # egress stays open: models come from anywhere
    [rule] = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": HTTP_PORT}]
    assert rule["from"][0] == {"podSelector": {}}
    assert namespaces(rule["from"]) == [None, "monitoring", "pagoda-system"]


def test_allow_from_peers_are_one_namespace_and_its_labelled_pods() -> None:
    allow = [
        {"namespace": "apps", "podLabels": {"app": "chat"}},
        {"namespace": "batch"},
        {"podLabels": {"a": "b"}},
    ]
    [rule] = policies({**BASE, "networkPolicy": {"allowFrom": allow}})["tiny"]["spec"]["ingress"]
    apps = rule["from"][1]
    # One peer with both selectors: pods labelled app=chat in namespace apps (not either of them).
    assert apps == {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "apps"}},
        "podSelector": {"matchLabels": {"app": "chat"}},
    }
    # The own-namespace peer already admits every pod of "llm": no narrower duplicate.
    assert namespaces(rule["from"]) == [None, "apps", "batch", "monitoring", "pagoda-system"]


def test_routed_picker_admits_the_gateway_on_grpc_and_only_trusted_on_metrics() -> None:
    routed = {**BASE, "routing": {"gateway": {"name": "inference", "namespace": "gateways"}}}
    built = policies(routed)
    assert set(built) == {"tiny", "tiny-epp"}
    assert namespaces(built["tiny"]["spec"]["ingress"][0]["from"]) == [
        None,
        "gateways",
        "monitoring",
        "pagoda-system",
    ]
    picker = built["tiny-epp"]["spec"]
    assert picker["podSelector"] == {"matchLabels": picker_selector("tiny")}
    grpc, metrics = picker["ingress"]
    assert [p["port"] for p in grpc["ports"]] == [GRPC_PORT, HEALTH_PORT]
    assert namespaces(grpc["from"]) == [None, "gateways"]
    assert [p["port"] for p in metrics["ports"]] == [METRICS_PORT]
    assert namespaces(metrics["from"]) == [None, "monitoring", "pagoda-system"]
    assert built["tiny-epp"]["metadata"]["labels"]["pagoda.dev/inferenceservice"] == "tiny"


def test_disabled_builds_no_network_policy() -> None:
    assert policies({**BASE, "networkPolicy": {"enabled": False}}) == {}
    routed = {**BASE, "routing": {}, "networkPolicy": {"enabled": False}}
    assert policies(routed) == {}
