"""Where a runtime's start-up time goes: its phases, timed as they happen.

A pod's cold start is the kubelet's part (scheduling, image pull, container start: the operator reads those
from the Pod) and the runtime's, timed here from the process's own start (its creation time, so Python's
imports of torch and vLLM count) to the moment /readyz first answers 200. The runtime's phases, disjoint and
in order:

  imports      the process's start to the runtime's first line of work (Python, torch, vLLM imported)
  modelFetch   resolving the model: a download for hf:// and s3:// (modelBytes: the folder's size), a check
               of the folder for file:// and pvc://
  engineSetup  the engine's start other than the two phases below (its configuration, the EngineCore
               process started and its imports, the tokenizer)
  weightLoad   vLLM loading the weights (its "Loading weights took ..." line)
  engineInit   vLLM's profiling, KV-cache allocation, compilation and warm-up ("init engine ... took")
  apiServer    the OpenAI app built over the engine and the --lora adapters loaded

vLLM times weightLoad and engineInit itself, in its EngineCore process (spawned on the CPU backend, forked or
spawned on GPUs). `register`, a vLLM general plugin like runtime/serving/enginefailure.py's, installs a
logging handler in each vLLM process that appends those two lines' seconds to a file the runtime names in the
environment; the runtime takes them out of engineSetup. Without the plugin (VLLM_PLUGINS excludes it) or with
vLLM's log level above INFO they stay in engineSetup.

`/v1/pagoda/capacity` carries them (`startup`) once the pod is ready, `/metrics` as the histogram
`pagoda_startup_phase_seconds{phase}`; a runtime stopped while it loads writes the phase it was in to its
termination message (termination.stopped_while_loading), which the operator puts in StartupTimeout.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped,unused-ignore]

from pagoda import contract
from pagoda.contract import payloads
from pagoda.runtime.serving.enginefailure import FileReport, add_vllm_handler, prepare_file

PHASES = contract.STARTUP_PHASES
TIMINGS_ENV = "PAGODA_STARTUP_TIMINGS_PATH"

# vLLM 0.32's log records that time parts of its start, by their format string (the record's `msg`, not
# the formatted text): model_loader/default_loader.py and v1/engine/core.py. Each carries seconds as its
# first argument. tests/unit/test_runtime_startup.py checks that the installed vLLM still logs them.
VLLM_TIMINGS = {
    "Loading weights took %.2f seconds": "weightLoad",
    "init engine (profile, create kv cache, warmup model) took %.2f s": "engineInit",
}


def vllm_phase(template: str) -> str | None:
    """The phase a vLLM log record's format string times (the compile-time variants of engineInit's line
    start the same way); None for any other record."""
    for prefix, phase in VLLM_TIMINGS.items():
        if template == prefix or template.startswith(prefix + " ("):
            return phase
    return None


class VllmTimings(FileReport):
    """Appends the seconds of the vLLM records named in VLLM_TIMINGS to `path`, one JSON line each. Installed
    by `register` in each of vLLM's processes (they are spawned: nothing of the runtime's memory is there)."""

    def emit(self, record: logging.LogRecord) -> None:
        phase = vllm_phase(str(record.msg))
        if phase is None or not isinstance(record.args, tuple) or not record.args:
            return
        first = record.args[0]
        if not isinstance(first, int | float) or not math.isfinite(first) or first < 0:
            return
        try:
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(json.dumps({"phase": phase, "seconds": float(first)}) + "\n")
        except OSError:
            pass  # nowhere to write (or the runtime moved on): those seconds stay in engineSetup


def register() -> None:
    """The vLLM general plugin (entry point group `vllm.general_plugins`, as
    runtime/serving/enginefailure.py): runs in each vLLM process, possibly more than once."""
    add_vllm_handler(TIMINGS_ENV, VllmTimings)


def read_timings(path: str) -> dict[str, float]:
    """phase -> seconds from a timings file (the longest per phase: tensor-parallel workers each load their
    shard at once); the file is removed."""
    found: dict[str, float] = {}
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        Path(path).unlink(missing_ok=True)
    except OSError:
        return found
    for line in lines:
        try:
            item = json.loads(line)
            phase, seconds = str(item["phase"]), float(item["seconds"])
        except (ValueError, KeyError, TypeError):
            continue
        if phase in VLLM_TIMINGS.values() and math.isfinite(seconds) and seconds >= 0:
            found[phase] = max(found.get(phase, 0.0), seconds)
    return found


def process_started() -> float:
    """This process's creation time (seconds since the epoch)."""
    try:
        return float(psutil.Process().create_time())
    except psutil.Error:
        return time.time()


