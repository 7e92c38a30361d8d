"""Which requests the gate (server.py) forwards to vLLM's app, and the API key they must carry.

vLLM's app serves far more than the OpenAI API Pagoda documents: SageMaker's POST /invocations (chat and
completions), /tokenize, /pooling, /score, /rerank, /scale_elastic_ep, /health, /version, /load, FastAPI's
/docs and /openapi.json, and with VLLM_SERVER_DEV_MODE or VLLM_ALLOW_RUNTIME_LORA_UPDATING its development and
adapter routes; its own --api-key check covers only paths under /v1, /v2, /inference and /cohere. So the gate
forwards only an allow-list (FORWARDED: exact paths, each with its methods) and answers 404 to every other
path, with a key or without; a forwarded request must carry `Authorization: Bearer <key>` when the runtime
has a key (PAGODA_API_KEY), checked here before vLLM's app sees it (and vLLM checks it again).

Paths are compared exactly, as the ASGI server decoded them (`scope["path"]`: percent-decoded, dot segments
and slashes left as sent), and only when the bytes on the wire (`scope["raw_path"]`) are that same path: a
trailing slash, `//v1/models`, `/v1/../invocations` or a percent-encoded `/v1/%63ompletions` is not on the
list. The query string is not part of the path. Websocket connections are never forwarded (no documented
route is one). The runtime's own paths (probes, /metrics, contract.CAPACITY_PATH, contract.ADAPTERS_PATH)
are answered before the gate looks here and take no key.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, MutableMapping
from typing import Any

from pagoda import contract

Scope = MutableMapping[str, Any]

# vLLM's routes that Pagoda documents (docs/runtime.md#http-one-port-8000-by-default), with their methods.
# OPTIONS is a CORS preflight (vLLM's CORS middleware answers it); it needs the key like the rest.
FORWARDED: dict[str, frozenset[str]] = {
    path: frozenset({*methods, "OPTIONS"}) for path, methods in contract.INFERENCE_API.items()
}
MAX_NAMED_PATH = 200  # characters of an unknown path an error message repeats


def forwarded(scope: Scope) -> bool:
    """Whether this HTTP request's path is one vLLM's app may see: on the list, and sent as written there."""
    path = scope.get("path", "")
    if scope.get("type") != "http" or path not in FORWARDED:
        return False
    raw = scope.get("raw_path")
    return raw is None or bytes(raw) == path.encode("ascii")


def allowed_methods(path: str) -> frozenset[str]:
    return FORWARDED.get(path, frozenset())


def not_found_message(scope: Scope) -> str:
    path = str(scope.get("path", ""))
    shown = path if len(path) <= MAX_NAMED_PATH else path[:MAX_NAMED_PATH] + "..."
    return f"{shown} is not served here: the runtime serves {', '.join(sorted(FORWARDED))}."


class ApiKey:
    """The key of PAGODA_API_KEY, checked as vLLM checks --api-key (`Authorization: Bearer <key>`, the scheme
    in any case), in constant time: the SHA-256 of the two are compared, so neither length shows."""

    def __init__(self, key: str) -> None:
        if not key:
            raise ValueError("an empty API key")
        self._digest = hashlib.sha256(key.encode("utf-8")).digest()

    def accepts(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        values = [value for name, value in headers if name.lower() == b"authorization"]
        if len(values) != 1:  # none, or several (which one would a proxy or vLLM read?)
            return False
        # Starlette (vLLM's app) reads a header as latin-1 and hashes the key as UTF-8: the same here, so the
        # two checks agree on every key.
        scheme, _, token = values[0].decode("latin-1").partition(" ")
        digest = hashlib.sha256(token.encode("utf-8")).digest()
        return hmac.compare_digest(digest, self._digest) and scheme.lower() == "bearer"


def app_routes(app: Any) -> list[tuple[str, str]]:
    """(method, path) of every route of a Starlette or FastAPI app (vLLM's): WEBSOCKET for a websocket route,
    * for a mounted app (any method, any path under it)."""
    found = set()
    for route in getattr(app, "routes", []):
        path = str(getattr(route, "path", ""))
        methods = getattr(route, "methods", None)
        if methods:
            found |= {(str(method), path) for method in methods}
        elif type(route).__name__.endswith("WebSocketRoute"):
            found.add(("WEBSOCKET", path))
        else:
            found.add(("*", path))
    return sorted(found, key=lambda route: (route[1], route[0]))


def not_forwarded(app: Any) -> list[tuple[str, str]]:
    """The routes of vLLM's `app` that no request reaches through the gate."""
    return [(m, p) for m, p in app_routes(app) if m not in allowed_methods(p)]
