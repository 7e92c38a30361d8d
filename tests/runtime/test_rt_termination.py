"""Tier 3: a runtime that cannot start exits non-zero and leaves a termination message a person acts on.

The real engine on the tiny model; the file is the one the operator's pod template names in
PAGODA_TERMINATION_MESSAGE_PATH (the kubelet's terminationMessagePath).
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import httpx
import pytest
from rt_harness import RuntimeProcess, wait_until

pytestmark = pytest.mark.runtime

EXIT_TIMEOUT_S = 300.0


def run_to_exit(runtime: RuntimeProcess) -> tuple[int, str, str]:
    """Start it, wait for it to exit; (exit status, termination message, log)."""
    runtime.start()
    try:
        assert runtime.proc is not None
        rc = runtime.proc.wait(timeout=EXIT_TIMEOUT_S)
        message_file = Path(runtime.extra_env["PAGODA_TERMINATION_MESSAGE_PATH"])
        message = message_file.read_text() if message_file.exists() else ""
        return rc, message, runtime.log_path.read_text(errors="replace")
    finally:
        runtime.terminate()


def termination_env(tmp_path: Path) -> dict[str, str]:
    return {"PAGODA_TERMINATION_MESSAGE_PATH": str(tmp_path / "termination-log")}


def test_missing_model_path_is_model_not_found(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/nope"
    runtime = RuntimeProcess(model=uri, workdir=tmp_path / "run", extra_env=termination_env(tmp_path))
    rc, message, log = run_to_exit(runtime)
    assert rc == 1, log[-3000:]
    assert message.startswith(f"ModelNotFound: model {uri}: {tmp_path}/nope does not exist"), message
    assert "(spec.model.uri); fix spec.model.uri" in message
    assert len(message.encode()) <= 4096


def test_max_model_len_larger_than_the_kv_cache_is_model_does_not_fit(
    tiny_model: Path, tmp_path: Path
) -> None:
    # A 1 GiB CPU KV cache holds 131072 tokens of the tiny model (8 KiB per token in float32); a request of
    # 262144 tokens does not fit. VLLM_CPU_KVCACHE_SPACE takes whole GiB, so maxModelLen goes past the
    # model's 4096-token context instead (VLLM_ALLOW_LONG_MAX_MODEL_LEN): vLLM then refuses at its KV check.
    env = termination_env(tmp_path) | {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
    runtime = RuntimeProcess(
        model=f"file://{tiny_model}",
        workdir=tmp_path / "run",
        flags=["--max-model-len", "262144", "--max-num-seqs", "4", "--dtype", "float32"],
        extra_env=env,
    )
    rc, message, log = run_to_exit(runtime)
    assert rc == 1, log[-3000:]
    match = re.fullmatch(
        r"ModelDoesNotFit: spec\.engine\.maxModelLen=262144 needs ([\d.]+) GiB of KV cache but "
        r"([\d.]+) GiB is available; lower spec\.engine\.maxModelLen to at most (\d+), or raise "
        r"spec\.engine\.gpuMemoryUtilization, or add GPUs with spec\.engine\.tensorParallelSize \(on CPU: "
        r"raise VLLM_CPU_KVCACHE_SPACE in spec\.runtime\.env, now 1 GiB\)",
        message,
    )
    assert match, message or log[-3000:]
    # The numbers are vLLM's own, as its EngineCore logged them with the exception.
    vllm = re.search(
        r"max seq len \(262144\), \(([\d.]+) GiB KV cache is needed, which is larger than the available "
        r"KV cache memory \(([\d.]+) GiB\)\. Based on the available memory, the estimated maximum model "
        r"length is (\d+)\.",
        log,
    )
    assert vllm, log[-3000:]
    assert match.groups() == vllm.groups()
    assert 0 < int(match[3]) * 8192 <= 1024**3  # fits in the 1 GiB cache


def test_max_model_len_longer_than_the_model_is_named(tiny_model: Path, tmp_path: Path) -> None:
    runtime = RuntimeProcess(
        model=f"file://{tiny_model}",
        workdir=tmp_path / "run",
        flags=["--max-model-len", "8192", "--dtype", "float32"],
        extra_env=termination_env(tmp_path),
    )
    rc, message, log = run_to_exit(runtime)
    assert rc == 1, log[-3000:]
    assert message.startswith("MaxModelLenTooLarge: maxModelLen 8192 is longer than the model's context"), (
        message or log[-3000:]
    )
    assert message.endswith("lower spec.engine.maxModelLen to at most 4096")


def test_a_stop_while_loading_leaves_the_phase_it_came_in(tiny_model: Path, tmp_path: Path) -> None:
    """What the kubelet's restart at the startup deadline leaves for the operator's StartupTimeout: the
    runtime, stopped once its HTTP server answers (the model loading), exits 0 and names its phase."""
    runtime = RuntimeProcess(
        model=f"file://{tiny_model}", workdir=tmp_path / "run", extra_env=termination_env(tmp_path)
    ).start()
    try:
        assert runtime.proc is not None

        def live() -> bool:
            try:
                return runtime.get("/livez").status_code == 200
            except httpx.HTTPError:  # not listening yet: Python still imports torch and vLLM
                return False

        wait_until(live, "/livez 200", timeout=120, interval=0.2)
        assert runtime.get("/readyz").status_code == 503  # still loading
        runtime.proc.send_signal(signal.SIGTERM)
        assert runtime.proc.wait(timeout=EXIT_TIMEOUT_S) == 0, runtime.log_tail()
    finally:
        runtime.terminate()
    message = (tmp_path / "termination-log").read_text()
    found = re.fullmatch(
        r"StoppedWhileLoading: stopped (\d+)s after the process started, in start-up phase "
        r"(modelFetch|engineSetup) for (\d+)s \(done before it: imports ([\d.]+)s.*\)",
        message,
    )
    assert found, message
    assert float(found[4]) > 1.0  # torch and vLLM were imported before the HTTP server started
