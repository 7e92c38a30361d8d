"""The NetworkPolicies (spec.networkPolicy): who may open connections to the runtime pods, and with
spec.routing to the endpoint picker's.

The runtime serves the inference API, /metrics and the management API on one port, and a NetworkPolicy
admits by port, not by path: each peer below reaches all three. The management API checks the operator's
signature on every call (contract/management.py), so being admitted here lets a peer read metrics and send
requests, never change adapters. Peers:
- the service's own namespace (its clients there, the picker),
- the Gateway's namespace when spec.routing.gateway names one (the gateway's proxies call the pods directly),
- spec.networkPolicy.allowFrom,
- the namespaces the operator trusts (`--allow-from-namespace`: its own, for the capacity and management
  calls, and Prometheus's for /metrics).
The picker's gRPC (ext_proc) and health ports admit the first three; its metrics port the own namespace and
the trusted ones. Only ingress is restricted: the pods fetch models from wherever spec.model points.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from pagoda.contract import HTTP_PORT
from pagoda.operator.api import InferenceServiceSpec, NetworkPeer

from .meta import metadata, selector
from .routing import GRPC_PORT, HEALTH_PORT, METRICS_PORT, picker_metadata, picker_selector

# The label the API server puts on every namespace (its name), what namespace peers select on.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def network_policies(
    name: str, namespace: str, spec: InferenceServiceSpec, trusted_namespaces: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """The runtime pods' NetworkPolicy and, with spec.routing, the picker's; none when disabled."""
    if not spec.network_policy.enabled:
        return []
    own: list[dict[str, Any]] = [
        {"podSelector": {}}
    ]  # alone, a podSelector means pods of the policy's own namespace
    clients = own + [_peer(peer) for peer in _client_peers(namespace, spec)]
    trusted = [_namespace_peer(ns) for ns in sorted(set(trusted_namespaces) - {namespace})]
    runtime = [_rule(clients + trusted, HTTP_PORT)]
    policies = [_policy(metadata(name, namespace), selector(name), runtime)]
    if spec.routing is not None:
        picker = [_rule(clients, GRPC_PORT, HEALTH_PORT), _rule(own + trusted, METRICS_PORT)]
        policies.append(_policy(picker_metadata(name, namespace), picker_selector(name), picker))
    return policies


def _client_peers(namespace: str, spec: InferenceServiceSpec) -> list[NetworkPeer]:
    """allowFrom and the Gateway's namespace, less what the own-namespace peer already admits."""
    peers = list(spec.network_policy.allow_from)
    gateway = spec.routing.gateway if spec.routing is not None else None
    if gateway is not None and gateway.namespace is not None:
        peers.append(NetworkPeer(namespace=gateway.namespace))
    return [peer for peer in peers if (peer.namespace or namespace) != namespace]


def _peer(peer: NetworkPeer) -> dict[str, Any]:
    rule = _namespace_peer(peer.namespace or "")  # never empty: _client_peers keeps other namespaces only
    if peer.pod_labels:
        rule["podSelector"] = {"matchLabels": dict(peer.pod_labels)}
    return rule


def _namespace_peer(namespace: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}}}


def _rule(peers: list[dict[str, Any]], *ports: int) -> dict[str, Any]:
    # Each rule its own copy of the peers: a dump then has no YAML anchors.
    return {"from": copy.deepcopy(peers), "ports": [{"protocol": "TCP", "port": port} for port in ports]}


def _policy(meta: dict[str, Any], pods: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {"podSelector": {"matchLabels": pods}, "policyTypes": ["Ingress"], "ingress": rules},
    }
