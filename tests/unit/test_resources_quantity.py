"""Quantities are built in the API server's canonical form, so desired and live compare equal.

Every expected value here was read back from kube-apiserver v1.36 (a Pod's memory limit, server dry run).
"""

from __future__ import annotations

import pytest

from pagoda.operator.resources.quantity import canonical


@pytest.mark.parametrize(
    ("given", "expected"),
    [
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
    ],
)
def test_canonical(given: int | str, expected: str) -> None:
    assert canonical(given) == expected


@pytest.mark.parametrize("bad", ["lots", "1.5.5", "64 Gi", "12X"])
def test_rejects_non_quantities(bad: str) -> None:
    with pytest.raises(ValueError, match="quantity"):
        canonical(bad)
