"""Shared pydantic configuration and small field types for the InferenceService API."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# A Kubernetes resource.Quantity as the API server accepts it (e.g. 500m, 4, 64Gi, 1.5G, 1e3), less the
# negative ones: every quantity of the spec is a size or a request, which a Pod refuses below 0.
_NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
# The exponent has at most two digits: a quantity like 7e99772197 passes the API server's schema check, and
# the Deployment carrying it then kept the API server busy past its request timeout (found by
# tests/integration/test_admission_properties.py).
QUANTITY_PATTERN = rf"^\+?{_NUMBER}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]{{1,2}}))?$"
QUANTITY_MAX_LENGTH = 64
# A DNS-1123 subdomain (Secret, PVC, PriorityClass names).
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# The string form of an int-or-string count or percentage, as Deployment and PDB fields take it: a percentage
# of at most 100.
PERCENT_PATTERN = r"^0*(100|[1-9]?[0-9])%$"


def _check_quantity(value: int | str) -> int | str:
    if isinstance(value, str) and (len(value) > QUANTITY_MAX_LENGTH or not re.match(QUANTITY_PATTERN, value)):
        raise ValueError(f"{value!r} is not a Kubernetes quantity of at least 0 (e.g. 500m, 4, 64Gi)")
    if isinstance(value, int) and value < 0:
        raise ValueError("must not be negative")
    return value


def _check_percent(value: int | str) -> int | str:
    if isinstance(value, str) and not re.match(PERCENT_PATTERN, value):
        raise ValueError(f"{value!r} is neither a count nor a percentage up to 100% (e.g. 1 or 25%)")
    if isinstance(value, int) and value < 0:
        raise ValueError("must not be negative")
    return value


INT_OR_STRING: dict[str, Any] = {"x-kubernetes-int-or-string": True}


def is_zero(value: int | str) -> bool:
    """An IntOrPercent of 0 or 0%."""
    return value == 0 or (isinstance(value, str) and value.rstrip("%").strip("0") == "")


Quantity = Annotated[
    int | str,
    AfterValidator(_check_quantity),
    Field(
        json_schema_extra={
            **INT_OR_STRING,
            "pattern": QUANTITY_PATTERN,
            "maxLength": QUANTITY_MAX_LENGTH,
            "minimum": 0,
        }
    ),
]
IntOrPercent = Annotated[
    int | str,
    AfterValidator(_check_percent),
    Field(json_schema_extra={**INT_OR_STRING, "pattern": PERCENT_PATTERN, "minimum": 0}),
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