@dataclass
class StartupClock:
    """The runtime's start-up phases as they pass. `begin(phase)` ends the phase before it; `ready()` ends
    the last. Wall-clock times (the operator compares them with the Pod's timestamps) come from
    `time.time()`, durations from the monotonic clock."""

    started_at: float = field(default_factory=process_started)  # epoch seconds: the process's creation
    phases: dict[str, float] = field(default_factory=dict)  # phase -> seconds, in PHASES order when done
    engine_parts: dict[str, float] = field(default_factory=dict)  # weightLoad/engineInit, from vLLM's log
    model_bytes: int | None = None
    fetched_bytes: int | None = None  # what modelFetch downloaded: 0 on a cache hit (modelcache.py)
    ready_at: float | None = None  # epoch seconds
    current: str | None = None
    _since: float = field(default=0.0, init=False)  # monotonic: the current phase's start

    def __post_init__(self) -> None:
        # imports: from the process's creation to now, carried over to the monotonic clock.
        self._since = time.monotonic() - max(0.0, time.time() - self.started_at)
        self.current = "imports"

    def begin(self, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown start-up phase {phase!r}; one of {', '.join(PHASES)}")
        now = time.monotonic()
        self._end(now)
        self.current, self._since = phase, now

    def ready(self) -> None:
        self._end(time.monotonic())
        self.current, self.ready_at = None, time.time()

    def _end(self, now: float) -> None:
        if self.current is None:
            return
        seconds = max(0.0, now - self._since)
        # The engine's start less the parts vLLM timed itself (parts longer than the whole are not this
        # start's: never seen, but then the whole counts as engineSetup).
        parts = dict(self.engine_parts) if self.current == "engineSetup" else {}
        if sum(parts.values()) > seconds:
            parts = {}
        self.phases[self.current] = self.phases.get(self.current, 0.0) + seconds - sum(parts.values())
        self.phases.update(parts)

    def in_phase(self) -> float:
        """Seconds in the current phase so far."""
        return max(0.0, time.monotonic() - self._since) if self.current is not None else 0.0

    def expect_vllm_timings(self) -> None:
        """Ask vLLM's processes (started after this) for their timings (VLLM_TIMINGS), through a file named
        in the environment they inherit."""
        prepare_file(TIMINGS_ENV, "pagoda-startup-timings", ".jsonl")

    def read_vllm_timings(self) -> None:
        """What vLLM's processes reported, as weightLoad/engineInit (ended with engineSetup)."""
        path = os.environ.pop(TIMINGS_ENV, None)
        if path:
            self.engine_parts.update(read_timings(path))

    def total(self) -> float:
        return sum(self.phases.values())

    def payload(self) -> payloads.StartupRecord:
        """What /v1/pagoda/capacity reports under `startup` (once ready)."""
        optional: dict[str, Any] = {
            "ready_at": contract.rfc3339(self.ready_at) if self.ready_at is not None else None,
            "model_bytes": self.model_bytes,
            "fetched_bytes": self.fetched_bytes,
        }
        return payloads.StartupRecord(
            started_at=contract.rfc3339(self.started_at),
            seconds=round(self.total(), 3),
            phases={name: round(self.phases[name], 3) for name in PHASES if name in self.phases},
            **{name: value for name, value in optional.items() if value is not None},
        )

    def summary(self) -> str:
        """One line for a log or a termination message: `imports 14.2s, modelFetch 3.1s (12 MB)`."""
        parts = []
        for name in PHASES:
            if name in self.phases:
                fetched = self.model_bytes if name == "modelFetch" else None
                size = f" ({fetched / 1e6:.0f} MB)" if fetched else ""
                parts.append(f"{name} {self.phases[name]:.1f}s{size}")
        return ", ".join(parts) or "none"


def folder_bytes(path: Path) -> int:
    """The size of the regular files under `path` (a model folder; links followed once, as vLLM reads)."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for item in path.rglob("*"):
        try:
            if item.is_file():
                total += item.stat().st_size
        except OSError:
            continue
    return total
