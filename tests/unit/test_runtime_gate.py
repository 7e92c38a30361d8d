"""The runtime's gate in front of vLLM's app (runtime/serving/server.py): a connection older than
--max-connection-age is closed after its next response; while draining, requests are served with
`Connection: close` until the drain's deadline, then refused with 503; a body over
--max-request-body-bytes gets 413. The inner app here is a plain ASGI app, or a FastAPI app reading the body
(as vLLM's app is), standing in for vLLM's routes (the gate only forwards to it); tier 3 runs the real one."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from pydantic import BaseModel

from pagoda.runtime.serving.server import PagodaApp, RuntimeState
from tests.repo import REPO


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


LIMIT = 100


class Chat(BaseModel):
    model: str


def _body_app() -> FastAPI:
    """Routes that read the whole body before answering, as vLLM's do: one with a pydantic body (FastAPI
    answers 400 itself when the body is cut short), one reading it raw (Starlette raises ClientDisconnect)."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Chat) -> dict[str, str]:
        return {"model": request.model}

    @app.post("/v1/completions")
    async def raw(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    return app


def _post(
    path: str, chunks: list[bytes], content_length: int | None = None
) -> tuple[list[dict[str, Any]], int, RuntimeState]:
    """POSTs the body in `chunks` (chunked unless `content_length` is given) through the gate, with a limit of
    LIMIT bytes; returns what the client got, how many chunks were read, and the state."""
    state = RuntimeState("tiny", max_request_body_bytes=LIMIT)
    state.inner = _body_app()
    sent: list[dict[str, Any]] = []
    pending = list(chunks)

    async def receive() -> dict[str, Any]:
        if not pending:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": pending.pop(0), "more_body": bool(pending)}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    headers = [(b"content-type", b"application/json")]
    if content_length is not None:
        headers.append((b"content-length", str(content_length).encode()))
    scope = {"type": "http", "path": path, "method": "POST", "headers": headers, "query_string": b""}
    asyncio.run(PagodaApp(state)(scope, receive, send))
    return sent, len(chunks) - len(pending), state


def _is_413(sent: list[dict[str, Any]]) -> bool:
    start, body = sent
    error = json.loads(body["body"])["error"]
    assert error["message"] == f"The request body is larger than this server accepts ({LIMIT} bytes)."
    assert (error["code"], error["type"], error["param"]) == (413, "RequestEntityTooLarge", None)
    return bool(start["status"] == 413 and not body.get("more_body"))


def test_a_declared_body_over_the_limit_gets_413_before_any_of_it_is_read() -> None:
    sent, read, state = _post("/v1/chat/completions", [b"x" * (LIMIT + 1)], content_length=LIMIT + 1)
    assert _is_413(sent) and read == 0 and state.in_flight == 0


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_chunked_body_is_cut_as_soon_as_it_passes_the_limit(path: str) -> None:
    """The app's own answer to the body cut short (400, or a 500 and ClientDisconnect) never reaches the
    client, and the chunks after the one that passed the limit are not read."""
    sent, read, state = _post(path, [b" " * 40] * 10)
    assert _is_413(sent)
    assert read == 3  # 40, 80, 120 bytes
    assert state.in_flight == 0


@pytest.mark.parametrize("content_length", [None, LIMIT])
def test_a_body_of_exactly_the_limit_is_served(content_length: int | None) -> None:
    body = json.dumps({"model": "tiny"}).ljust(LIMIT).encode()
    sent, read, _ = _post("/v1/chat/completions", [body[:50], body[50:]], content_length)
    assert sent[0]["status"] == 200 and json.loads(sent[1]["body"]) == {"model": "tiny"}
    assert read == 2


def test_an_app_error_is_not_hidden_when_the_body_was_within_the_limit() -> None:
    state = RuntimeState("tiny", max_request_body_bytes=LIMIT)

    async def broken(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        raise RuntimeError("a bug in the app")

    state.inner = broken

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Any) -> None:
        pass

    scope = {"type": "http", "path": "/v1/completions", "method": "POST", "headers": []}
    with pytest.raises(RuntimeError, match="a bug in the app"):
        asyncio.run(PagodaApp(state)(scope, receive, send))
    assert state.in_flight == 0


def test_the_gate_benchmark_runs_in_small(tmp_path: Path) -> None:
    """`make bench-gate` (benchmarks/gate_cost.py) in small, so that it cannot stop working unseen: the real
    gate and the trivial app behind uvicorn, a round of a few requests each. Its numbers are checked to be
    measured, never compared (this machine is shared)."""
    out = tmp_path / "bench-gate.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "gate_cost.py"), "--json", str(out)]
    argv += ["--rounds", "1", "--requests", "20", "--warmup", "2"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    report = json.loads(out.read_text())
    [measured] = report["rounds"]
    assert all(measured[side][key] > 0 for side in ("gate", "bare") for key in ("first_ms", "total_ms"))
    assert set(report["overhead_first_event_p50_ms"]) == {"median", "min", "max"}
