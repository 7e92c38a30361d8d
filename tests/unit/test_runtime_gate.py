"""The runtime's gate in front of vLLM's app (runtime/server.py): a connection older than
--max-connection-age is closed after its next response; while draining, requests are served with
`Connection: close` until the drain's deadline, then refused with 503. The inner app here is a plain ASGI
app standing in for vLLM's routes (the gate only forwards to it); tier 3 runs the real one."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pagoda.runtime.server import PagodaApp, RuntimeState


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"connection", b"keep-alive")]})
    await send({"type": "http.response.body", "body": b"{}"})


def _call(app: PagodaApp, path: str, client: tuple[str, int] = ("10.0.0.1", 40000)) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    asyncio.run(app({"type": "http", "path": path, "method": "POST", "client": client}, receive, send))
    return sent


def _state() -> RuntimeState:
    state = RuntimeState("tiny")
    state.inner = _ok
    return state


def test_before_a_drain_responses_keep_their_connection() -> None:
    start, _ = _call(PagodaApp(_state()), "/v1/completions")
    assert start["status"] == 200 and start["headers"] == [(b"connection", b"keep-alive")]


def test_while_draining_requests_are_served_and_their_connection_closed() -> None:
    state = _state()
    state.status.draining, state.drain_deadline = True, time.monotonic() + 60
    for path in ("/v1/completions", "/readyz", "/metrics"):
        start = _call(PagodaApp(state), path)[0]
        assert [v for k, v in start["headers"] if k == b"connection"] == [b"close"], (path, start)
    assert _call(PagodaApp(state), "/v1/completions")[0]["status"] == 200
    assert state.status.rejected_draining == 0 and state.in_flight == 0


def test_past_the_drain_deadline_requests_get_503_and_are_counted() -> None:
    state = _state()
    state.status.draining, state.drain_deadline = True, time.monotonic() - 1
    start, body = _call(PagodaApp(state), "/v1/completions")
    assert start["status"] == 503
    headers = dict(start["headers"])
    assert headers[b"retry-after"] == b"1" and headers[b"connection"] == b"close"
    assert b"draining" in body["body"]
    assert state.status.rejected_draining == 1


def _closes(start: dict[str, Any]) -> bool:
    return (b"connection", b"close") in start["headers"]


def test_a_connection_older_than_the_max_age_is_closed_after_its_next_response() -> None:
    state = RuntimeState("tiny", max_connection_age=30)
    state.inner = _ok
    app = PagodaApp(state)
    old, new = ("10.0.0.1", 40000), ("10.0.0.2", 40000)
    assert not _closes(_call(app, "/v1/completions", old)[0])
    state.connections.first_seen[old] -= 31  # its first request was 31 s ago
    assert not _closes(_call(app, "/v1/completions", new)[0])
    assert _closes(_call(app, "/v1/completions", old)[0])
    assert old not in state.connections.first_seen  # a new connection on that port starts afresh
    assert not _closes(_call(app, "/v1/completions", old)[0])


def test_max_connection_age_zero_never_closes() -> None:
    state = RuntimeState("tiny", max_connection_age=0)
    state.inner = _ok
    assert not _closes(_call(PagodaApp(state), "/v1/completions")[0])
    assert state.connections.first_seen == {}


def test_forgotten_connections_are_purged() -> None:
    state = RuntimeState("tiny", max_connection_age=30)
    state.inner = _ok
    ages = state.connections
    ages.first_seen[("10.0.0.9", 1)] = time.monotonic() - 1000  # a connection the client closed long ago
    ages.purged -= ages.PURGE_EVERY
    _call(PagodaApp(state), "/v1/completions")
    assert list(ages.first_seen) == [("10.0.0.1", 40000)]
