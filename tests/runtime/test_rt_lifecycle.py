"""Tier 3: graceful drain on SIGTERM under load, API keys, and fail-fast when the engine dies."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from harness import RuntimeProcess, wait_until

pytestmark = pytest.mark.runtime

LABEL = '{model_name="tiny"}'


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
        # The root cause, from the engine's own process when it failed there (runtime/enginefailure.py).
        reason = "ModelNotFound" if problem == "missing" else "ModelInvalid"
        assert message.read_text().startswith(f"{reason}: "), message.read_text()
    finally:
        runtime.terminate()
