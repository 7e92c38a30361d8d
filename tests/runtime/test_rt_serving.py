"""Tier 3: the OpenAI API, probes, bad requests, metrics and KV-cache capacity on the real engine, via the
`openai` client."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rt_harness import CHAT_TEMPLATE_MARKER, ENGINE_FLAGS, RuntimeProcess, wait_until

from e2e.lab import openai_surface

pytestmark = pytest.mark.runtime


def client(server: RuntimeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=60, max_retries=0)


def scrape(server: RuntimeProcess) -> dict[str, float]:
    """Sample name (with labels) -> value, from /metrics."""
    text = server.get("/metrics").text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def test_probes_while_loading_then_ready(server: RuntimeProcess) -> None:
    # Observed by the fixture while the model loaded: alive, not ready, API gated with Retry-After.
    assert server.loading_observation is not None
    live, ready, models, retry_after = server.loading_observation
    assert (live, ready, models) == (200, 503, 503)
    assert retry_after is not None and int(retry_after) > 0
    assert server.get("/livez").status_code == 200
    assert server.get("/readyz").json() == {"status": "ready"}


def test_the_seeded_model_info_answered_vllms_registry_inspection(
    server: RuntimeProcess, model_info_seed: Path
) -> None:
    """serve copied the seed's answers into its own vLLM cache, and vLLM used the tiny Llama's as it was: an
    answer vLLM had judged stale (or missing) it would have re-inspected and rewritten, with a newer mtime."""
    answer = "vllm-model_executor-models-llama-LlamaForCausalLM.json"
    seeded = model_info_seed / "modelinfos" / answer
    used = server.workdir / "vllm-cache" / "modelinfos" / answer
    assert len(list(seeded.parent.glob("*.json"))) > 100  # every architecture, not only the tiny model's
    assert used.read_bytes() == seeded.read_bytes()
    assert used.stat().st_mtime_ns == seeded.stat().st_mtime_ns


def test_models_lists_served_name(server: RuntimeProcess) -> None:
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_chat_completion(server: RuntimeProcess) -> None:
    reply = client(server).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Say hello."}], max_tokens=12, temperature=0
    )
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("length", "stop")
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 12
    assert reply.usage.prompt_tokens > 3  # the chat template added its role markers


def test_chat_requests_are_rendered_with_the_chat_template_flag(server: RuntimeProcess) -> None:
    """The server runs with --chat-template (conftest.py): vLLM renders chat requests with that file, not the
    model's own template. The chat completion's own prompt tokens (vLLM's `return_token_ids`), echoed back
    as text by a completion (vLLM's /tokenize and /detokenize are not served: runtime/serving/routes.py)."""
    messages = [{"role": "user", "content": "Say hello."}]
    api = client(server)
    reply = api.chat.completions.create(
        model="tiny", messages=messages, max_tokens=1, extra_body={"return_token_ids": True}
    )
    tokens = (reply.model_extra or {})["prompt_token_ids"]
    assert reply.usage is not None and reply.usage.prompt_tokens == len(tokens) > 3
    echoed = api.completions.create(model="tiny", prompt=tokens, max_tokens=1, echo=True, temperature=0)
    prompt = echoed.choices[0].text
    assert prompt.startswith(CHAT_TEMPLATE_MARKER + "\n") and "Say hello." in prompt, prompt


def test_streaming_chat(server: RuntimeProcess) -> None:
    stream = client(server).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Count."}],
        max_tokens=16,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len([p for p in pieces if p]) >= 8
    assert "".join(pieces)


def test_completions_are_deterministic_at_temperature_zero(server: RuntimeProcess) -> None:
    c = client(server)
    a = c.completions.create(model="tiny", prompt="def main():", max_tokens=10, temperature=0)
    b = c.completions.create(model="tiny", prompt="def main():", max_tokens=10, temperature=0)
    assert a.choices[0].text == b.choices[0].text
    assert a.usage is not None and 0 < a.usage.completion_tokens <= 10


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ("{not json", 400, "json"),
        ({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404, "nope"),
        (
            {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -5},
            400,
            "max_tokens",
        ),
        (
            {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9},
            400,
            "max_tokens",
        ),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hello world " * 3000}]}, 400, "context"),
    ],
    ids=["malformed-json", "unknown-model", "negative-max-tokens", "absurd-max-tokens", "prompt-too-long"],
)
def test_bad_requests_get_openai_errors_and_server_keeps_serving(
    server: RuntimeProcess, body: object, status: int, needle: str
) -> None:
    payload = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(
        server.url + "/v1/chat/completions",
        content=payload,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == status and needle in error["message"].lower()
    assert {"message", "type", "param", "code"} <= error.keys()
    ok = client(server).completions.create(model="tiny", prompt="x", max_tokens=2)
    assert ok.choices[0].text is not None


def test_a_body_over_the_limit_gets_413_and_the_server_keeps_serving(server: RuntimeProcess) -> None:
    """50 MB against the default --max-request-body-bytes (16 MiB): refused from its Content-Length before it
    is read, and refused while it arrives when sent chunked; both on one connection, which then serves a chat
    request."""
    content = "x" * 50_000_000
    big = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": content}]}).encode()

    def chunked() -> Iterator[bytes]:
        for start in range(0, len(big), 1 << 20):
            yield big[start : start + (1 << 20)]

    log_start = server.log_path.stat().st_size
    headers = {"content-type": "application/json"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as http:
        for body in (big, chunked()):
            r = http.post("/v1/chat/completions", content=body)
            assert r.status_code == 413, r.text
            error = r.json()["error"]
            assert (error["code"], error["type"]) == (413, "RequestEntityTooLarge")
            assert f"({16 * 1024**2} bytes)" in error["message"]
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        ok = http.post("/v1/chat/completions", json=chat)
        assert ok.status_code == 200, ok.text
        assert ok.json()["choices"][0]["message"]["role"] == "assistant"
    with server.log_path.open("rb") as log:
        log.seek(log_start)
        assert b"Traceback" not in log.read()


def test_bad_request_through_openai_client_raises_typed_error(server: RuntimeProcess) -> None:
    with pytest.raises(openai.NotFoundError):
        client(server).chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])


def test_metrics_follow_the_engine_under_load(server: RuntimeProcess) -> None:
    before = scrape(server)
    label = '{model_name="tiny"}'
    assert before[f"pagoda_ready{label}"] == 1.0
    assert before[f"pagoda_draining{label}"] == 0.0
    assert before[f"pagoda_model_load_seconds{label}"] > 1.0
    assert any(k.startswith("vllm:") for k in before)  # vLLM's own metrics stay on /metrics

    failures: list[BaseException] = []

    def one() -> None:
        try:
            client(server).completions.create(
                model="tiny", prompt="load", max_tokens=120, extra_body={"ignore_eos": True}
            )
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    peak: dict[str, float] = {"queue": 0.0, "running": 0.0, "kv": 0.0}

    def saw_queue() -> bool:
        m = scrape(server)
        peak["queue"] = max(peak["queue"], m[f"pagoda_queue_depth{label}"])
        peak["running"] = max(peak["running"], m[f"pagoda_running_requests{label}"])
        peak["kv"] = max(peak["kv"], m[f"pagoda_kv_cache_usage_ratio{label}"])
        return peak["queue"] >= 1 and peak["running"] == 4 and peak["kv"] > 0

    wait_until(saw_queue, timeout=60, interval=0.05, what="queue depth, running requests and KV usage")
    deadline = time.monotonic() + 120
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not failures, failures
    assert peak["running"] == 4  # --max-num-seqs 4: the rest waited in the queue
    assert 0 < peak["kv"] <= 1.0
    wait_until(
        lambda: (
            scrape(server)[f"pagoda_queue_depth{label}"] == 0
            and scrape(server)[f"pagoda_running_requests{label}"] == 0
        ),
        timeout=30,
        what="an idle engine in the metrics",
    )


def test_kv_cache_capacity_on_metrics_and_as_json(server: RuntimeProcess) -> None:
    label = '{model_name="tiny"}'
    metrics = scrape(server)
    tokens = metrics[f"pagoda_kv_cache_capacity_tokens{label}"]
    concurrency = metrics[f"pagoda_kv_cache_max_concurrency{label}"]
    answer = server.get("/v1/pagoda/capacity")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert set(body) == {
        "kvCacheTokens",
        "maxModelLen",
        "maxConcurrency",
        "blockSize",
        "maxNumSeqs",
        "maxNumBatchedTokens",
        "startup",
        "modelCache",
    }
    # The scheduler's limits as vLLM resolved them: the shared server's --max-num-seqs, vLLM's token budget.
    assert body["maxNumSeqs"] == int(ENGINE_FLAGS[ENGINE_FLAGS.index("--max-num-seqs") + 1])
    assert body["maxNumBatchedTokens"] >= body["maxNumSeqs"]
    assert body["modelCache"] == {"bytes": 0, "models": []}  # a file:// model is not downloaded into it
    assert body["maxModelLen"] == int(ENGINE_FLAGS[ENGINE_FLAGS.index("--max-model-len") + 1])
    assert (body["kvCacheTokens"], body["maxConcurrency"]) == (tokens, concurrency)
    assert tokens > 0 and body["blockSize"] > 0
    # vLLM's count is int(concurrency * maxModelLen).
    assert tokens <= concurrency * body["maxModelLen"] < tokens + 1
    # The same numbers vLLM logged when it sized the cache.
    logged = re.search(
        r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x",
        server.log_path.read_text(errors="replace"),
    )
    assert logged, server.log_tail()
    assert int(logged[1].replace(",", "")) == tokens
    assert int(logged[2].replace(",", "")) == body["maxModelLen"]
    assert float(logged[3]) == round(concurrency, 2)


def test_start_up_phases_as_json_and_on_metrics(server: RuntimeProcess, tiny_model: Path) -> None:
    """Every phase of runtime/serving/startup.py, in order, vLLM's weight load and engine init split out of
    the engine's start (the sample's settings run vLLM's engine in this process), adding up to the process's
    age at ready."""
    startup = server.get("/v1/pagoda/capacity").json()["startup"]
    phases = startup["phases"]
    assert list(phases) == ["imports", "modelFetch", "engineSetup", "weightLoad", "engineInit", "apiServer"]
    assert all(seconds >= 0 for seconds in phases.values())
    assert phases["imports"] > 1.0 and phases["engineInit"] > 0  # torch and vLLM take seconds to import
    assert sum(phases.values()) == pytest.approx(startup["seconds"], abs=0.01)
    started = datetime.fromisoformat(startup["startedAt"].replace("Z", "+00:00"))
    ready = datetime.fromisoformat(startup["readyAt"].replace("Z", "+00:00"))
    assert (ready - started).total_seconds() == pytest.approx(startup["seconds"], abs=0.5)
    assert startup["modelBytes"] == sum(f.stat().st_size for f in tiny_model.rglob("*") if f.is_file())
    metrics = scrape(server)
    for phase, seconds in phases.items():
        labels = f'{{model_name="tiny",phase="{phase}"}}'
        assert metrics[f"pagoda_startup_phase_seconds_count{labels}"] == 1
        assert metrics[f"pagoda_startup_phase_seconds_sum{labels}"] == pytest.approx(seconds, abs=0.001)
    assert metrics['pagoda_startup_model_bytes{model_name="tiny"}'] == startup["modelBytes"]


def test_every_openai_parameter_is_served_or_refused_and_the_engine_lives(server: RuntimeProcess) -> None:
    """e2e/lab/openai_surface.py's sweep: logprobs, top_logprobs, n, seed, stop, response_format, tools,
    streamed usage, prompt_logprobs, echo and the rest, each served with its effect shown or refused with a
    4xx; the engine still serves after (a `logprobs` request made the CPU engine compile a kernel in its step:
    runtime/serving/engine.py). Tier 4 sends the same to a pod of the image (e2e/test_api_surface.py)."""
    wrong = openai_surface.sweep(client(server))
    assert not wrong, "\n".join(map(str, wrong))
    server.check_alive()
    assert server.get("/livez").status_code == 200
    assert server.get("/readyz").status_code == 200
