"""Tier 3: graceful drain on SIGTERM under load, API keys, and fail-fast when the engine dies."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
from rt_harness import RuntimeProcess, wait_until

pytestmark = pytest.mark.runtime

LABEL = '{model_name="tiny"}'
GATED = "Gated vLLM's routes not_forwarded="  # the runtime's log line (runtime/serving/lifecycle.py)


def metric(runtime: RuntimeProcess, name: str) -> float:
    for line in runtime.get("/metrics").text.splitlines():
        if line.startswith(name + LABEL):
            return float(line.split()[-1])
    raise AssertionError(f"{name} missing from /metrics")


def test_sigterm_drains_accepted_requests_and_leaves_no_process(tiny_model: Path, tmp_path: Path) -> None:
    runtime = RuntimeProcess(model=f"file://{tiny_model}", workdir=tmp_path, flags=[
        "--max-model-len", "2048", "--max-num-seqs", "4", "--dtype", "float32", "--drain-timeout", "120",
    ]).start()  # fmt: skip
    try:
        runtime.wait_ready()
        assert runtime.proc is not None
        api = openai.OpenAI(base_url=runtime.url + "/v1", api_key="unused", timeout=120, max_retries=0)
        results: list[str | None] = []
        failures: list[BaseException] = []

        def one() -> None:
            try:
                stream = api.completions.create(
                    model="tiny", prompt="drain", max_tokens=300, stream=True, extra_body={"ignore_eos": True}
                )
                reason = None
                for chunk in stream:
                    reason = chunk.choices[0].finish_reason or reason
                results.append(reason)
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                failures.append(exc)

        threads = [threading.Thread(target=one) for _ in range(12)]
        for t in threads:
            t.start()
        # Every request accepted: 4 running, 8 queued in the engine.
        wait_until(
            lambda: metric(runtime, "pagoda_running_requests") + metric(runtime, "pagoda_queue_depth") == 12,
            timeout=60,
            interval=0.05,
            what="12 requests inside the engine",
        )
        assert metric(runtime, "pagoda_queue_depth") >= 1
        children = runtime.children()
        assert children, "the engine runs in child processes"

        runtime.proc.send_signal(signal.SIGTERM)
        wait_until(
            lambda: runtime.get("/readyz").status_code == 503, timeout=5, interval=0.02, what="readyz 503"
        )
        assert runtime.get("/readyz").json() == {"status": "draining"}
        # A request that still arrives (a kept-alive connection kube-proxy still leads here) is served, and
        # its connection closed, so that the client's next request reaches another replica.
        late = httpx.post(
            runtime.url + "/v1/completions",
            json={"model": "tiny", "prompt": "late", "max_tokens": 4},
            timeout=120,
        )
        assert late.status_code == 200, late.text
        assert late.headers["connection"] == "close"
        assert metric(runtime, "pagoda_draining") == 1.0
        assert metric(runtime, "pagoda_requests_rejected_draining_total") == 0.0
        assert metric(runtime, "pagoda_ready") == 0.0

        for t in threads:
            t.join(timeout=150)
        assert not failures, failures
        assert results == ["length"] * 12  # all 12 accepted requests ran to their full length
        assert runtime.proc.wait(timeout=60) == 0
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"left behind: {alive}"
    finally:
        runtime.terminate()


def maps_torch(pid: int) -> bool:
    """Whether process `pid` has begun importing torch: its native library is mapped (/proc/PID/maps)."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def test_a_sigterm_while_python_imports_the_engine_stops_it_at_once_with_exit_0(
    tiny_model: Path, tmp_path: Path
) -> None:
    """In a container the runtime is PID 1, where a signal without a handler is dropped: a pod deleted while
    torch and vLLM were being imported waited out its grace period and was SIGKILLed (exit 137, seen in
    e2e/test_real_pods.py on a scale-down). `serve` takes SIGTERM from its first line
    (runtime/serving/signals.py) and then stops without loading the engine. The signal comes as soon as
    torch's library is mapped, seconds before the imports end and the event loop starts; out of a container,
    without that handler, the default action would end the process with -15."""
    runtime = RuntimeProcess(model=f"file://{tiny_model}", workdir=tmp_path).start()
    try:
        assert runtime.proc is not None
        pid = runtime.proc.pid
        wait_until(lambda: maps_torch(pid), timeout=60, interval=0.005, what="torch's import to begin")
        runtime.proc.send_signal(signal.SIGTERM)
        assert runtime.proc.wait(timeout=120) == 0, runtime.log_tail()
        assert not runtime.children()
    finally:
        runtime.terminate()


