"""Tier 1: the runtime's start-up phases (runtime/serving/startup.py): timed in order, vLLM's own timings of
its engine's parts taken from its log records, reported on /metrics and in a termination message."""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from metric_contract import STARTUP_METRICS
from prometheus_client.parser import text_string_to_metric_families

from pagoda.runtime.serving import termination
from pagoda.runtime.serving.metrics import ServerStatus, render
from pagoda.runtime.serving.startup import (
    PHASES,
    TIMINGS_ENV,
    VLLM_TIMINGS,
    StartupClock,
    VllmTimings,
    folder_bytes,
    read_timings,
    register,
    vllm_phase,
)


@pytest.fixture
def vllm_logger() -> Iterator[logging.Logger]:
    """vLLM's logger at the level vLLM configures it to (INFO); restored after."""
    logger = logging.getLogger("vllm")
    level = logger.level
    logger.setLevel(logging.INFO)
    yield logger
    logger.setLevel(level)


def test_phases_are_timed_in_order_from_the_process_start() -> None:
    clock = StartupClock(started_at=time.time() - 2.0)  # as if Python's imports took 2 s
    assert clock.current == "imports"
    clock.begin("modelFetch")
    time.sleep(0.05)
    clock.begin("engineSetup")
    clock.begin("apiServer")
    assert clock.current == "apiServer" and clock.ready_at is None
    clock.ready()
    assert clock.current is None and clock.ready_at is not None
    assert list(clock.phases) == ["imports", "modelFetch", "engineSetup", "apiServer"]
    assert 1.9 < clock.phases["imports"] < 10
    assert clock.phases["modelFetch"] >= 0.05
    assert clock.total() == pytest.approx(sum(clock.phases.values()))
    assert clock.payload().seconds == pytest.approx(clock.total(), abs=0.001)


def test_the_start_is_the_processs_creation_not_the_moment_it_asks() -> None:
    """A child asks one second after it started: the answer is when it was spawned (within the boot time's
    fraction of a second, which Linux truncates), not the time of asking."""
    code = (
        "import time; time.sleep(1); from pagoda.runtime.serving.startup import process_started; "
        "print(process_started(), time.time())"
    )
    spawned = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    started, asked = map(float, out.stdout.split())
    assert spawned - 1.5 < started < spawned + 1.0
    assert asked - started > 0.5


def test_an_unknown_phase_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'warmup'.*imports, modelFetch"):
        StartupClock().begin("warmup")


def test_vllms_weight_load_and_engine_init_are_split_out_of_the_engine_start(
    vllm_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The plugin's handler in a vLLM process (here this one) writes the file the runtime reads back."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    clock = StartupClock(started_at=time.time())
    clock.begin("engineSetup")
    clock.expect_vllm_timings()
    handlers = list(vllm_logger.handlers)
    register()
    register()  # vLLM may load its plugins more than once in a process: one handler
    added = [h for h in vllm_logger.handlers if h not in handlers]
    assert len(added) == 1
    try:
        loader = logging.getLogger("vllm.model_executor.model_loader.default_loader")
        loader.info("Loading weights took %.2f seconds", 0.02)
        loader.info("Loading weights took %.2f seconds", 0.01)  # another tensor-parallel worker: the longest
        time.sleep(0.1)
        logging.getLogger("vllm.v1.engine.core").info(
            "init engine (profile, create kv cache, warmup model) took %.2f s (compilation: %.2f s)",
            0.05,
            0.01,
        )
        logging.getLogger("vllm.v1.engine.core").info("Loading weights took many seconds")  # no number
        clock.read_vllm_timings()
    finally:
        vllm_logger.removeHandler(added[0])
    assert TIMINGS_ENV not in os.environ and not list(tmp_path.iterdir())  # the file read and removed
    clock.begin("apiServer")
    clock.ready()
    assert clock.phases["weightLoad"] == 0.02 and clock.phases["engineInit"] == 0.05
    assert 0.03 < clock.phases["engineSetup"] < 5  # the 0.1 s slept, less the 0.07 s vLLM timed
    assert [p for p in PHASES if p in clock.phases] == list(clock.payload().phases)


def test_without_the_plugin_the_engine_start_is_one_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TIMINGS_ENV, raising=False)
    register()  # no file named: installs nothing
    assert not any(isinstance(h, VllmTimings) for h in logging.getLogger("vllm").handlers)
    clock = StartupClock(started_at=time.time())
    clock.begin("engineSetup")
    clock.read_vllm_timings()
    clock.ready()
    assert "weightLoad" not in clock.phases and "engineSetup" in clock.phases


