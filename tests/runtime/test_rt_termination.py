"""Tier 3: a runtime that cannot start exits non-zero and leaves a termination message a person acts on.

The real engine on the tiny model; the file is the one the operator's pod template names in
PAGODA_TERMINATION_MESSAGE_PATH (the kubelet's terminationMessagePath).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from harness import VLLM_EXTRA, RuntimeProcess

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
    # 4 blocks of 32 tokens (vLLM's CPU attention wants a multiple of 32), one of them vLLM's null block:
    # the cache holds 96 tokens, 2048 do not fit.
    runtime = RuntimeProcess(
        model=f"file://{tiny_model}",
        workdir=tmp_path / "run",
        flags=["--max-model-len", "2048", "--block-size", "32", "--dtype", "float32"],
        extra_env=termination_env(tmp_path),
        vllm_extra=[*VLLM_EXTRA, "--num-gpu-blocks-override", "4"],
    )
    rc, message, log = run_to_exit(runtime)
    assert rc == 1, log[-3000:]
    match = re.match(
        r"ModelDoesNotFit: maxModelLen 2048 needs KV-cache space for 2048 tokens but the cache holds "
        r"(\d+) tokens.*; lower spec\.engine\.maxModelLen to at most (\d+), raise "
        r"spec\.engine\.gpuMemoryUtilization or add GPUs \(spec\.engine\.tensorParallelSize\)$",
        message,
    )
    assert match, message or log[-3000:]
    assert match.group(1) == match.group(2) == "96"


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
