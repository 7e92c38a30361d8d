"""spec.cost: what the service's GPUs cost, and the API price that cost is weighed against.

The operator builds nothing from it: kube-state-metrics exports these fields to Prometheus (the
custom-resource-state config in charts/pagoda/files/kube-state-metrics/), where the chart's recording rules
turn them into cost per million generated tokens, and the dashboard and PagodaServingCostsMoreThanApi use
them. Changing a price so rolls no pod.
"""

from __future__ import annotations

from pydantic import Field

from .base import ApiModel

MAX_PRICE = 1_000_000


class CostSpec(ApiModel):
    """Prices for the cost panels and alert (docs/observability.md); both in `currency`."""

    gpu_hour_price: float = Field(
        gt=0,
        le=MAX_PRICE,
        description="What one GPU costs for one hour (e.g. 2.5). A replica costs resources.gpu.count times "
        "this; every running replica counts, busy or idle.",
    )
    api_price_per_million_tokens: float | None = Field(
        default=None,
        gt=0,
        le=MAX_PRICE,
        description="The price of 1M generated (output) tokens on the hosted API this service is weighed "
        "against (e.g. 0.6); without it there is no break-even and no PagodaServingCostsMoreThanApi alert.",
    )
    currency: str = Field(
        default="USD",
        max_length=3,
        pattern=r"^[A-Z]{3}$",
        description="ISO 4217 code of both prices, a label on the cost metrics (e.g. USD, EUR).",
    )