def test_api_key_and_engine_death_exit_nonzero(tiny_model: Path, tmp_path: Path) -> None:
    runtime = RuntimeProcess(
        model=f"file://{tiny_model}", workdir=tmp_path, extra_env={"PAGODA_API_KEY": "s3cret"}
    ).start()
    try:
        runtime.wait_ready()
        assert runtime.proc is not None
        # /v1/* needs the key; probes and metrics do not (kubelet and Prometheus have none).
        assert runtime.get("/v1/models").status_code == 401
        assert runtime.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert runtime.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert runtime.get("/metrics").status_code == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=runtime.url + "/v1", api_key="nope", max_retries=0).models.list()
        every_route_of_the_live_vllm_app_is_gated(runtime, "s3cret")

        children = runtime.children()
        engine_core = [c for c in children if "EngineCore" in " ".join(c.cmdline()) + c.name()]
        victim = engine_core[0] if engine_core else children[0]
        victim.kill()
        rc = runtime.proc.wait(timeout=60)
        assert rc != 0
        assert "Engine died" in runtime.log_path.read_text(errors="replace")
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"left behind: {alive}"
    finally:
        runtime.terminate()


def every_route_of_the_live_vllm_app_is_gated(runtime: RuntimeProcess, key: str) -> None:
    """Each route of the vLLM app this runtime built (its log lists those the gate keeps out, read from the
    app itself, so a route a vLLM upgrade adds is called too) answers 404 with the key or without, and the
    documented ones 401 without the key; SageMaker's /invocations, which runs chat and completions, included.
    The probes and /metrics stay open."""
    lines = [line for line in runtime.log_path.read_text(errors="replace").splitlines() if GATED in line]
    assert lines, runtime.log_tail()
    refused = [(method, path) for method, path in json.loads(lines[-1].split(GATED, 1)[1])]
    paths = {path for _, path in refused}
    assert {"/invocations", "/tokenize", "/scale_elastic_ep", "/health", "/docs"} <= paths, paths
    bearer = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=runtime.url, timeout=30) as http:
        for method, path in refused:
            call = "POST" if method in ("*", "WEBSOCKET") else method
            url = re.sub(r"\{[^}]*\}", "x", path)
            for headers in ({}, bearer):
                answer = http.request(call, url, headers=headers, json={"model": "tiny", "prompt": "hi"})
                if path in ("/metrics", "/readyz", "/livez"):  # the runtime's own, answered by the gate
                    assert answer.status_code == 200, (method, path, answer.status_code)
                else:
                    assert answer.status_code == 404, (method, path, answer.status_code, answer.text)
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models"):
            for call in ("GET", "POST"):
                answer = http.request(call, path)
                assert answer.status_code == 401 and answer.headers["www-authenticate"] == "Bearer", path
        invocation = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
        assert http.post("/invocations", json=invocation, headers=bearer).status_code == 404
        assert http.post("/v1/completions", json=invocation, headers=bearer).status_code == 200


def test_a_stalled_engine_fails_liveness_and_exits_1(tiny_model: Path, tmp_path: Path) -> None:
    """An EngineCore that stops making progress (SIGSTOP: alive to every process check, answering nothing)
    while it has requests: within --stall-timeout the probes fail with "engine stalled", the runtime exits 1
    with an EngineStalled termination message, its requests end instead of hanging, and nothing is left."""
    message_file = tmp_path / "termination-log"
    runtime = RuntimeProcess(
        model=f"file://{tiny_model}",
        workdir=tmp_path / "run",
        flags=[
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            "4",
            "--dtype",
            "float32",
            "--stall-timeout",
            "5",
        ],
        extra_env={"PAGODA_TERMINATION_MESSAGE_PATH": str(message_file)},
    ).start()
    engine_core: list[psutil.Process] = []
    try:
        runtime.wait_ready()
        assert runtime.proc is not None
        api = openai.OpenAI(base_url=runtime.url + "/v1", api_key="unused", timeout=120, max_retries=0)
        streaming = threading.Event()
        ended: list[str] = []

        def one() -> None:
            try:
                stream = api.completions.create(
                    model="tiny",
                    prompt="stall",
                    max_tokens=1500,
                    stream=True,
                    extra_body={"ignore_eos": True},
                )
                for _ in stream:
                    streaming.set()
                ended.append("finished")  # the stall came too late for this request
            except Exception as exc:  # noqa: BLE001 - the connection ends with the process
                ended.append(type(exc).__name__)

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        assert streaming.wait(timeout=60), "no request began streaming"
        children = runtime.children()
        engine_core = [c for c in children if "EngineCore" in " ".join(c.cmdline()) + c.name()]
        assert engine_core, [c.name() for c in children]
        stopped = time.monotonic()
        engine_core[0].send_signal(signal.SIGSTOP)
        # While the stall grows, the server still answers: /metrics shows it counting up; at 5 s the probes
        # fail ("engine stalled") and the process exits.
        stalled_seconds: list[float] = []
        probes: list[dict[str, Any]] = []

        def exited() -> bool:
            try:
                stalled_seconds.append(metric(runtime, "pagoda_engine_stalled_seconds"))
                answer = runtime.get("/livez")
                if answer.status_code != 200:
                    probes.append(answer.json())
            except httpx.HTTPError:
                pass  # closing down
            return runtime.proc.poll() is not None

        wait_until(exited, timeout=60, interval=0.2, what="the runtime's exit")
        assert runtime.proc.returncode == 1
        assert 5 <= time.monotonic() - stopped < 30
        assert max(stalled_seconds) >= 3, stalled_seconds
        assert all(p == {"status": "engine stalled"} for p in probes), probes
        assert message_file.read_text().startswith("EngineStalled: the vLLM engine had requests"), (
            message_file
        )
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads), "a request hung past the runtime's exit"
        assert len(ended) == 4 and "finished" not in ended, ended
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"left behind: {alive}"
    finally:
        for proc in engine_core:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        runtime.terminate()


