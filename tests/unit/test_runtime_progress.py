"""The engine's progress watch (runtime/progress.py), the token count it reads from vLLM's metrics, the gate's
count of inference requests awaiting their response, and what a stall looks like from outside."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from pagoda.runtime import metrics, termination
from pagoda.runtime.progress import ProgressWatch
from pagoda.runtime.server import PagodaApp, RuntimeState


def test_busy_without_progress_counts_up_and_stalls_at_the_timeout() -> None:
    watch = ProgressWatch(timeout=30)
    assert watch.observe(100.0, busy=True, tokens=5) == 0
    assert watch.observe(110.0, busy=True, tokens=5) == 10
    assert not watch.stalled(29.9)
    assert watch.observe(130.0, busy=True, tokens=5) == 30
    assert watch.stalled(30.0)


def test_progress_or_idleness_resets_the_count() -> None:
    watch = ProgressWatch(timeout=30)
    watch.observe(0.0, busy=True, tokens=1)
    assert watch.observe(20.0, busy=True, tokens=2) == 0  # a token: progress
    assert watch.observe(40.0, busy=True, tokens=2) == 20
    assert watch.observe(45.0, busy=False, tokens=2) == 0  # idle: nothing to make progress on
    assert watch.observe(100.0, busy=True, tokens=2) == 0  # work began now, not at the last token
    assert watch.observe(110.0, busy=True, tokens=2) == 10


def test_timeout_zero_never_stalls() -> None:
    watch = ProgressWatch(timeout=0)
    watch.observe(0.0, busy=True, tokens=0)
    assert not watch.stalled(watch.observe(10_000.0, busy=True, tokens=0))


def test_engine_tokens_sums_prompt_and_generated_tokens_of_this_model() -> None:
    registry = CollectorRegistry()
    prompt = Counter("vllm:prompt_tokens", "", ["model_name"], registry=registry)
    generated = Counter("vllm:generation_tokens", "", ["model_name"], registry=registry)
    prompt.labels("tiny").inc(7)
    generated.labels("tiny").inc(3)
    generated.labels("other").inc(100)
    assert metrics.engine_tokens(list(registry.collect()), "tiny") == 10
    assert metrics.engine_tokens([], "tiny") == 0


def _gate(inner: Any) -> tuple[PagodaApp, RuntimeState]:
    state = RuntimeState("tiny")
    state.inner = inner
    return PagodaApp(state), state


def _request(app: PagodaApp, path: str, method: str = "POST") -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    asyncio.run(app({"type": "http", "path": path, "method": method, "headers": []}, receive, send))
    return sent


def test_an_inference_request_awaits_the_engine_until_its_response_begins() -> None:
    seen: list[int] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        seen.append(state.awaiting_engine)  # inside the engine, no response yet
        await send({"type": "http.response.start", "status": 200, "headers": []})
        seen.append(state.awaiting_engine)  # streaming: the engine has answered
        await send({"type": "http.response.body", "body": b"{}"})

    app, state = _gate(inner)
    _request(app, "/v1/chat/completions")
    _request(app, "/v1/models", method="GET")  # not inference: never counted
    assert seen == [1, 0, 0, 0] and state.awaiting_engine == 0


def test_a_failing_inference_request_is_not_left_awaiting() -> None:
    async def inner(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    app, state = _gate(inner)
    try:
        _request(app, "/v1/completions")
    except RuntimeError:
        pass
    assert state.awaiting_engine == 0 and state.in_flight == 0


def test_a_stalled_engine_fails_both_probes_and_says_why() -> None:
    app, state = _gate(None)
    state.engine_stalled = True
    for path in ("/livez", "/readyz"):
        start, body = _request(app, path, method="GET")
        assert start["status"] == 503 and json.loads(body["body"]) == {"status": "engine stalled"}


def test_the_termination_message_names_the_field_to_change() -> None:
    fatal = termination.engine_stalled(31.4, 30)
    assert fatal.reason == "EngineStalled"
    assert fatal.message.startswith(
        "the vLLM engine had requests and produced no token for 31s (the limit is 30s)"
    )
    assert fatal.message.endswith("raise spec.runtime.stallTimeoutSeconds")
