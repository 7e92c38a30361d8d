"""Errors in the OpenAI API's shape, for the runtime's own answers (its gate's 503s, the adapters API)."""

from __future__ import annotations

from typing import Any


def openai_error(message: str, status: int, kind: str) -> dict[str, Any]:
    """The body the OpenAI API (and vLLM) answers an error with."""
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}