def test_parts_longer_than_the_engine_start_are_not_subtracted(tmp_path: Path) -> None:
    timings = tmp_path / "t.jsonl"
    lines = ['{"phase": "weightLoad", "seconds": 3600}', "not json", '{"phase": "other", "seconds": 1}']
    timings.write_text("\n".join(lines) + "\n")
    assert read_timings(str(timings)) == {"weightLoad": 3600.0}
    clock = StartupClock(started_at=time.time())
    clock.begin("engineSetup")
    clock.engine_parts["weightLoad"] = 3600.0
    clock.ready()
    assert "weightLoad" not in clock.phases and clock.phases["engineSetup"] >= 0


def test_vllm_still_logs_the_timings_the_phases_read() -> None:
    """A vLLM upgrade that rewords these lines would silently merge the phases into engineSetup."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    sources = [
        root / "model_executor" / "model_loader" / "default_loader.py",
        root / "v1" / "engine" / "core.py",
    ]
    text = "".join(path.read_text() for path in sources)
    for template in VLLM_TIMINGS:
        assert f'"{template}"' in text or f'"{template} "' in text, template
    assert vllm_phase("init engine (profile, create kv cache, warmup model) took %.2f s (x)") == "engineInit"
    assert vllm_phase("Loading weights took %.2f seconds and more") is None


def test_phases_on_metrics_once_ready() -> None:
    clock = StartupClock(started_at=time.time())
    status = ServerStatus(model_name="tiny", startup=clock)
    before = render(status, None).decode()
    assert "pagoda_startup_phase_seconds" not in before  # loading: nothing to observe yet
    clock.phases = {"imports": 12.0, "modelFetch": 0.4, "engineSetup": 30.0}
    clock.model_bytes, clock.fetched_bytes = 5_000_000, 0
    clock.ready_at = time.time()
    samples = [s for f in text_string_to_metric_families(render(status, None).decode()) for s in f.samples]
    names = {s.name for s in samples}
    assert names >= STARTUP_METRICS
    sums = {s.labels["phase"]: s.value for s in samples if s.name == "pagoda_startup_phase_seconds_sum"}
    assert sums == {"imports": 12.0, "modelFetch": 0.4, "engineSetup": 30.0}
    buckets = {
        (s.labels["phase"], s.labels["le"]): s.value
        for s in samples
        if s.name == "pagoda_startup_phase_seconds_bucket"
    }
    assert buckets[("imports", "10.0")] == 0 and buckets[("imports", "20.0")] == 1
    assert buckets[("modelFetch", "0.5")] == 1 and buckets[("engineSetup", "+Inf")] == 1
    size = [s.value for s in samples if s.name == "pagoda_startup_model_bytes"]
    assert size == [5_000_000]
    assert [s.value for s in samples if s.name == "pagoda_startup_fetched_bytes"] == [0]
    load = [s.value for s in samples if s.name == "pagoda_model_load_seconds"]
    assert load == [pytest.approx(42.4)]


def test_a_stop_while_loading_names_the_phase_it_came_in() -> None:
    clock = StartupClock(started_at=time.time() - 14)
    clock.begin("modelFetch")
    clock.model_bytes = None
    fatal = termination.stopped_while_loading(clock)
    assert fatal.reason == "StoppedWhileLoading"
    assert "in start-up phase modelFetch for 0s" in fatal.message
    assert "imports 14." in fatal.message or "imports 13." in fatal.message


def test_folder_bytes_counts_the_files(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 5)
    assert folder_bytes(tmp_path) == 15
    assert folder_bytes(tmp_path / "a") == 10
