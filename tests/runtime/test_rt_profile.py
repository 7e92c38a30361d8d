"""Tier 3: `pagoda-runtime profile --target` against the tier's shared runtime (the real engine and the tiny
model), with GuideLLM from `make guidellm` (.pagoda-dev/guidellm: its own environment, as in the image): a
short run within a generous SLO reaches a step; within an impossible one, none. The profile's own server
start (without --target) is the operator's Job, run on real pods in tier 4."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from subprocess import PIPE
from typing import Any

import pytest
from rt_harness import RUNTIME, RuntimeProcess

from tests.repo import REPO

pytestmark = pytest.mark.runtime

TIMEOUT_S = 120
GUIDELLM = Path(os.environ.get("PAGODA_GUIDELLM", REPO / ".pagoda-dev" / "guidellm" / "bin" / "guidellm"))


def profile(server: RuntimeProcess, model: Path, out: Path, *flags: str) -> dict[str, Any]:
    """`pagoda-runtime profile` against `server` with small requests; its result, after checking that it
    exited 0 and printed the same result as its last line."""
    assert GUIDELLM.is_file(), f"{GUIDELLM} is missing: run `make guidellm`"
    argv = [RUNTIME, "profile", "--model", f"file://{model}", "--served-model-name", "tiny"]
    argv += ["--target", server.url, "--tokenizer", str(model), "--guidellm", str(GUIDELLM)]
    argv += ["--prompt-tokens", "24", "--output-tokens", "8", "--result", str(out), *flags]
    env = {key: value for key, value in os.environ.items() if key != "PAGODA_API_KEY"}
    # A session of its own: on a timeout GuideLLM and its workers go too, not only the profile.
    proc = subprocess.Popen(argv, stdout=PIPE, stderr=PIPE, text=True, env=env, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"the profile did not finish in {TIMEOUT_S} s:\n{stderr[-6000:]}")
    assert proc.returncode == 0, stderr[-4000:]
    result: dict[str, Any] = json.loads(out.read_text())
    assert json.loads(stdout.strip().splitlines()[-1]) == result
    assert len(out.read_bytes()) <= 4000
    return result


def test_within_a_generous_slo_the_profile_reaches_a_step(
    server: RuntimeProcess, tiny_model: Path, tmp_path: Path
) -> None:
    slo = ["--slo-ttft-ms", "60000", "--slo-itl-ms", "10000"]
    result = profile(server, tiny_model, tmp_path / "result", *slo, "--streams", "1,2", "--step-seconds", "2")
    assert result["slo"] == {"ttftMs": 60000.0, "interTokenMs": 10000.0}
    assert result["shape"] == {"promptTokens": 24, "outputTokens": 8}
    steps = result["steps"]
    assert [step["concurrency"] for step in steps] == [1, 2]
    for step in steps:
        assert step["requests"] > 0 and step["errors"] == 0, step
        assert step["ttftP95Ms"] > 0 and step["interTokenP95Ms"] > 0, step
        assert step["requestsPerSecond"] > 0 and step["outputTokensPerSecond"] > 0, step
    assert steps[0]["meetsSlo"] is True
    assert result["concurrency"] in (1, 2)
    chosen = next(step for step in steps if step["concurrency"] == result["concurrency"])
    assert result["requestsPerSecond"] == chosen["requestsPerSecond"]
    assert result["outputTokensPerSecond"] == chosen["outputTokensPerSecond"]


def test_within_an_impossible_slo_no_step_meets_it(
    server: RuntimeProcess, tiny_model: Path, tmp_path: Path
) -> None:
    slo = ["--slo-ttft-ms", "0.001", "--slo-itl-ms", "10000"]
    result = profile(server, tiny_model, tmp_path / "result", *slo, "--streams", "1,2", "--step-seconds", "2")
    assert [step["concurrency"] for step in result["steps"]] == [1, 2]
    assert all(step["requests"] > 0 and step["meetsSlo"] is False for step in result["steps"])
    assert result["concurrency"] is None
    assert result["requestsPerSecond"] is None and result["outputTokensPerSecond"] is None
