"""spec.routing: requests routed by the Gateway API Inference Extension (GIE), not a round-robin Service.

The operator then makes, per InferenceService, an InferencePool of its runtime pods and the endpoint picker
that serves it (GIE v1.5.0's `epp`, as GIE's own chart deploys it per pool): an Envoy-based gateway asks the
picker, per request, which pod to use (prefix-cache affinity, queue depth, KV-cache usage), and the picker's
flow control holds requests while no replica can take them, which is what makes scaling from zero safe.
See docs/routing.md.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field

from .base import ApiModel, ObjectName, Quantity
from .network import NamespaceName

PICKER_VERSION = "v1.5.0"
DEFAULT_PICKER_IMAGE = f"registry.k8s.io/gateway-api-inference-extension/epp:{PICKER_VERSION}"
# The waiting room: how long the picker holds a request while no replica can take it (GIE's flow-control
# defaultRequestTTL). Unless the spec sets it, the longer of the default and WAITING_ROOM_MARGIN times the
# service's typical cold start (status.startup.typical), in whole minutes: a start that takes long gets a
# waiting room to match, and a picker config that moves only when the cold start moves by a minute (a change
# restarts the picker).
DEFAULT_QUEUE_TIMEOUT_SECONDS = 300
MAX_QUEUE_TIMEOUT_SECONDS = 3600
WAITING_ROOM_MARGIN = 2
# What the gateway route allows a request after its wait, unless routing.gateway.requestTimeoutSeconds says.
RESPONSE_ALLOWANCE_SECONDS = 300
# A leader and a standby: a picker that stops (a rollout, a drain, a crash) hands over within seconds.
DEFAULT_PICKER_REPLICAS = 2
MAX_PICKER_REPLICAS = 5


class EndpointPickerSpec(ApiModel):
    """The endpoint picker (GIE's `epp`) the operator deploys for this service's InferencePool."""

    image: str = Field(
        default=DEFAULT_PICKER_IMAGE,
        min_length=1,
        max_length=512,
        description=f"The picker's image (GIE {PICKER_VERSION}, the version Pagoda is tested with).",
    )
    queue_timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_QUEUE_TIMEOUT_SECONDS,
        description="Longest a request waits in the picker's flow-control queue for a replica (also while "
        "the first replica of a service scaled to zero starts) before the client gets 503. Unset: "
        f"{WAITING_ROOM_MARGIN} times the typical cold start this service measured "
        f"(status.startup.typical.seconds) in whole minutes, at least {DEFAULT_QUEUE_TIMEOUT_SECONDS} and at "
        f"most {MAX_QUEUE_TIMEOUT_SECONDS}.",
    )
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        default="FailClose",
        description="What the gateway does when the picker does not answer: FailClose refuses the request "
        "(nothing can hold it while no replica runs), FailOpen sends it to any pod of the pool.",
    )
    replicas: int = Field(
        default=DEFAULT_PICKER_REPLICAS,
        ge=1,
        le=MAX_PICKER_REPLICAS,
        description="Picker replicas. More than one elect a leader on a Lease (GIE's high-availability "
        "mode): only the leader is Ready and picks, the others wait with the picker started and take over "
        "within seconds when it stops (docs/routing.md). 1: no standby, and the picker's restart stops "
        "routing until it is back.",
    )
    cpu: Quantity = Field(default="1", description="CPU request of each picker replica.")
    memory: Quantity = Field(default="1Gi", description="Memory request and limit of each picker replica.")


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
    request_timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=86400,
        description="Longest a request may take end to end through the gateway (HTTPRoute timeouts.request). "
        f"Unset: the picker's waiting room (endpointPicker.queueTimeoutSeconds) plus "
        f"{RESPONSE_ALLOWANCE_SECONDS}, so that a request held while a replica starts is not cut.",
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


def waiting_room_seconds(queue_timeout_seconds: int | None, typical_start: float | None) -> int:
    """How long the picker holds a request while no replica can take it: spec.routing.endpointPicker.
    queueTimeoutSeconds when set, else WAITING_ROOM_MARGIN times the typical cold start (seconds, from
    status.startup) rounded up to whole minutes, within [DEFAULT_QUEUE_TIMEOUT_SECONDS,
    MAX_QUEUE_TIMEOUT_SECONDS]; the default before any start was measured."""
    if queue_timeout_seconds is not None:
        return queue_timeout_seconds
    if typical_start is None:
        return DEFAULT_QUEUE_TIMEOUT_SECONDS
    measured = math.ceil(WAITING_ROOM_MARGIN * typical_start / 60) * 60
    return min(MAX_QUEUE_TIMEOUT_SECONDS, max(DEFAULT_QUEUE_TIMEOUT_SECONDS, measured))
