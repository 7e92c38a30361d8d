"""The outer ASGI app: Pagoda's probes, metrics and capacity, and a gate in front of vLLM's own app.

The HTTP server starts before the engine. Of vLLM's routes only the OpenAI API Pagoda documents is forwarded
(routes.FORWARDED, exact paths); every other path answers 404, and websocket connections are closed. With
an API key (PAGODA_API_KEY) a forwarded request without `Authorization: Bearer <key>` gets 401 here, before
vLLM's app (which checks it again); the probes, /metrics and the capacity read never need it. Until the
engine is ready a forwarded request answers 503 with Retry-After; after that it goes to vLLM's FastAPI app.

A kept-alive client connection older than --max-connection-age is closed after its next response
(`Connection: close`): kube-proxy balances connections, not requests, so without this a client that keeps
its connection would never reach the replicas an autoscaler adds.

A request body larger than --max-request-body-bytes gets 413: at once when its Content-Length says so, else
(a chunked body) as soon as the bytes received pass the limit. The body is counted as vLLM's app reads it,
never held here; vLLM's app is told the client went away, and what it answers to that is dropped.

While draining (after SIGTERM, lifecycle.py), requests are still served, but every response carries
`Connection: close`: a client whose kept-alive connection still leads here (kube-proxy keeps a connection on
the endpoint it was made to, after the endpoint is gone) sends its next request on a new connection, which
reaches a live replica. Only past the drain's deadline are requests refused, with 503 and Retry-After.

The management API (the adapters endpoints, contract.ADAPTERS_PATH) is not vLLM's: it answers only calls
the operator signed (management.py), 401 otherwise, and 403 for every call when the runtime was started
without the operator's public key (--management-public-key-file).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from pagoda import contract
from pagoda.contract import management, payloads
from pagoda.runtime.serving import capacity, metrics, routes
from pagoda.runtime.serving.adapters import AdapterManager
from pagoda.runtime.serving.apierrors import openai_error

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

RETRY_AFTER_LOADING = "5"
RETRY_AFTER_DRAINING = "1"


class ConnectionAges:
    """When each client connection (the peer's address and port, which identify it while it lives) sent its
    first request, to close it once it is older than `max_age` seconds (0: never)."""

    PURGE_EVERY = 60.0

    def __init__(self, max_age: float) -> None:
        self.max_age = max_age
        self.first_seen: dict[tuple[str, int], float] = {}
        self.purged = time.monotonic()

    def expired(self, scope: Scope) -> bool:
        """Whether the connection `scope` arrived on should close after this response (then forgotten)."""
        client = scope.get("client")
        if not self.max_age or not client:
            return False
        key = (str(client[0]), int(client[1]))
        now = time.monotonic()
        self._purge(now)
        if now - self.first_seen.setdefault(key, now) < self.max_age:
            return False
        del self.first_seen[key]
        return True

    def _purge(self, now: float) -> None:
        """Forgets connections the client closed: any entry far older than a connection can stay open idle
        (the server's keep-alive) after its age ran out. A live one forgotten is only seen as new again."""
        if now - self.purged < self.PURGE_EVERY:
            return
        self.purged = now
        horizon = now - self.max_age - 2 * self.PURGE_EVERY
        self.first_seen = {k: t for k, t in self.first_seen.items() if t >= horizon}


class RuntimeState:
    """Shared between the ASGI app, the lifecycle and the metrics collector."""

    def __init__(
        self,
        model_name: str,
        adapters: AdapterManager | None = None,
        max_connection_age: float = 0.0,
        max_request_body_bytes: int | None = None,  # None: no limit
        management_key: str | None = None,  # the operator's public key file; None: no management API
        identity: management.PodIdentity | None = None,  # which pod this is; None: none known (refuse all)
        api_key: str | None = None,  # PAGODA_API_KEY: every forwarded request must carry it; None: open
    ) -> None:
        self.status = metrics.ServerStatus(model_name=model_name)
        self.adapters = adapters
        if adapters is not None and adapters.enabled:
            self.status.adapters = adapters.tracker
        self.inner: ASGIApp | None = None
        self.management: ASGIApp | None = None  # the adapters API, once the engine is loaded
        identity = identity or management.PodIdentity("", frozenset())
        self.verifier = management.Verifier(management_key, identity) if management_key else None
        self.api_key = routes.ApiKey(api_key) if api_key else None
        self.engine: Any = None  # vllm EngineClient once built
        self.engine_registry: Any = None
        self.in_flight = 0
        self.engine_stalled = False  # set by the lifecycle's progress watch; the runtime then exits
        self.last_request = 0.0  # monotonic: when the last request to vLLM's app started or ended
        self.drain_deadline: float | None = None  # monotonic; set with status.draining
        self.connections = ConnectionAges(max_connection_age)
        self.max_request_body_bytes = max_request_body_bytes

    @property
    def engine_dead(self) -> bool:
        """The engine errored or stalled: no request it holds will finish."""
        return self.engine_stalled or (self.engine is not None and bool(self.engine.errored))

    @property
    def engine_problem(self) -> str:
        return "engine stalled" if self.engine_stalled else "engine dead"

    @property
    def ready(self) -> bool:
        return self.inner is not None and not self.status.draining and not self.engine_dead


async def _send_json(
    send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]]
) -> None:
    payload = json.dumps(body).encode()
    base = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": base + headers})
    await send({"type": "http.response.body", "body": payload})


