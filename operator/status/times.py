"""Times as the Kubernetes API writes them (RFC 3339 in UTC, `2026-12-02T14:00:00Z`): the one parser and
formatter of the reconcile."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_now() -> str:
    return rfc3339(datetime.now(UTC))


def parse_time(text: Any) -> datetime | None:
    """An RFC 3339 timestamp (Z or an offset; naive means UTC), None when it is not one (or not a string)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
