"""Shared pydantic configuration and small field types for the InferenceService API."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# Kubernetes resource.Quantity, as the API server accepts it (e.g. 500m, 4, 64Gi, 1.5G, 1e3).
_NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY_PATTERN = rf"^(\+|-)?{_NUMBER}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{_NUMBER}))?$"
# A DNS-1123 subdomain (Secret, PVC, PriorityClass names).
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# An int-or-string percentage or count, as Deployment and PDB fields take it.
PERCENT_PATTERN = r"^[0-9]+%$"


def _check_quantity(value: int | str) -> int | str:
    if isinstance(value, str) and not re.match(QUANTITY_PATTERN, value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 4, 64Gi)")
    return value


def _check_percent(value: int | str) -> int | str:
    if isinstance(value, str) and not re.match(PERCENT_PATTERN, value):
        raise ValueError(f"{value!r} is neither a count nor a percentage (e.g. 1 or 25%)")
    if isinstance(value, int) and value < 0:
        raise ValueError("must not be negative")
    return value


INT_OR_STRING: dict[str, Any] = {"x-kubernetes-int-or-string": True}

Quantity = Annotated[
    int | str,
    AfterValidator(_check_quantity),
    Field(json_schema_extra={**INT_OR_STRING, "pattern": QUANTITY_PATTERN}),
]
IntOrPercent = Annotated[
    int | str,
    AfterValidator(_check_percent),
    Field(json_schema_extra={**INT_OR_STRING, "pattern": r"^([0-9]+|[0-9]+%)$"}),
]
ObjectName = Annotated[str, Field(min_length=1, max_length=253, pattern=NAME_PATTERN)]


class ApiModel(BaseModel):
    """Base of every API model: camelCase names on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )
