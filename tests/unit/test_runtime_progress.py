"""The engine's progress watch (runtime/serving/progress.py): the engine's steps as progress, the requests it
holds as work, the lifecycle's watchdog over both (requests inside the gate that the engine does not hold yet
are no work), and what a stall looks like from outside."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge

from pagoda.runtime.serving import lifecycle, termination
from pagoda.runtime.serving.config import ServeConfig
from pagoda.runtime.serving.progress import EngineSteps, ProgressWatch, default_stall_timeout
from pagoda.runtime.serving.server import PagodaApp, RuntimeState


def test_busy_without_a_step_counts_up_and_stalls_at_the_timeout() -> None:
    watch = ProgressWatch(timeout=30)
    assert watch.observe(100.0, busy=True, steps=5) == 0
    assert watch.observe(110.0, busy=True, steps=5) == 10
    assert not watch.stalled(29.9)
    assert watch.observe(130.0, busy=True, steps=5) == 30
    assert watch.stalled(30.0)


def test_a_step_or_idleness_resets_the_count() -> None:
    watch = ProgressWatch(timeout=30)
    watch.observe(0.0, busy=True, steps=1)
    assert watch.observe(20.0, busy=True, steps=2) == 0  # a step: progress
    assert watch.observe(40.0, busy=True, steps=2) == 20
    assert watch.observe(45.0, busy=False, steps=2) == 0  # idle: nothing to make progress on
    assert watch.observe(100.0, busy=True, steps=2) == 0  # work began now, not at the last step
    assert watch.observe(110.0, busy=True, steps=2) == 10


def test_timeout_zero_never_stalls() -> None:
    watch = ProgressWatch(timeout=0)
    watch.observe(0.0, busy=True, steps=0)
    assert not watch.stalled(watch.observe(10_000.0, busy=True, steps=0))


def test_every_step_the_engine_reports_counts_also_one_without_output() -> None:
    """vLLM attaches scheduler statistics to the outputs of every EngineCore step, also of one that only
    computed a chunk of a prefill (no token, no IterationStats); a report without them is no step."""
    steps = EngineSteps()
    steps.record(object())  # a chunked-prefill step: scheduler statistics only
    steps.record(object())
    steps.record(None)
    assert steps.count == 2


def test_the_default_timeout_covers_one_step_at_a_slow_cpu_rate() -> None:
    assert default_stall_timeout(2048, 2048) == 44  # vLLM's CPU step budget: 2048 tokens
    assert default_stall_timeout(256, 2048) == 30  # never under 30 s
    assert default_stall_timeout(2048, 131_072) == 205  # the last chunk attends over a long context
    assert default_stall_timeout(131_072, 131_072) == 3600  # an unchunked 128k prefill: the bound


class FakeEngine:
    """What the watchdog reads of vLLM's AsyncLLM."""

    errored = False

    def __init__(self, held: int) -> None:
        self.held = held

    def get_num_unfinished_requests(self) -> int:
        return self.held


def _watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: int, running: int, stepping: bool, at_gate: int
) -> tuple[bool, float]:
    """Runs the lifecycle's watchdog for 0.6 s with --stall-timeout 0.3 over an engine holding `held`
    requests (its last report: `running`), whose steps advance every sample when `stepping`, while
    `at_gate` requests are inside the gate, in vLLM's app but not yet the engine's (fetching media,
    tokenizing). Returns (stalled, max stalled s)."""
    monkeypatch.setattr(lifecycle, "WATCHDOG_INTERVAL_S", 0.02)
    config = ServeConfig(model="file:///models/m", served_model_name="tiny", cache_dir=str(tmp_path))
    runtime = lifecycle.Runtime(config.model_copy(update={"stall_timeout": 0.3}), None)
    registry = CollectorRegistry()
    Gauge("vllm:num_requests_running", "", ["model_name"], registry=registry).labels("tiny").set(running)
    Gauge("vllm:num_requests_waiting", "", ["model_name"], registry=registry).labels("tiny").set(0)
    runtime.state.engine, runtime.state.engine_registry = FakeEngine(held), registry
    runtime.state.in_flight = at_gate
    seen: list[float] = []

    async def run() -> None:
        watchdog = asyncio.create_task(runtime._watch_engine())
        deadline = asyncio.get_running_loop().time() + 0.6
        while asyncio.get_running_loop().time() < deadline and not runtime.stop.is_set():
            if stepping:
                runtime.engine_steps.record(object())
            seen.append(runtime.state.status.stalled_seconds)
            await asyncio.sleep(0.01)
        watchdog.cancel()

    asyncio.run(run())
    return runtime.state.engine_stalled, max(seen)


def test_a_prefill_longer_than_the_timeout_is_no_stall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long prompt computed in chunks: the engine steps, but counts no token until the prefill ends."""
    stalled, seconds = _watch(tmp_path, monkeypatch, held=1, running=1, stepping=True, at_gate=1)
    assert not stalled and seconds < 0.1


def test_a_request_the_engine_does_not_hold_yet_is_no_stall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request at the gate whose images are still downloading, or whose prompt is being tokenized."""
    stalled, seconds = _watch(tmp_path, monkeypatch, held=0, running=0, stepping=False, at_gate=3)
    assert not stalled and seconds == 0


def test_an_engine_that_holds_requests_and_steps_no_more_is_stalled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGSTOPped EngineCore: its last report still says running; or a request handed to it after it
    stopped, which it never reported: the frontend counts it all the same."""
    assert _watch(tmp_path, monkeypatch, held=4, running=4, stepping=False, at_gate=0)[0]
    assert _watch(tmp_path, monkeypatch, held=1, running=0, stepping=False, at_gate=0)[0]


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
        "the vLLM engine had requests and completed no step for 31s (the limit is 30s)"
    )
    assert fatal.message.endswith("raise spec.runtime.stallTimeoutSeconds")
