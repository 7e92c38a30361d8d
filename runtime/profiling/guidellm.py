"""GuideLLM run against a server: the command line of `guidellm run` for the profile, its process (and the
worker processes it starts), and its JSON report read back (result.py summarizes it).

GuideLLM lives in a virtual environment of its own (it pins click and multidict lower than the runtime):
`--guidellm`, else `PAGODA_GUIDELLM` (the images set it), else `guidellm` on PATH (config.py). This module
never imports it: it runs GuideLLM's executable and reads its report as plain data.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pagoda.runtime.profiling.config import ProfileConfig
from pagoda.runtime.serving import termination

log = logging.getLogger("pagoda.runtime.profiling.guidellm")

GUIDELLM_WORKERS_ENV = "GUIDELLM__MAX_WORKER_PROCESSES"  # GuideLLM's own setting (default 10)
MAX_GUIDELLM_WORKERS = 10
SEED = 42
GUIDELLM_OVERHEAD_S = 120.0  # GuideLLM's own start and each step's set-up, on top of the steps' time


class ProfileFailed(Exception):
    """The server (profile.py) or GuideLLM (here) failed: `fatal` is the termination message."""

    def __init__(self, fatal: termination.Fatal) -> None:
        super().__init__(fatal.text())
        self.fatal = fatal


def guidellm_command(config: ProfileConfig, target: str, model: str, tokenizer: str, out: Path) -> list[str]:
    """`guidellm run` for the profile: the concurrent profile at each of `config.streams` (one benchmark
    each), synthetic prompts of exact lengths tokenized with the local folder `tokenizer` (GuideLLM looks the
    served name up on the hub without one), the server's /v1/models not checked first (validate_backend),
    no per-request samples kept (sample_size 0), JSON into `out`."""

    def arg(value: Mapping[str, Any]) -> str:
        return json.dumps(value, separators=(",", ":"))

    backend: dict[str, Any] = {
        "kind": "openai_http",
        "target": target,
        "model": model,
        "request_format": "/v1/chat/completions",
        "validate_backend": False,
    }
    if api_key := os.environ.get("PAGODA_API_KEY"):  # what serve requires of its clients (engine.py)
        backend["api_key"] = api_key
    data = {
        "kind": "synthetic_text",
        "prompt_tokens": config.prompt_tokens,
        "output_tokens": config.output_tokens,
    }
    return [
        config.guidellm,
        "run",
        "--disable-console-interactive",
        "--backend",
        arg(backend),
        "--tokenizer",
        arg({"kind": "hf_auto", "model": tokenizer}),
        "--data",
        arg(data),
        "--profile",
        arg({"kind": "concurrent"}),
        "--override",
        "profile.streams",
        ",".join(map(str, config.streams)),
        "--constraint",
        arg({"kind": "max_duration", "seconds": config.step_seconds}),
        "--metrics",
        arg({"kind": "generative", "sample_size": 0}),
        "--seed",
        arg({"kind": "static", "value": SEED}),
        "--output",
        arg({"kind": "json", "path": str(out)}),
    ]


def run_guidellm(config: ProfileConfig, target: str, model: str, tokenizer: str) -> dict[str, Any]:
    """Runs GuideLLM against `target` in a scratch folder (its working directory: it writes nothing else)
    and returns its report. Its console output goes to stderr, so that stdout carries only the result."""
    timeout = len(config.streams) * config.step_seconds + GUIDELLM_OVERHEAD_S * (1 + len(config.streams))
    # The tokenizer is a local folder: nothing to fetch, and nothing may be looked up on the hub.
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    # GuideLLM starts 10 worker processes whatever the machine; each busy one takes a core from the server
    # it measures (on 2 cores, 10 workers put the load average at 11 and doubled the time to first token).
    env.setdefault(GUIDELLM_WORKERS_ENV, str(guidellm_workers()))
    with tempfile.TemporaryDirectory(prefix="pagoda-profile-") as scratch:
        report = Path(scratch) / "report.json"
        cmd = guidellm_command(config, target, model, tokenizer, report)
        log.info(
            "Started GuideLLM target=%s model=%s streams=%s", target, model, cmd[cmd.index("--override") + 2]
        )
        started = time.monotonic()
        try:
            # A session of its own: its worker processes outlive a signal to GuideLLM's main process alone.
            proc = subprocess.Popen(cmd, cwd=scratch, env=env, stdout=sys.stderr, start_new_session=True)
        except OSError as exc:
            raise ProfileFailed(load_failed(f"GuideLLM could not start ({exc})")) from None
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise ProfileFailed(load_failed(f"GuideLLM did not finish in {timeout:.0f}s")) from None
        finally:
            _stop_group(proc)
        log.info("Finished GuideLLM exit_code=%d seconds=%.1f", code, time.monotonic() - started)
        if code != 0:
            raise ProfileFailed(load_failed(f"GuideLLM exited with status {code}"))
        try:
            loaded: dict[str, Any] = json.loads(report.read_text())
        except (OSError, ValueError) as exc:
            raise ProfileFailed(load_failed(f"GuideLLM's report cannot be read ({exc})")) from None
    return loaded


def guidellm_workers() -> int:
    """GuideLLM's worker processes: the cores this process may run on, at most MAX_GUIDELLM_WORKERS (each
    worker drives many streams with asyncio)."""
    return max(1, min(MAX_GUIDELLM_WORKERS, len(os.sched_getaffinity(0))))


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Ends every process of `proc`'s session (GuideLLM, its manager and workers, which outlive its main
    process): SIGTERM to a GuideLLM still running, 10 s, then SIGKILL to whatever of the session is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10.0)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def load_failed(what: str) -> termination.Fatal:
    return termination.Fatal(
        "ProfileLoadFailed",
        f"{what}; see the container log for GuideLLM's output (the profile is not retried)",
    )
