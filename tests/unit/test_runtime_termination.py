"""Tier 1: fatal start-up errors become `<Reason>: <message>` termination messages naming the field to change.

The KV-cache case feeds the classifier the error that vLLM's own check raises (the pinned vLLM, imported, not
run as an engine), so a change of vLLM's wording fails here before it reaches a cluster.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagoda.runtime.models.modeluri import ModelSourceError, parse_model_uri
from pagoda.runtime.models.sources import resolve
from pagoda.runtime.serving import enginefailure, termination
from pagoda.runtime.serving.enginefailure import EngineFailure

GiB = 1024**3
CORE_FAILED = RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")


def vllm_kv_cache_error(max_model_len: int, needed: int, available: int, estimate: int) -> str:
    kv = pytest.importorskip("vllm.v1.core.kv_cache_utils")
    with pytest.raises(ValueError) as caught:
        kv._check_enough_kv_cache_memory(available, lambda: needed, max_model_len, lambda _: estimate)
    return str(caught.value)


# What vLLM 0.32's EngineCore raised on the CPU backend for the tiny model with VLLM_CPU_KVCACHE_SPACE=1,
# --max-model-len 262144 and VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (copied from the runtime's log).
OBSERVED_KV_TOO_SMALL = (
    "To serve at least one request with the model's max seq len (262144), (2.0 GiB KV cache is needed, "
    "which is larger than the available KV cache memory (1.0 GiB). Based on the available memory, the "
    "estimated maximum model length is 130944. Try increasing `gpu_memory_utilization` (which also controls "
    "CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine. See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
)


def test_kv_cache_too_small_observed_on_cpu_names_the_arithmetic_and_the_knobs() -> None:
    root = EngineFailure("ValueError", OBSERVED_KV_TOO_SMALL)
    fatal = termination.engine_start(CORE_FAILED, root, max_model_len=262144, cpu_kv_space="1")
    assert fatal.text() == (
        "ModelDoesNotFit: spec.engine.maxModelLen=262144 needs 2.0 GiB of KV cache but 1.0 GiB is available; "
        "lower spec.engine.maxModelLen to at most 130944, or raise spec.engine.gpuMemoryUtilization, or add "
        "GPUs with spec.engine.tensorParallelSize (on CPU: raise VLLM_CPU_KVCACHE_SPACE in spec.runtime.env, "
        "now 1 GiB)"
    )


def test_kv_cache_too_small_names_the_numbers_and_the_fields() -> None:
    text = vllm_kv_cache_error(4096, needed=2 * GiB, available=GiB // 2, estimate=1024)
    fatal = termination.engine_start(CORE_FAILED, EngineFailure("ValueError", text), max_model_len=4096)
    assert fatal.text() == (
        "ModelDoesNotFit: spec.engine.maxModelLen=4096 needs 2.0 GiB of KV cache but 0.5 GiB is available; "
        "lower spec.engine.maxModelLen to at most 1024, or raise spec.engine.gpuMemoryUtilization, or add "
        "GPUs with spec.engine.tensorParallelSize"
    )


def test_kv_cache_too_small_to_show_in_gib_names_tokens() -> None:
    text = vllm_kv_cache_error(2048, needed=2048 * 8192, available=96 * 8192, estimate=96)
    fatal = termination.engine_start(CORE_FAILED, EngineFailure("ValueError", text), max_model_len=2048)
    assert fatal.message.startswith(
        "spec.engine.maxModelLen=2048 needs KV cache for 2048 tokens but only 96 fit; "
        "lower spec.engine.maxModelLen to at most 96, or raise"
    )


def test_kv_cache_smaller_than_one_block_and_the_models_own_length() -> None:
    text = vllm_kv_cache_error(2048, needed=GiB, available=1, estimate=0)
    fatal = termination.engine_start(CORE_FAILED, EngineFailure("ValueError", text), max_model_len=None)
    assert fatal.reason == "ModelDoesNotFit"
    assert fatal.message.startswith(
        "the model's context length 2048 (spec.engine.maxModelLen unset) needs KV cache for 2048 tokens but "
        "not even one block fits; raise spec.engine.gpuMemoryUtilization"
    )
    assert "at most" not in fatal.message


def test_no_memory_left_for_the_cache() -> None:
    kv = pytest.importorskip("vllm.v1.core.kv_cache_utils")
    with pytest.raises(ValueError) as caught:
        kv._check_enough_kv_cache_memory(0, lambda: 1, 16, lambda _: 0)
    fatal = termination.engine_start(CORE_FAILED, EngineFailure("ValueError", str(caught.value)), 16)
    assert fatal.reason == "ModelDoesNotFit"
    assert "spec.engine.gpuMemoryUtilization" in fatal.message


def test_max_model_len_longer_than_the_model() -> None:
    # vLLM raises it in the runtime's own process (while building the config), wrapped by pydantic.
    error = ValueError(
        "1 validation error for ModelConfig\n  Value error, User-specified max_model_len (8192) is greater "
        "than the derived max_model_len (max_position_embeddings=2048.0 or model_max_length=None in model's "
        "config.json). To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
    )
    fatal = termination.engine_start(error, None, max_model_len=8192)
    assert fatal.reason == "MaxModelLenTooLarge"
    assert "lower spec.engine.maxModelLen to at most 2048" in fatal.message


def test_gpu_out_of_memory_while_loading() -> None:
    root = EngineFailure("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB")
    assert termination.engine_start(CORE_FAILED, root, None).reason == "ModelDoesNotFit"


def test_unreadable_weights_are_model_invalid() -> None:
    root = EngineFailure("SafetensorError", "Error while deserializing header: incomplete metadata")
    fatal = termination.engine_start(CORE_FAILED, root, None)
    assert fatal.reason == "ModelInvalid" and "(spec.model.uri)" in fatal.message


def test_anything_else_is_engine_start_failed_with_the_root_cause() -> None:
    root = EngineFailure("KeyError", "'model.layers.0.weight'")
    fatal = termination.engine_start(CORE_FAILED, root, None)
    assert fatal.reason == "EngineStartFailed"
    assert "KeyError: 'model.layers.0.weight'" in fatal.message
    # Without a report, the runtime's own view.
    assert "Engine core initialization failed" in termination.engine_start(CORE_FAILED, None, None).message


def test_model_source_errors_keep_their_reason_and_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError) as caught:
        resolve(parse_model_uri("file:///models/nope"), str(tmp_path))
    fatal = termination.model_source(caught.value.reason, str(caught.value))
    assert fatal.text().startswith(
        "ModelNotFound: model file:///models/nope: /models/nope does not exist or is not a directory "
        "(spec.model.uri); fix spec.model.uri"
    )
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelSourceError) as caught:
        resolve(parse_model_uri(f"file://{tmp_path}/empty"), str(tmp_path))
    assert caught.value.reason == "ModelInvalid"


def test_write_goes_to_the_env_path_and_is_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "termination-log"
    monkeypatch.setenv(termination.PATH_ENV, str(target))
    termination.write(termination.Fatal("ModelNotFound", "é" * 5000))
    data = target.read_bytes()
    assert data.startswith(b"ModelNotFound: ") and len(data) <= termination.MAX_BYTES
    data.decode("utf-8")  # never cut inside a character
    monkeypatch.delenv(termination.PATH_ENV)
    termination.write(termination.Fatal("X", "not written anywhere"))  # no path: only logged


def test_engine_processes_report_the_first_start_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import logging

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    path = enginefailure.prepare_report()
    logger = logging.getLogger("vllm.v1.engine.core")
    enginefailure.register()
    enginefailure.register()  # vLLM may load plugins more than once per process
    reporters = [
        h for h in logging.getLogger("vllm").handlers if isinstance(h, enginefailure.StartFailureReporter)
    ]
    try:
        assert len(reporters) == 1
        logger.error("Something else failed.", exc_info=ValueError("not a start failure"))
        assert not Path(path).exists()
        for message, exc in (
            ("WorkerProc failed to start.", ValueError("root cause")),
            ("EngineCore failed to start.", RuntimeError("because of the worker")),
        ):
            try:
                raise exc
            except Exception:
                logger.exception(message)
        assert json.loads(Path(path).read_text()) == {"type": "ValueError", "message": "root cause"}
        assert enginefailure.read_report(path) == EngineFailure("ValueError", "root cause")
        assert not Path(path).exists() and enginefailure.read_report(path) is None
    finally:
        for handler in reporters:
            logging.getLogger("vllm").removeHandler(handler)


def test_a_local_model_that_is_not_there_fails_before_the_engine_is_imported(tmp_path: Path) -> None:
    """`serve` checks a file:// or pvc:// model before it imports torch and vLLM (runtime/cli.py): exit 1,
    the termination message, and neither library loaded."""
    import subprocess
    import sys

    message = tmp_path / "termination-log"
    probe = (
        "import sys; from pagoda.runtime.cli import main; "
        f"rc = main(['serve', '--model', 'file://{tmp_path}/nope']); "
        "print(rc, sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    )
    env = {"PAGODA_TERMINATION_MESSAGE_PATH": str(message), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split("\n")[0] == "1 []", done.stdout + done.stderr
    assert f"Failed to load model uri=file://{tmp_path}/nope error=ModelSourceError" in done.stderr
    assert message.read_text().startswith(f"ModelNotFound: model file://{tmp_path}/nope: ")
