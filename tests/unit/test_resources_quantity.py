"""Quantities are built in the API server's canonical form, so desired and live compare equal.

Every expected value here is what kube-apiserver returns for a Pod's memory limit (server dry run);
tests/integration/test_quantities.py checks the table against the API server the integration tier runs.
"""

from __future__ import annotations

import pytest

from pagoda.operator.resources.quantity import canonical

# (what is sent, what the API server returns)
CANONICAL: list[tuple[int | str, str]] = [
    (8, "8"),
    ("8000m", "8"),
    ("0.5", "500m"),
    ("1500m", "1500m"),
    ("1.5Gi", "1536Mi"),
    ("64Gi", "64Gi"),
    ("1024Mi", "1Gi"),
    ("1000Mi", "1000Mi"),
    ("2000", "2k"),
    ("1500", "1500"),
    ("1.5k", "1500"),
    ("1e3", "1e3"),
    ("512", "512"),
    ("1024", "1024"),
    ("100Gi", "100Gi"),
    ("0", "0"),
    ("0.1Gi", "107374182400m"),
    ("1E6", "1E6"),
    ("+1", "+1"),
    ("03Gi", "03Gi"),
    ("1.50", "1500m"),
    ("5.000", "5"),
    ("1500k", "1500k"),
    ("0.25Gi", "256Mi"),
    ("1e-3", "1e-3"),
    ("1.G", "1.G"),
]
NOT_QUANTITIES = ["lots", "1.5.5", "64 Gi", "12X"]


@pytest.mark.parametrize(("given", "expected"), CANONICAL)
def test_canonical(given: int | str, expected: str) -> None:
    assert canonical(given) == expected


@pytest.mark.parametrize("bad", NOT_QUANTITIES)
def test_rejects_non_quantities(bad: str) -> None:
    with pytest.raises(ValueError, match="quantity"):
        canonical(bad)
