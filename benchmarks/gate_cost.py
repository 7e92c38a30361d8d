"""The gate's own per-request cost: the runtime's outer app in front of a trivial app vs that app alone.

    make bench-gate            (or: .venv/bin/python benchmarks/gate_cost.py [--rounds 7] [--requests 2000])

runtime_vs_vllm.py compares whole servers, where the engine's step (milliseconds, and noisy on a shared
machine) hides a cost of tens of microseconds. This takes the engine away and keeps the rest:

1. Two servers, each a process of its own run as the runtime runs its HTTP server (uvicorn on uvloop with
   httptools, the arguments of lifecycle.Runtime.run): "gate" is runtime/serving/server.py's PagodaApp with
   the serve defaults (--max-request-body-bytes, --max-connection-age) and an API key, so that every request
   passes the real path allow-list, key check, method check, body limit and in-flight count; its inner app
   (vLLM's, in the runtime) is the trivial app. "bare" is the trivial app alone. The trivial app reads the
   request body, as vLLM's does, and streams a few server-sent events and `data: [DONE]`, as a streamed
   completion does.
2. Paired rounds: one client, over loopback, sends the same streamed completion request to the two servers
   in turn, one request at a time (gate, bare, gate, ... and bare first in every other round), each on its
   own kept-alive connection; a round's cost is the gate's p50 minus the bare app's, for the first event
   (what time to first token sees) and for the whole response.
Prints a table of the rounds and the median of their differences with its range, and writes the raw
numbers to .pagoda-dev/bench-gate.json (--json).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from servers import ROOT

API_KEY = "bench-key"
EVENTS = 4  # server-sent events before `data: [DONE]`, as a short streamed completion sends
BODY = json.dumps({"model": "tiny", "prompt": "Question 1:", "max_tokens": EVENTS, "stream": True}).encode()
# Made once: the trivial app's own work is kept small, so that its noise does not hide the gate's cost.
CHUNKS = [
    f"data: {json.dumps({'choices': [{'index': 0, 'text': f' t{i}'}]})}\n\n".encode() for i in range(EVENTS)
]


async def trivial(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The engine's stand-in: the body read to its end, then EVENTS events and [DONE], chunked."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message["type"] == "http.request" and bool(message.get("more_body"))
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for chunk in CHUNKS:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def serve(side: str) -> None:
    """One side's server, on a free loopback port it prints first; until terminated."""
    import uvicorn
    import uvloop

    from pagoda.runtime.serving import lifecycle
    from pagoda.runtime.serving.config import ServeConfig
    from pagoda.runtime.serving.server import PagodaApp, RuntimeState

    app: Any = trivial
    if side == "gate":
        defaults = ServeConfig.model_fields
        state = RuntimeState(
            "tiny",
            max_connection_age=defaults["max_connection_age"].default,
            max_request_body_bytes=defaults["max_request_body_bytes"].default,
            api_key=API_KEY,
        )
        state.inner = trivial
        app = PagodaApp(state)
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=lifecycle.KEEP_ALIVE_SECONDS,
        timeout_graceful_shutdown=5,
    )
    sock = lifecycle.bind("127.0.0.1", 0)
    print(sock.getsockname()[1], flush=True)
    uvloop.run(uvicorn.Server(config).serve(sockets=[sock]))


