"""spec.routing: requests routed by the Gateway API Inference Extension (GIE), not a round-robin Service.

The operator then makes, per InferenceService, an InferencePool of its runtime pods and the endpoint picker
that serves it (GIE v1.5.0's `epp`, as GIE's own chart deploys it per pool): an Envoy-based gateway asks the
picker, per request, which pod to use (prefix-cache affinity, queue depth, KV-cache usage), and the picker's
flow control holds requests while no replica can take them, which is what makes scaling from zero safe.
See docs/routing.md.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import ApiModel, ObjectName, Quantity
from .network import NamespaceName

PICKER_VERSION = "v1.5.0"
DEFAULT_PICKER_IMAGE = f"registry.k8s.io/gateway-api-inference-extension/epp:{PICKER_VERSION}"


class EndpointPickerSpec(ApiModel):
    """The endpoint picker (GIE's `epp`) the operator deploys for this service's InferencePool."""

    image: str = Field(
        default=DEFAULT_PICKER_IMAGE,
        min_length=1,
        max_length=512,
        description=f"The picker's image (GIE {PICKER_VERSION}, the version Pagoda is tested with).",
    )
    queue_timeout_seconds: int = Field(
        default=300,
        ge=1,
        le=3600,
        description="Longest a request waits in the picker's flow-control queue for a replica (also while "
        "the first replica of a service scaled to zero starts) before the client gets 503; make it longer "
        "than a replica's start-up.",
    )
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        default="FailClose",
        description="What the gateway does when the picker does not answer: FailClose refuses the request "
        "(nothing can hold it while no replica runs), FailOpen sends it to any pod of the pool.",
    )
    cpu: Quantity = Field(default="1", description="CPU request of the picker.")
    memory: Quantity = Field(default="1Gi", description="Memory request and limit of the picker.")


class GatewayRef(ApiModel):
    """A Gateway (gateway.networking.k8s.io) that should route to this service: the operator adds an
    HTTPRoute whose backend is the InferencePool."""

    name: ObjectName = Field(description="The Gateway's name.")
    namespace: NamespaceName | None = Field(
        default=None, description="The Gateway's namespace (default: the InferenceService's)."
    )
    hostnames: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(
        default_factory=list,
        max_length=16,
        description="Host names the route answers (HTTPRoute hostnames); empty: every host of the listener.",
    )
    request_timeout_seconds: int = Field(
        default=300,
        ge=1,
        le=86400,
        description="Longest a request may take end to end through the gateway (HTTPRoute timeouts.request).",
    )


class RoutingSpec(ApiModel):
    """Route requests through the Gateway API Inference Extension: an InferencePool of the runtime pods and
    an endpoint picker; allows autoscaling.minReplicas 0."""

    endpoint_picker: EndpointPickerSpec = Field(
        default_factory=EndpointPickerSpec, description="The endpoint picker deployed for the pool."
    )
    gateway: GatewayRef | None = Field(
        default=None, description="Optional Gateway to attach with an HTTPRoute to the InferencePool."
    )