class PagodaApp:
    def __init__(self, state: RuntimeState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
            return
        if kind == "http" and (self.state.status.draining or self.state.connections.expired(scope)):
            send = _closing(send)
        path = scope.get("path", "")
        if kind == "http":
            if path == "/livez":
                await self._livez(send)
                return
            if path == "/readyz":
                await self._readyz(send)
                return
            if path == "/metrics":
                await self._metrics(send)
                return
            if path == capacity.PATH:
                await self._capacity(send)
                return
            if path == contract.ADAPTERS_PATH or path.startswith(contract.ADAPTERS_PATH + "/"):
                await self._management(scope, receive, send)
                return
            await self._gate(scope, receive, send)
        elif kind == "websocket":  # no route Pagoda serves is one: refused before the handshake (403)
            await send({"type": "websocket.close", "code": 1008})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _livez(self, send: Send) -> None:
        if self.state.engine_dead:
            await _send_json(send, 503, {"status": self.state.engine_problem}, [])
        else:
            await _send_json(send, 200, {"status": "alive"}, [])

    async def _readyz(self, send: Send) -> None:
        state = self.state
        if state.ready:
            await _send_json(send, 200, {"status": "ready"}, [])
            return
        reason = (
            "draining"
            if state.status.draining
            else state.engine_problem
            if state.engine_dead
            else "model loading"
        )
        await _send_json(send, 503, {"status": reason}, [])

    async def _metrics(self, send: Send) -> None:
        state = self.state
        state.status.ready = state.ready
        body = metrics.render(state.status, state.engine_registry)
        headers = [
            (b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _capacity(self, send: Send) -> None:
        """The KV cache's capacity, the start-up phases (startup.py) and the model cache's contents
        (modelcache.py) as JSON: 503 until the engine is loaded; the capacity is then fixed for the pod's
        life."""
        kv = self.state.status.kv_cache
        if kv is None:
            loading = openai_error(
                "The model is loading; its KV-cache capacity is not known yet.", 503, "ServiceUnavailable"
            )
            await _send_json(send, 503, loading, [(b"retry-after", RETRY_AFTER_LOADING.encode())])
            return
        clock, cache = self.state.status.startup, self.state.status.model_cache
        body = kv.payload(
            clock.payload() if clock is not None and clock.ready_at is not None else None,
            payloads.ModelCacheReport.model_validate(cache.report()) if cache is not None else None,
        )
        await _send_json(send, 200, body.wire(), [])

    async def _management(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A management call: its body read (it is small), its signature checked, then the adapters API."""
        verifier = self.state.verifier
        if verifier is None:
            message = "The management API is off: the runtime started without --management-public-key-file."
            await _send_json(send, 403, openai_error(message, 403, "Forbidden"), [])
            return
        body = await _read_body(receive, management.MAX_BODY)
        if body is None:
            await _send_json(send, 413, _too_large(management.MAX_BODY), [])
            return
        headers = {k.lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        query = scope.get("query_string") or b""
        target = scope.get("path", "") + (f"?{query.decode()}" if query else "")
        try:
            host, authorization = headers.get(b"host", ""), headers.get(b"authorization")
            verifier.check(scope["method"], host, target, body, authorization)
        except management.Unauthorized as exc:
            challenge = [(b"www-authenticate", management.SCHEME.encode())]
            await _send_json(send, 401, openai_error(f"Unauthorized: {exc}", 401, "Unauthorized"), challenge)
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()  # the client's disconnect, when it goes
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self._forward(scope, replay, send, management=True)

    async def _gate(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's app sees only the allow-listed paths (routes.py), with a key only requests carrying it."""
        if not routes.forwarded(scope):
            body = openai_error(routes.not_found_message(scope), 404, "NotFound")
            await _send_json(send, 404, body, [])
            return
        key = self.state.api_key
        if key is not None and not key.accepts(scope.get("headers") or []):
            message = "Unauthorized: this server requires `Authorization: Bearer <key>` (its API key)."
            challenge = [(b"www-authenticate", b"Bearer")]
            await _send_json(send, 401, openai_error(message, 401, "Unauthorized"), challenge)
            return
        methods = routes.allowed_methods(scope["path"])
        if scope.get("method") not in methods:
            allow = ", ".join(sorted(methods))
            message = f"{scope.get('method')} is not allowed on {scope['path']}: use {allow}."
            body = openai_error(message, 405, "MethodNotAllowed")
            await _send_json(send, 405, body, [(b"allow", allow.encode())])
            return
        await self._forward(scope, receive, send)

    async def _forward(self, scope: Scope, receive: Receive, send: Send, management: bool = False) -> None:
        """To vLLM's app, or to the management API's."""
        state = self.state
        deadline = state.drain_deadline  # set when the drain begins
        if deadline is not None and time.monotonic() >= deadline:
            state.status.rejected_draining += 1
            if scope["type"] == "http":
                body = openai_error(
                    "The server is draining; retry on another replica.", 503, "ServiceUnavailable"
                )
                await _send_json(send, 503, body, [(b"retry-after", RETRY_AFTER_DRAINING.encode())])
            return
        inner = state.management if management else state.inner
        if inner is None:
            if scope["type"] == "http":
                body = openai_error("The model is loading; retry shortly.", 503, "ServiceUnavailable")
                await _send_json(send, 503, body, [(b"retry-after", RETRY_AFTER_LOADING.encode())])
            return
        body_limit = None
        limit = state.max_request_body_bytes
        if scope["type"] == "http" and limit is not None:
            declared = _content_length(scope)
            if declared is not None and declared > limit:
                await _send_json(send, 413, _too_large(limit), [])
                return
            body_limit = BodyLimit(limit, receive, send)
            receive, send = body_limit.receive, body_limit.send
        state.in_flight += 1
        state.last_request = time.monotonic()
        try:
            await inner(scope, receive, send)
        except Exception:
            # vLLM's app may fail on the body cut short; the client already has its 413.
            if body_limit is None or not body_limit.answered:
                raise
        finally:
            state.in_flight -= 1
            state.last_request = time.monotonic()


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None when it passes `limit` bytes."""
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        more = bool(message.get("more_body"))
    return b"".join(chunks)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers") or []:
        if name.lower() == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def _too_large(limit: int) -> dict[str, Any]:
    return openai_error(
        f"The request body is larger than this server accepts ({limit} bytes).", 413, "RequestEntityTooLarge"
    )


class BodyLimit:
    """`receive` and `send` for one request whose body may not pass `limit` bytes. Past it, the client gets
    413 (unless the app's response has begun) and the app sees the client disconnect, so it stops reading;
    what the app sends after that is dropped. The connection is left open: the server (uvicorn) discards the
    rest of the body as it arrives, and a client still sending it reads the 413 once it is done (closing the
    connection with the body unread would make the kernel reset it, and the client would see no answer)."""

    def __init__(self, limit: int, receive: Receive, send: Send) -> None:
        self.limit, self._receive, self._send = limit, receive, send
        self.received = 0
        self.cut = False  # the body passed the limit
        self.started = False  # the app's response has begun
        self.answered = False  # the client got the 413

    async def receive(self) -> Message:
        if self.cut:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                self.cut = True
                if not self.started:
                    self.answered = True
                    await _send_json(self._send, 413, _too_large(self.limit), [])
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if self.answered:
            return
        self.started = self.started or message["type"] == "http.response.start"
        await self._send(message)


def _closing(send: Send) -> Send:
    """`send` with `Connection: close` added to the response's headers: the server closes the connection
    after this response (uvicorn honours the header), and the client opens a new one for its next request."""

    async def closing_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers") or [] if k.lower() != b"connection"]
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)

    return closing_send