class Side:
    """A server of one side and the client's connection to it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", name], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"{name}: the server did not start (exit {self.proc.wait(timeout=30)})")
        self.port = int(line)
        self.request = (
            f"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:{self.port}\r\n"
            f"authorization: Bearer {API_KEY}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(BODY)}\r\n\r\n"
        ).encode() + BODY
        self.sock: socket.socket | None = None

    def connect(self) -> socket.socket:
        deadline = time.monotonic() + 30
        while True:
            try:
                sock = socket.create_connection(("127.0.0.1", self.port))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(30)  # an answer that is not the stream (an error) fails the run, not hangs it
                return sock
            except ConnectionRefusedError:  # bound, not listening yet (uvicorn listens as it starts)
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def one(self) -> tuple[float, float]:
        """(seconds to the first event, seconds to the end of the response) for one streamed request."""
        sock = self.sock = self.sock or self.connect()
        start = time.perf_counter()
        sock.sendall(self.request)
        data, first = b"", 0.0
        while not data.endswith(b"0\r\n\r\n"):  # the chunked body's last chunk
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"{self.name}: the server closed the connection mid-response")
            data += chunk
            if not first and b"data: " in data:
                first = time.perf_counter() - start
        end = time.perf_counter() - start
        head = data.split(b"\r\n\r\n", 1)[0].lower()
        if not head.startswith(b"http/1.1 200"):
            raise RuntimeError(f"{self.name}: {head.decode(errors='replace')}")
        if b"\r\nconnection: close" in head:  # --max-connection-age: the next request on a new connection
            sock.close()
            self.sock = None
        return first, end

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)


def p50(values: list[float]) -> float:
    return statistics.median(values)


def run_round(sides: list[Side], requests: int, warmup: int) -> dict[str, dict[str, float]]:
    """Each side's p50 in ms (first event, whole response), the sides' requests interleaved one by one."""
    times: dict[str, list[tuple[float, float]]] = {s.name: [] for s in sides}
    for i in range(warmup + requests):
        for side in sides:
            result = side.one()
            if i >= warmup:
                times[side.name].append(result)
    return {
        name: {
            "first_ms": 1000 * p50([first for first, _ in values]),
            "total_ms": 1000 * p50([total for _, total in values]),
        }
        for name, values in times.items()
    }


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="paired rounds (at least 5 for a headline)")
    parser.add_argument("--requests", type=int, default=2000, help="requests per side and round")
    parser.add_argument("--warmup", type=int, default=100, help="requests per side and round not counted")
    parser.add_argument(
        "--json", type=Path, default=ROOT / ".pagoda-dev" / "bench-gate.json", help="the raw numbers"
    )
    parser.add_argument("--serve", choices=["gate", "bare"], help=argparse.SUPPRESS)  # a side's server
    opts = parser.parse_args()
    if opts.serve:
        serve(opts.serve)
        return 0

    gate, bare = Side("gate"), Side("bare")
    rounds = []
    try:
        for i in range(opts.rounds):
            order = [gate, bare] if i % 2 == 0 else [bare, gate]
            rounds.append(run_round(order, opts.requests, opts.warmup))
    finally:
        gate.stop()
        bare.stop()

    first = [r["gate"]["first_ms"] - r["bare"]["first_ms"] for r in rounds]
    total = [r["gate"]["total_ms"] - r["bare"]["total_ms"] for r in rounds]
    summary = {
        "rounds": [{side: {k: round(v, 4) for k, v in ms.items()} for side, ms in r.items()} for r in rounds],
        "overhead_first_event_p50_ms": spread(first),
        "overhead_total_p50_ms": spread(total),
        "requests_per_side_and_round": opts.requests,
    }
    out = opts.json
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    head = "first event p50 ms, gate / bare | gate - bare | whole response p50 ms, gate / bare | gate - bare"
    print(f"| round | {head} |")
    print("|---|---|---|---|---|")
    for n, (r, f, t) in enumerate(zip(rounds, first, total, strict=True), 1):
        g, b = r["gate"], r["bare"]
        print(
            f"| {n} | {g['first_ms']:.3f} / {b['first_ms']:.3f} | {f * 1000:+.0f} us "
            f"| {g['total_ms']:.3f} / {b['total_ms']:.3f} | {t * 1000:+.0f} us |"
        )
    for what, values in (("first event", first), ("whole response", total)):
        s = spread(values)
        print(
            f"\nGate overhead, {what} p50: median {s['median'] * 1000:+.0f} us over {len(values)} paired "
            f"rounds (range {s['min'] * 1000:+.0f} to {s['max'] * 1000:+.0f} us)",
            end="",
        )
    print(f"\n\nRaw numbers: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
