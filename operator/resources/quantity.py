"""Kubernetes quantities in the API server's canonical form (e.g. 8000m -> 8, 1.5Gi -> 1536Mi).

The API server stores quantities canonicalised; building them the same way keeps the desired manifest equal
to what reads back, so comparing the two finds no spurious difference.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {exponent: suffix for suffix, exponent in _DECIMAL.items()}
_SPLIT = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(.*)$")


def _parse(text: int | str) -> tuple[Decimal, str]:
    """The value and the format (binary, decimal or exponent) of a quantity: what canonical() needs, and
    kubernetes.utils.parse_quantity (which the rest of the code uses to read quantities) does not give."""
    match = _SPLIT.match(str(text).strip())
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    number, suffix = Decimal(match.group(1)), match.group(2)
    if suffix in _BINARY:
        return number * (Decimal(1024) ** _BINARY[suffix]), "binary"
    if suffix in _DECIMAL:
        return number * (Decimal(10) ** _DECIMAL[suffix]), "decimal"
    exponent = re.fullmatch(r"[eE]([+-]?[0-9]+)", suffix)
    if exponent:
        return number * (Decimal(10) ** int(exponent.group(1))), "exponent"
    raise ValueError(f"{text!r} has an unknown quantity suffix {suffix!r}")


def canonical(text: int | str) -> str:
    """The string the API server would return for this quantity."""
    if _kept_as_written(str(text).strip()):
        return str(text).strip()
    value, fmt = _parse(text)
    # Precision below 1n is rounded up, as the API server does.
    value = (value * Decimal(10) ** 9).to_integral_value(rounding=ROUND_CEILING) / Decimal(10) ** 9
    if fmt == "binary" and abs(value) >= 1024 and value == value.to_integral_value():
        return _binary(int(value))
    return _decimal(value, "exponent" if fmt == "exponent" else "decimal")


def _kept_as_written(text: str) -> bool:
    """The API server keeps a quantity's own spelling when it parses exactly and is already in normal form
    (apimachinery's ParseQuantity fast path): e.g. `1E6`, `3Gi`, `1500`, but not `2000` or `64Gi`."""
    match = re.fullmatch(r"[+-]?0*([0-9]*)(?:\.([0-9]*))?(.*)", text)
    if text == "0" or match is None:
        return text == "0"
    num, denom, suffix = match.group(1) or "0", match.group(2) or "", match.group(3)
    if suffix in _BINARY:
        exponent = 10 * _BINARY[suffix]
        precision = 15 - len(num) - int(exponent * 3 / 10) - 1
        return not denom and precision >= 0 and int(num) & 0x07 != 0
    if suffix in _DECIMAL:
        exponent = _DECIMAL[suffix]
    elif re.fullmatch(r"[eE][+-]?[0-9]+", suffix):
        exponent = int(suffix[1:])
    else:
        return False
    scale, shifted = exponent - len(denom), num + denom
    if len(num) + len(denom) > 18 or scale < -9:
        return False
    return scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0"


def _binary(value: int) -> str:
    sign, magnitude, power = ("-" if value < 0 else ""), abs(value), 0
    while magnitude % 1024 == 0 and power < 6:
        magnitude //= 1024
        power += 1
    suffix = next((name for name, exp in _BINARY.items() if exp == power), "")
    return f"{sign}{magnitude}{suffix}"


def _decimal(value: Decimal, fmt: str) -> str:
    if value == 0:
        return "0"
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):  # NaN or infinity: parse() never produces them
        raise ValueError(f"{value} is not a finite quantity")
    mantissa = int("".join(map(str, digits)))
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    extra = exponent % 3
    mantissa, exponent = mantissa * 10**extra, exponent - extra
    prefix = "-" if sign else ""
    if fmt == "exponent":
        return f"{prefix}{mantissa}" + (f"e{exponent}" if exponent else "")
    if exponent > 18:
        mantissa, exponent = mantissa * 10 ** (exponent - 18), 18
    return f"{prefix}{mantissa}{_DECIMAL_SUFFIX[exponent]}"
