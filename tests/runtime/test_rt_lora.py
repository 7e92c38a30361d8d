"""Tier 3: LoRA adapters on the real vLLM engine (CPU) and the tiny model, with tiny random adapters made
locally: one served from the start, others loaded, replaced and unloaded at run time through
/v1/pagoda/adapters (every call signed with a management key, as the operator signs them; unsigned ones
refused), bad ones refused with a clear error while the others keep serving, per-adapter metrics. One engine
start for the module."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rt_harness import ENGINE_FLAGS, RuntimeProcess, wait_until

from pagoda import contract
from pagoda.contract import management
from pagoda.runtime.tools.tinyadapter import TinyAdapterSpec, make_tiny_adapter

pytestmark = pytest.mark.runtime
ADAPTERS = "/v1/pagoda/adapters"
PROMPT = "def main():"
OPERATOR = management.Signer(management.new_private_key())  # stands in for the operator's key
# The pod this runtime is told it is (the downward API's variables, as the operator's pods have them).
POD_UID = "3f1c2b7e-9a0d-4e5f-8b6a-1d2c3e4f5a6b"
OTHER_POD_UID = "7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c0d"


@pytest.fixture(scope="module")
def adapters(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("adapters")
    other = root / "other-model"  # a wider Llama: only its config.json is read
    other.mkdir()
    config = json.loads((tiny_model / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(config | {"hidden_size": 128, "head_dim": 32}))
    return SimpleNamespace(
        first=make_tiny_adapter(tiny_model, root / "first", TinyAdapterSpec(seed=1)),
        second=make_tiny_adapter(tiny_model, root / "second", TinyAdapterSpec(seed=2)),
        rank16=make_tiny_adapter(tiny_model, root / "rank16", TinyAdapterSpec(rank=16)),
        foreign=make_tiny_adapter(other, root / "foreign"),
        model=tiny_model,
    )


@pytest.fixture(scope="module")
def server(
    tiny_model: Path, adapters: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RuntimeProcess]:
    lora = ["--lora", f"first=file://{adapters.first}", "--lora", "broken=file:///nonexistent/adapter"]
    limits = ["--max-loras", "2", "--max-lora-rank", "8", "--max-cpu-loras", "3"]
    workdir = tmp_path_factory.mktemp("serve-lora")
    (workdir / "public-key.pem").write_text(OPERATOR.public_pem)
    key = ["--management-public-key-file", str(workdir / "public-key.pem")]
    runtime = RuntimeProcess(
        model=f"file://{tiny_model}",
        workdir=workdir,
        flags=[*ENGINE_FLAGS, *lora, *limits, *key],
        extra_env={contract.POD_UID_ENV: POD_UID, contract.POD_IP_ENV: "127.0.0.1"},
    )
    runtime.start()
    try:
        runtime.wait_ready()
        yield runtime
    finally:
        runtime.terminate()


def client(server: RuntimeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120, max_retries=0)


def greedy(server: RuntimeProcess, model: str) -> str:
    reply = client(server).completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
    return reply.choices[0].text


def signed(
    server: RuntimeProcess, method: str, path: str, body: dict[str, Any] | None = None
) -> httpx.Response:
    """A management call signed as the operator signs it."""
    data = json.dumps(body).encode() if body is not None else b""
    host = server.url.split("//", 1)[1]
    headers = {
        "authorization": OPERATOR.authorization(method, host, path, data, pod=POD_UID),
        "content-type": "application/json",
    }
    return httpx.request(method, server.url + path, content=data or None, headers=headers, timeout=120)


def put(server: RuntimeProcess, name: str, source: str) -> httpx.Response:
    return signed(server, "PUT", f"{ADAPTERS}/{name}", {"source": source})


def delete(server: RuntimeProcess, name: str) -> httpx.Response:
    return signed(server, "DELETE", f"{ADAPTERS}/{name}")


def listed(server: RuntimeProcess) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in signed(server, "GET", ADAPTERS).json()["adapters"]}


def models(server: RuntimeProcess) -> dict[str, dict[str, Any]]:
    return {m["id"]: m for m in server.get("/v1/models").json()["data"]}


def test_start_adapters_are_served_and_listed_with_the_base_as_parent(
    server: RuntimeProcess, adapters: SimpleNamespace
) -> None:
    served = models(server)
    assert list(served) == ["tiny", "first"]
    assert served["first"]["parent"] == "tiny" and served["tiny"]["parent"] is None
    state = signed(server, "GET", ADAPTERS).json()
    assert (state["enabled"], state["maxAdapters"], state["maxRank"]) == (True, 3, 8)
    first, broken = state["adapters"][1], state["adapters"][0]
    assert (first["name"], first["state"], first["rank"]) == ("first", "Loaded", 8)
    assert first["source"] == f"file://{adapters.first}"
    # A bad --lora adapter does not stop the server: it is listed as Failed, with why.
    assert (broken["name"], broken["state"], broken["reason"]) == (
        "broken",
        "Failed",
        "AdapterSourceNotFound",
    )
    assert "/nonexistent/adapter does not exist" in broken["error"]
    assert "broken" not in served


def test_a_greedy_completion_through_the_adapter_differs_from_the_base(server: RuntimeProcess) -> None:
    base, adapted = greedy(server, "tiny"), greedy(server, "first")
    assert adapted != base
    assert greedy(server, "first") == adapted and greedy(server, "tiny") == base  # greedy is deterministic
    chat = client(server).chat.completions.create(
        model="first", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    assert chat.model == "first" and chat.choices[0].message.content is not None


def test_load_serve_and_unload_at_run_time(server: RuntimeProcess, adapters: SimpleNamespace) -> None:
    loaded = put(server, "second", f"file://{adapters.second}")
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["state"] == "Loaded" and loaded.json()["rank"] == 8
    again = put(server, "second", f"file://{adapters.second}")  # the same source: a no-op
    assert again.status_code == 200 and again.json()["loadedAt"] == loaded.json()["loadedAt"]
    assert models(server)["second"]["parent"] == "tiny"
    text = greedy(server, "second")
    assert text not in (greedy(server, "tiny"), greedy(server, "first"))

    gone = delete(server, "second")
    assert gone.status_code == 200 and gone.json()["state"] == "Unloaded"
    with pytest.raises(openai.NotFoundError) as caught:
        greedy(server, "second")
    assert caught.value.status_code == 404 and "second" in caught.value.message
    assert "second" not in models(server) and "second" not in listed(server)
    assert delete(server, "second").json()["error"]["type"] == "AdapterNotFound"


def test_the_management_api_answers_only_the_operators_signature(
    server: RuntimeProcess, adapters: SimpleNamespace
) -> None:
    """Whoever reaches the pod without the operator's key can neither list, load nor unload adapters; the
    inference API is not affected."""
    source = {"source": f"file://{adapters.second}"}
    unsigned = [
        httpx.get(server.url + ADAPTERS, timeout=30),
        httpx.put(f"{server.url}{ADAPTERS}/intruder", json=source, timeout=30),
        httpx.delete(f"{server.url}{ADAPTERS}/first", timeout=30),
    ]
    assert [r.status_code for r in unsigned] == [401, 401, 401], [r.text for r in unsigned]
    assert unsigned[0].headers["www-authenticate"] == management.SCHEME
    stranger = management.Signer(management.new_private_key())
    host = server.url.split("//", 1)[1]
    body = json.dumps(source).encode()
    forged = httpx.put(
        f"{server.url}{ADAPTERS}/intruder",
        content=body,
        headers={
            "authorization": stranger.authorization("PUT", host, f"{ADAPTERS}/intruder", body, pod=POD_UID)
        },
        timeout=30,
    )
    assert forged.status_code == 401 and "does not verify" in forged.json()["error"]["message"]
    # A signed call replayed (captured on the network) is refused too.
    header = OPERATOR.authorization("GET", host, ADAPTERS, b"", pod=POD_UID)
    first = httpx.get(server.url + ADAPTERS, headers={"authorization": header}, timeout=30)
    replayed = httpx.get(server.url + ADAPTERS, headers={"authorization": header}, timeout=30)
    assert (first.status_code, replayed.status_code) == (200, 401)
    assert "intruder" not in listed(server) and listed(server)["first"]["state"] == "Loaded"
    assert "first" in models(server)


def test_a_call_signed_for_another_pod_is_refused(server: RuntimeProcess, adapters: SimpleNamespace) -> None:
    """One key signs for every pod: a call captured on its way to another pod and replayed here within the
    window is refused, as is one for this pod's UID addressed to another pod's IP; nothing changes."""
    path, source = f"{ADAPTERS}/intruder", {"source": f"file://{adapters.second}"}
    body = json.dumps(source).encode()
    here = server.url.split("//", 1)[1]
    elsewhere = "10.244.0.8:8000"  # the other pod's address, as the captured call's Host had it
    attempts = [
        (
            OPERATOR.authorization("PUT", elsewhere, path, body, pod=OTHER_POD_UID),
            elsewhere,
            "signed for pod",
        ),
        (OPERATOR.authorization("PUT", here, path, body, pod=OTHER_POD_UID), here, "signed for pod"),
        (
            OPERATOR.authorization("PUT", elsewhere, path, body, pod=POD_UID),
            elsewhere,
            "not this pod's address",
        ),
    ]
    for header, host, reason in attempts:
        refused = httpx.put(
            server.url + path, content=body, headers={"authorization": header, "host": host}, timeout=30
        )
        assert refused.status_code == 401 and reason in refused.json()["error"]["message"], refused.text
    assert "intruder" not in listed(server) and "intruder" not in models(server)


def test_unload_drains_the_adapters_requests_and_refuses_new_ones(
    server: RuntimeProcess, adapters: SimpleNamespace
) -> None:
    assert put(server, "slow", f"file://{adapters.second}").status_code == 200
    started, stream_done = threading.Event(), threading.Event()
    result: dict[str, Any] = {}

    def long_stream() -> None:
        try:
            stream = client(server).completions.create(
                model="slow",
                prompt=PROMPT,
                max_tokens=400,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            for chunk in stream:
                started.set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    result["finish"] = chunk.choices[0].finish_reason
                if chunk.usage:
                    result["tokens"] = chunk.usage.completion_tokens
        except BaseException as exc:  # noqa: BLE001 - reported by the assertions below
            result["error"] = exc
        finally:
            started.set()
            stream_done.set()

    streamer = threading.Thread(target=long_stream)
    streamer.start()
    assert started.wait(60) and "error" not in result, result
    deleter = threading.Thread(target=lambda: result.update(delete=delete(server, "slow")))
    deleter.start()
    wait_until(
        lambda: listed(server).get("slow", {}).get("state") == "Unloading",
        timeout=30,
        interval=0.05,
        what="the adapter draining",
    )
    assert listed(server)["slow"]["inFlight"] == 1
    refused = httpx.post(
        server.url + "/v1/completions", json={"model": "slow", "prompt": "x", "max_tokens": 2}, timeout=30
    )
    assert refused.status_code == 404 and refused.json()["error"]["code"] == 404
    # Refused while the running request still streams and the DELETE waits for it.
    assert not stream_done.is_set() and deleter.is_alive()
    streamer.join(180)
    deleter.join(180)
    assert "error" not in result, result
    assert (result["finish"], result["tokens"]) == ("length", 400)  # it ran to the end
    assert result["delete"].status_code == 200, result["delete"].text
    assert "slow" not in models(server)


def test_changing_the_source_replaces_the_adapter(server: RuntimeProcess, adapters: SimpleNamespace) -> None:
    original = greedy(server, "first")
    assert put(server, "reference", f"file://{adapters.second}").status_code == 200
    expected = greedy(server, "reference")
    assert delete(server, "reference").status_code == 200

    replaced = put(server, "first", f"file://{adapters.second}")
    assert replaced.status_code == 200 and replaced.json()["source"] == f"file://{adapters.second}"
    assert greedy(server, "first") == expected
    assert put(server, "first", f"file://{adapters.first}").status_code == 200
    assert greedy(server, "first") == original
    assert listed(server)["first"]["state"] == "Loaded"


@pytest.mark.parametrize(
    ("source", "status", "kind", "needle"),
    [
        ("file:///nonexistent/adapter", 422, "AdapterSourceNotFound", "does not exist"),
        (
            "{rank16}",
            422,
            "AdapterRankTooLarge",
            "rank 16 is above this server's maximum 8 (--max-lora-rank)",
        ),
        ("{foreign}", 422, "AdapterBaseModelMismatch", "made for another base model"),
        ("{model}", 422, "AdapterInvalid", "no adapter_config.json"),
        ("gs://bucket/adapter", 400, "InvalidAdapterRequest", "unknown scheme 'gs'"),
    ],
    ids=["missing-path", "rank-above-max", "other-base-model", "not-an-adapter", "bad-uri"],
)
def test_a_bad_adapter_gets_a_clear_error_and_the_others_keep_serving(
    server: RuntimeProcess, adapters: SimpleNamespace, source: str, status: int, kind: str, needle: str
) -> None:
    paths = {k: f"file://{v}" for k, v in vars(adapters).items()}
    answer = put(server, "bad", source.format(**paths))
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["code"]) == (kind, status)
    assert error["message"].startswith("adapter bad") and needle in error["message"]
    if status == 422:  # listed as Failed, with the same reason, until deleted
        assert listed(server)["bad"]["state"] == "Failed" and listed(server)["bad"]["reason"] == kind
        assert delete(server, "bad").status_code == 200
    assert "bad" not in models(server)
    greedy(server, "first"), greedy(server, "tiny")
    assert server.get("/readyz").status_code == 200


def test_a_replica_holds_at_most_max_cpu_loras_adapters(
    server: RuntimeProcess, adapters: SimpleNamespace
) -> None:
    assert [n for n, a in listed(server).items() if a["state"] == "Loaded"] == ["first"]
    for name in ("extra1", "extra2"):
        assert put(server, name, f"file://{adapters.second}").status_code == 200
    refused = put(server, "extra3", f"file://{adapters.second}")
    assert refused.status_code == 409 and refused.json()["error"]["type"] == "TooManyAdapters"
    assert "--max-cpu-loras 3" in refused.json()["error"]["message"]
    for name in ("extra1", "extra2", "extra3"):
        delete(server, name)
    assert [n for n, a in listed(server).items() if a["state"] == "Loaded"] == ["first"]


def scrape(server: RuntimeProcess) -> dict[tuple[str, str], float]:
    """(sample name, adapter) -> value for the per-adapter samples; vLLM's LoRA info under its name."""
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(server.get("/metrics").text):
        for s in family.samples:
            if s.name.startswith("pagoda_lora_"):
                out[(s.name, s.labels["adapter"])] = s.value
            elif s.name == "vllm:lora_requests_info":
                out[(s.name, s.labels["max_lora"])] = s.value
    return out


def test_per_adapter_metrics_count_requests_and_tokens(server: RuntimeProcess) -> None:
    before = scrape(server)
    for _ in range(2):
        client(server).completions.create(
            model="first", prompt="x", max_tokens=5, extra_body={"ignore_eos": True}
        )
    stream = client(server).chat.completions.create(
        model="first",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    assert len([c for c in stream if c.choices and c.choices[0].delta.content is not None]) >= 1
    after = scrape(server)
    key = ("pagoda_lora_requests_total", "first")
    assert after[key] - before.get(key, 0) == 3
    key = ("pagoda_lora_generation_tokens_total", "first")
    assert after[key] - before.get(key, 0) == 2 * 5 + 4
    assert ("vllm:lora_requests_info", "2") in after  # the inference gateway's picker reads this one
