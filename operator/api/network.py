"""spec.networkPolicy: who may open connections to the runtime pods (and to the endpoint picker's).

On by default: the operator writes a NetworkPolicy that admits the service's own namespace (its clients
there, the picker), the namespaces the operator was told to trust (its own, for the capacity and management
calls, and Prometheus's: `--allow-from-namespace`), the Gateway's namespace when spec.routing.gateway names
one, and the peers listed here. Everything else is refused by a cluster that enforces NetworkPolicy (one
without an enforcing network plugin ignores the object). See docs/security.md.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .base import ApiModel
from .workload import LabelMap

NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
NamespaceName = Annotated[str, Field(min_length=1, max_length=63, pattern=NAMESPACE_PATTERN)]


class NetworkPeer(ApiModel):
    """Pods allowed to connect: those of one namespace, optionally only those with some labels."""

    namespace: NamespaceName | None = Field(
        default=None, description="The peers' namespace (default: the InferenceService's)."
    )
    pod_labels: LabelMap = Field(
        default_factory=dict,
        max_length=16,
        description="Only the pods with all these labels (default: every pod of the namespace).",
    )


class NetworkPolicySpec(ApiModel):
    """The NetworkPolicy in front of the runtime pods (and the endpoint picker's, with spec.routing)."""

    enabled: bool = Field(
        default=True,
        description="Write the NetworkPolicy; false leaves the pods open to every pod of the cluster.",
    )
    allow_from: list[NetworkPeer] = Field(
        default_factory=list,
        max_length=32,
        description="Clients outside the service's namespace (e.g. an application's namespace, a gateway's "
        "pods) allowed to reach the inference API, besides those the operator always admits.",
    )
