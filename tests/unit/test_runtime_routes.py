"""The gate (runtime/serving/server.py, runtime/serving/routes.py) forwards to vLLM's app only the OpenAI API
Pagoda documents, and with an API key only requests that carry it: every other route of vLLM's app
(SageMaker's /invocations, /tokenize, /pooling, /scale_elastic_ep, the development routes, ...) answers 404
and never reaches vLLM.

The inner app here is a fake standing in for vLLM's (it records what reaches it); the routes it is called with
are the real ones of the installed vLLM: its app built without an engine, every task and switch on, in a
subprocess (its environment and logging stay out of this one), together with every path its sources
register a route on. Tier 3 calls the live app's routes through the real runtime
(tests/runtime/test_rt_lifecycle.py::test_api_key_and_engine_death_exit_nonzero).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, WebSocket

from pagoda import contract
from pagoda.runtime.serving import routes
from pagoda.runtime.serving.server import PagodaApp, RuntimeState

KEY = "s3cret-key"
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")

# vLLM's app with every route it can register: all tasks (a pooling model for the pooling routes), the
# development and runtime-LoRA routes, fault tolerance. No engine: build_app only registers routes.
BUILD_VLLM_APP = """
import json, os, types, typing
os.environ["VLLM_SERVER_DEV_MODE"] = "1"
os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
from vllm.entrypoints.launchers.app import build_app
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.tasks import SupportedTask
from vllm.utils.argparse_utils import FlexibleArgumentParser
from pagoda.runtime.serving.routes import app_routes
args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "unused"])
args.enable_fault_tolerance = True
pooling = types.SimpleNamespace(
    get_pooling_task=lambda tasks: "embed", hf_config=types.SimpleNamespace(num_labels=1)
)
app = build_app(args, tuple(typing.get_args(SupportedTask)), pooling)
print("ROUTES=" + json.dumps(app_routes(app)))
"""
# A route registered in vLLM's sources: a decorator or add_api_route with a literal path.
ROUTE_SOURCE = re.compile(
    r"""(?:@\w+\.(?:get|post|put|delete|patch|api_route|websocket)|\.add_api_(?:websocket_)?route)\(\s*"(/[^"]*)\""""
)


class FakeVllm:
    """Stands for vLLM's app: answers 200 and records every request that reaches it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.seen.append((scope.get("method", scope["type"]), scope["path"]))
        if scope["type"] == "websocket":
            await send({"type": "websocket.accept"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def _gate(key: str | None = KEY) -> tuple[PagodaApp, FakeVllm]:
    state = RuntimeState("tiny", api_key=key)
    state.inner = fake = FakeVllm()
    return PagodaApp(state), fake


def _call(
    app: PagodaApp,
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    raw_path: bytes | None = None,
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One request through the gate, as uvicorn hands it over; (status, headers, body)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode() if raw_path is None else raw_path,
        "query_string": b"",
        "headers": headers or [],
        "client": ("10.0.0.1", 40000),
    }
    asyncio.run(app(scope, receive, send))
    start = sent[0]
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def _bearer(key: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {key}".encode())]


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "x", path)


# The runtime's own paths, answered by the gate itself (vLLM's app has a /metrics and a /readyz of its own,
# which no request reaches).
OWN_PATHS = {"/livez", "/readyz", "/metrics", contract.CAPACITY_PATH}


def _vllms(vllm_routes: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(m, p) for m, p in vllm_routes if p not in OWN_PATHS and not p.startswith(contract.ADAPTERS_PATH)]


@pytest.fixture(scope="module")
def vllm_routes() -> list[tuple[str, str]]:
    """(method, path) of every route of the installed vLLM's app, `*` for a path from its sources only."""
    vllm = pytest.importorskip("vllm")
    built = subprocess.run(
        [sys.executable, "-c", BUILD_VLLM_APP], capture_output=True, text=True, timeout=300, check=False
    )
    lines = [line for line in built.stdout.splitlines() if line.startswith("ROUTES=")]
    assert built.returncode == 0 and lines, built.stderr[-3000:]
    found = {(method, path) for method, path in json.loads(lines[-1].removeprefix("ROUTES="))}
    package = Path(vllm.__file__).parent / "entrypoints"
    for source in package.rglob("*.py"):
        found |= {("*", path) for path in ROUTE_SOURCE.findall(source.read_text(errors="replace"))}
    return sorted(found)


def test_the_enumeration_sees_vllms_unguarded_routes(vllm_routes: list[tuple[str, str]]) -> None:
    paths = {path for _, path in vllm_routes}
    assert len(paths) > 60, paths
    for path in ("/invocations", "/tokenize", "/pooling", "/scale_elastic_ep", "/collective_rpc", "/docs"):
        assert path in paths
    assert ("POST", "/v1/load_lora_adapter") in vllm_routes and ("WEBSOCKET", "/v1/realtime") in vllm_routes


def test_the_allow_list_names_routes_vllm_serves(vllm_routes: list[tuple[str, str]]) -> None:
    """A vLLM upgrade that moves one of the documented routes fails here (OPTIONS is CORS', answered by
    vLLM's middleware)."""
    for path, methods in routes.FORWARDED.items():
        for method in methods - {"OPTIONS"}:
            assert (method, path) in vllm_routes


def test_no_vllm_route_reaches_vllm_without_the_key(vllm_routes: list[tuple[str, str]]) -> None:
    app, fake = _gate()
    for _, path in _vllms(vllm_routes):
        for method in METHODS:
            status, headers, body = _call(app, method, _concrete(path))
            expected = 401 if path in routes.FORWARDED else 404
            assert status == expected, (method, path, status, body)
            if status == 401:
                assert headers[b"www-authenticate"] == b"Bearer"
    assert fake.seen == []


def test_with_the_key_only_the_allow_list_reaches_vllm(vllm_routes: list[tuple[str, str]]) -> None:
    app, fake = _gate()
    for _, path in _vllms(vllm_routes):
        for method in METHODS:
            fake.seen.clear()
            status, _, body = _call(app, method, _concrete(path), _bearer(KEY))
            forwarded = method in routes.FORWARDED.get(path, ())
            assert (status == 200) == forwarded and bool(fake.seen) == forwarded, (method, path, status, body)
            if not forwarded:
                assert status == (405 if path in routes.FORWARDED else 404), (method, path, status)


def test_without_a_key_the_allow_list_is_open_and_the_rest_404(vllm_routes: list[tuple[str, str]]) -> None:
    app, fake = _gate(key=None)
    for method, path in _vllms(vllm_routes):
        method = "POST" if method in ("*", "WEBSOCKET") else method
        fake.seen.clear()
        status, _, _ = _call(app, method, _concrete(path))
        if method in routes.FORWARDED.get(path, ()):
            assert status == 200 and fake.seen == [(method, path)]
        else:
            assert status in (404, 405) and fake.seen == [], (method, path, status)


def test_a_refused_path_gets_an_openai_error_naming_it() -> None:
    status, headers, body = _call(_gate()[0], "POST", "/invocations", _bearer(KEY))
    error = json.loads(body)["error"]
    assert status == 404 and headers[b"content-type"] == b"application/json"
    assert (error["type"], error["code"], error["param"]) == ("NotFound", 404, None)
    assert (
        error["message"].startswith("/invocations is not served here")
        and "/v1/chat/completions" in error["message"]
    )
    status, _, body = _call(_gate()[0], "GET", "/" + "a" * 5000)
    assert status == 404 and len(body) < 600


@pytest.mark.parametrize(
    ("path", "raw_path"),
    [
        ("/v1/models/", None),
        ("//v1/models", None),
        ("/v1//models", None),
        ("/V1/models", None),
        ("/v1/models/x", None),
        ("/v1/../invocations", None),
        ("/v1/models/../../invocations", None),
        ("/v1/chat/completions/../../../invocations", None),
        ("/v1/chat/completions;x", None),
        ("/v1/chat/completions/batch", None),
        ("/v1/chat/completions/render", None),
        ("/v1/models ", None),
        ("/v1/models\x00", None),
        ("v1/models", None),
        ("", None),
        ("/v1/models", b"/v1/%6dodels"),  # uvicorn decodes; the bytes on the wire were not the path
        ("/v1/chat/completions", b"/v1/chat%2Fcompletions"),
        ("/v1/models", b"/v1/models/"),
    ],
)
def test_path_tricks_are_refused_with_the_key(path: str, raw_path: bytes | None) -> None:
    app, fake = _gate()
    for method in ("GET", "POST"):
        status, _, _ = _call(app, method, path, _bearer(KEY), raw_path=raw_path)
        assert status == 404, (method, path, raw_path, status)
    assert fake.seen == []


@pytest.mark.parametrize(
    "headers",
    [
        [],
        _bearer("wrong"),
        _bearer(KEY + "x"),
        _bearer(KEY[:-1]),
        _bearer(""),
        [(b"authorization", f"Basic {KEY}".encode())],
        [(b"authorization", f"Bearer  {KEY}".encode())],
        [(b"authorization", KEY.encode())],
        [(b"x-api-key", KEY.encode())],
        [*_bearer(KEY), *_bearer("wrong")],  # two headers: which would a proxy or vLLM read?
        [*_bearer(KEY), *_bearer(KEY)],
    ],
)
def test_a_forwarded_path_without_the_key_gets_401(headers: list[tuple[bytes, bytes]]) -> None:
    app, fake = _gate()
    status, response_headers, body = _call(app, "POST", "/v1/chat/completions", headers)
    error = json.loads(body)["error"]
    assert status == 401 and response_headers[b"www-authenticate"] == b"Bearer"
    assert (error["type"], error["code"]) == ("Unauthorized", 401) and KEY not in error["message"]
    assert fake.seen == []


@pytest.mark.parametrize(
    "value", [f"Bearer {KEY}", f"bearer {KEY}", f"BEARER {KEY}"], ids=["Bearer", "bearer", "BEARER"]
)
def test_the_key_is_accepted_as_vllm_accepts_it(value: str) -> None:
    app, fake = _gate()
    assert _call(app, "GET", "/v1/models", [(b"Authorization", value.encode())])[0] == 200
    assert fake.seen == [("GET", "/v1/models")]


def test_a_non_ascii_key_is_compared_as_vllm_compares_it() -> None:
    """Starlette reads a header as latin-1 and vLLM hashes the key as UTF-8: a client sends the key's
    latin-1 bytes (what an HTTP client writes for a str header)."""
    app, fake = _gate(key="clé")
    assert _call(app, "GET", "/v1/models", [(b"authorization", "Bearer clé".encode("latin-1"))])[0] == 200
    assert _call(app, "GET", "/v1/models", [(b"authorization", b"Bearer cle")])[0] == 401
    assert len(fake.seen) == 1


def test_the_methods_of_an_allowed_path_are_its_own() -> None:
    app, fake = _gate()
    status, headers, _ = _call(app, "DELETE", "/v1/models", _bearer(KEY))
    assert status == 405 and headers[b"allow"] == b"GET, OPTIONS"
    assert _call(app, "HEAD", "/v1/models", _bearer(KEY))[0] == 405
    assert _call(app, "GET", "/v1/chat/completions", _bearer(KEY))[0] == 405
    assert fake.seen == []
    # A CORS preflight reaches vLLM's CORS middleware, with the key like every forwarded request.
    assert _call(app, "OPTIONS", "/v1/chat/completions")[0] == 401
    assert _call(app, "OPTIONS", "/v1/chat/completions", _bearer(KEY))[0] == 200
    assert fake.seen == [("OPTIONS", "/v1/chat/completions")]


def test_the_runtimes_own_paths_need_no_key() -> None:
    """The kubelet's probes, Prometheus and the operator's capacity read carry no key; the management API
    has its own signature (test_runtime_management.py)."""
    app, fake = _gate()
    assert _call(app, "GET", "/livez")[0] == 200
    assert _call(app, "GET", "/readyz")[0] == 200
    assert _call(app, "GET", "/metrics")[0] == 200
    assert _call(app, "GET", contract.CAPACITY_PATH)[0] == 503  # loading: no KV-cache numbers yet
    assert _call(app, "GET", contract.ADAPTERS_PATH)[0] == 403  # no --management-public-key-file
    assert fake.seen == []


def test_a_query_string_does_not_change_the_path() -> None:
    app, fake = _gate()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/invocations",
        "raw_path": b"/invocations",
        "query_string": b"path=/v1/chat/completions",
        "headers": _bearer(KEY),
    }
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 404 and fake.seen == []


@pytest.mark.parametrize("key", [KEY, None])
def test_websockets_are_never_forwarded(key: str | None) -> None:
    app, fake = _gate(key)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    scope = {"type": "websocket", "path": "/v1/realtime", "raw_path": b"/v1/realtime", "headers": []}
    asyncio.run(app(scope, receive, send))
    assert [m["type"] for m in sent] == ["websocket.close"] and fake.seen == []


def test_app_routes_lists_every_route_of_an_app() -> None:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> None: ...

    @app.get("/invocations")
    async def invocations() -> None: ...

    @app.websocket("/v1/realtime")
    async def realtime(websocket: WebSocket) -> None: ...

    app.mount("/static", FastAPI())
    listed = routes.app_routes(app)
    assert ("POST", "/v1/chat/completions") in listed and ("GET", "/invocations") in listed
    assert ("WEBSOCKET", "/v1/realtime") in listed and ("*", "/static") in listed
    assert ("POST", "/v1/chat/completions") not in routes.not_forwarded(app)
    assert ("GET", "/invocations") in routes.not_forwarded(app)


# Requests as clients write them on the wire, through a real uvicorn (both of its HTTP parsers): the
# decoding of the path is uvicorn's, not this test's.
WIRE_TRICKS = [
    b"POST /invocations HTTP/1.1",
    b"POST /v1/../invocations HTTP/1.1",
    b"POST /v1/chat/completions/../../invocations HTTP/1.1",
    b"POST //invocations HTTP/1.1",
    b"POST /%69nvocations HTTP/1.1",
    b"POST /v1/%2e%2e/invocations HTTP/1.1",
    b"POST /v1/chat%2Fcompletions HTTP/1.1",
    b"POST /v1/chat/completions/ HTTP/1.1",
    b"POST /v1/chat/completions%00 HTTP/1.1",
    b"POST /v1/%63hat/completions HTTP/1.1",
    b"POST /invocations?/v1/chat/completions HTTP/1.1",
    b"POST /invocations#/v1/chat/completions HTTP/1.1",
    b"GET /v1/models/ HTTP/1.1",
    b"GET /openapi.json HTTP/1.1",
    b"GET /docs HTTP/1.1",
    b"POST /tokenize HTTP/1.1",
    b"POST /v1/load_lora_adapter HTTP/1.1",
]


async def _raw_exchange(port: int, request_line: bytes, headers: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b"{}"
    writer.write(
        request_line + b"\r\nHost: pod\r\n" + headers + b"Content-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
    )
    await writer.drain()
    status_line = await reader.readline()
    await reader.read()
    writer.close()
    return int(status_line.split()[1])


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_on_the_wire_no_trick_reaches_vllm(http: str) -> None:
    pytest.importorskip(http)
    app, fake = _gate()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    statuses: dict[bytes, list[int]] = {}

    async def scenario() -> None:
        server = uvicorn.Server(uvicorn.Config(app, http=http, lifespan="off", log_level="warning"))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:  # noqa: ASYNC110 - uvicorn offers no event to wait on
            await asyncio.sleep(0.01)
        try:
            for line in WIRE_TRICKS:
                statuses[line] = [
                    await _raw_exchange(port, line, b""),
                    await _raw_exchange(port, line, b"Authorization: Bearer " + KEY.encode() + b"\r\n"),
                ]
            ok = b"POST /v1/chat/completions HTTP/1.1"
            statuses[ok] = [await _raw_exchange(port, ok, b"Authorization: Bearer " + KEY.encode() + b"\r\n")]
        finally:
            server.should_exit = True
            await task

    asyncio.run(scenario())
    sock.close()
    assert fake.seen == [("POST", "/v1/chat/completions")], fake.seen  # the one honest request
    for line in WIRE_TRICKS:
        assert all(status in (400, 404) for status in statuses[line]), (line, statuses[line])