def test_a_prefill_longer_than_the_stall_timeout_is_no_stall_but_a_stopped_engine_is(
    tiny_model: Path, tmp_path: Path
) -> None:
    """--stall-timeout 2, and a prompt of about 1,900 tokens computed one token a step
    (--max-num-batched-tokens 1): its prefill takes longer than the timeout, and vLLM counts no token of it
    until it ends; the runtime watches the engine's steps, so it serves on (it used to read the token
    counters and exit 1). Then EngineCore is stopped while idle and a request comes: the engine never reports
    that request, but it holds it, so the runtime still exits 1 with EngineStalled."""
    message_file = tmp_path / "termination-log"
    runtime = RuntimeProcess(
        model=f"file://{tiny_model}",
        workdir=tmp_path / "run",
        flags=[
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            "1",
            "--max-num-batched-tokens",
            "1",
            "--dtype",
            "float32",
            "--stall-timeout",
            "2",
        ],
        extra_env={"PAGODA_TERMINATION_MESSAGE_PATH": str(message_file)},
    ).start()
    engine_core: list[psutil.Process] = []
    try:
        runtime.wait_ready()
        assert runtime.proc is not None
        assert "Watching engine progress stall_timeout=2" in runtime.log_path.read_text(errors="replace")
        api = openai.OpenAI(base_url=runtime.url + "/v1", api_key="unused", timeout=120, max_retries=0)
        began = time.monotonic()
        answer = api.completions.create(model="tiny", prompt=" ".join(["hello"] * 630), max_tokens=1)
        took = time.monotonic() - began
        print(f"prefill_seconds={took:.1f} prompt_tokens={answer.usage and answer.usage.prompt_tokens}")
        assert answer.usage is not None and answer.usage.prompt_tokens > 1800, answer.usage
        assert took > 3, f"the prefill took {took:.1f}s, not longer than the timeout"
        assert runtime.proc.poll() is None, runtime.log_tail()
        assert runtime.get("/livez").status_code == 200
        assert "Engine stalled" not in runtime.log_path.read_text(errors="replace")

        children = runtime.children()
        engine_core = [c for c in children if "EngineCore" in " ".join(c.cmdline()) + c.name()]
        assert engine_core, [c.name() for c in children]
        engine_core[0].send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        time.sleep(3)  # idle: no stall
        assert runtime.proc.poll() is None and runtime.get("/livez").status_code == 200
        ended: list[str] = []

        def one() -> None:
            try:
                api.completions.create(model="tiny", prompt="stall", max_tokens=5)
                ended.append("finished")
            except Exception as exc:  # noqa: BLE001 - the connection ends with the process
                ended.append(type(exc).__name__)

        sent = time.monotonic()
        request = threading.Thread(target=one)
        request.start()
        wait_until(
            lambda: runtime.proc.poll() is not None, timeout=60, interval=0.2, what="the runtime's exit"
        )
        assert runtime.proc.returncode == 1
        assert 2 <= time.monotonic() - sent < 30, time.monotonic() - stopped
        assert message_file.read_text().startswith("EngineStalled: the vLLM engine had requests"), (
            message_file.read_text()
        )
        request.join(timeout=30)
        assert not request.is_alive() and ended and ended[0] != "finished", ended
    finally:
        for proc in engine_core:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        runtime.terminate()


@pytest.mark.parametrize("problem", ["missing", "truncated-weights"])
def test_missing_or_broken_model_exits_1_naming_the_uri(
    tiny_model: Path, tmp_path: Path, problem: str
) -> None:
    if problem == "missing":
        model = tmp_path / "no-such-model"
    else:
        model = tmp_path / "broken"
        model.mkdir()
        for f in tiny_model.iterdir():
            data = f.read_bytes()
            (model / f.name).write_bytes(data[: len(data) // 3] if f.suffix == ".safetensors" else data)
    uri = f"file://{model}"
    message = tmp_path / "termination-log"
    env = {"PAGODA_TERMINATION_MESSAGE_PATH": str(message)}
    runtime = RuntimeProcess(model=uri, workdir=tmp_path / "run", extra_env=env).start()
    try:
        assert runtime.proc is not None
        rc = runtime.proc.wait(timeout=240)
        log = runtime.log_path.read_text(errors="replace")
        assert rc == 1, log[-3000:]
        assert f"Failed to load model uri={uri}" in log
        assert "Stopped runtime exit_code=1" in log
        # The root cause, from the engine's own process when it failed there
        # (runtime/serving/enginefailure.py).
        reason = "ModelNotFound" if problem == "missing" else "ModelInvalid"
        assert message.read_text().startswith(f"{reason}: "), message.read_text()
    finally:
        runtime.terminate()
