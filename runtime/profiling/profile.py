"""`pagoda-runtime profile`: what one replica can do within a latency SLO, measured with GuideLLM.

The operator runs it in a Job made from a replica's container (spec.slo): the replica's `serve` flags with
`serve` replaced by `profile` and the profile's flags appended. Without `--target` it starts
`pagoda-runtime serve` with those flags as a child process, waits until its /readyz answers 200, and loads
it with GuideLLM (`guidellm run`, docs/design/2026-12-04-capacity-profiling-generator.md): streamed chat
completions of synthetic prompts of exactly `--prompt-tokens` tokens asking for exactly `--output-tokens`
tokens, at each concurrency of `--streams` for `--step-seconds`, with the model's own tokenizer folder (no
hub). It then stops the server and writes a compact JSON result (result.py) to `--result` (the container's
termination message, which the operator copies into status.profile) and to stdout as one line.

With `--tune-engine` it profiles more servers, each restarted with other batch settings for the ones the
flags leave unset (runtime/profiling/tune.py), and the result is the best's, with an `engine` key saying what
was tried, what won and its goodput against the replica's own settings.

This module starts, waits for and stops the servers and drives the tuning; config.py has the profile's flags,
guidellm.py runs GuideLLM, result.py reads its report into the result (contract/payloads.py ProfileResult).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import ValidationError

from pagoda import contract
from pagoda.contract.payloads import Capacity, ProfileResult
from pagoda.runtime.profiling import tune
from pagoda.runtime.profiling.config import ProfileConfig, serve_argv
from pagoda.runtime.profiling.guidellm import ProfileFailed, load_failed, run_guidellm
from pagoda.runtime.profiling.result import fit, result_json, summarize
from pagoda.runtime.serving import termination
from pagoda.runtime.serving.config import ServeConfig

log = logging.getLogger("pagoda.runtime.profiling.profile")

READY_TIMEOUT_S = 1800.0  # for the child server's /readyz: the model's download and the engine's start
STOP_TIMEOUT_S = 120.0  # for the child server to exit after SIGTERM (its drain), before SIGKILL


def _server_failed(what: str) -> termination.Fatal:
    return termination.Fatal(
        "ProfileServerFailed",
        f"{what}; the profile runs the replica's own runtime: fix what stops a replica from starting",
    )


def _local_url(serve: ServeConfig) -> str:
    """Where this process reaches the child server: its --host, or loopback for a wildcard."""
    host = serve.host if serve.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
    return f"http://[{host}]:{serve.port}" if ":" in host else f"http://{host}:{serve.port}"


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


class _Stop(Exception):
    """SIGTERM or SIGINT arrived: the profile stops, and its server with it."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


def start_server(argv: Sequence[str], extra: Sequence[str], message: Path) -> subprocess.Popen[bytes]:
    """`pagoda-runtime serve` with `argv` (and `extra` after `--`) as a child process; its termination
    message goes to `message`, its output to this process's stderr."""
    cmd = [sys.executable, "-m", "pagoda.runtime.cli", "serve", *argv]
    if extra:
        cmd += ["--", *extra]
    env = dict(os.environ, **{contract.TERMINATION_MESSAGE_ENV: str(message)})
    log.info("Started server command=%r", cmd)
    return subprocess.Popen(cmd, env=env, stdout=sys.stderr)


def wait_ready(child: subprocess.Popen[bytes], url: str, message: Path, timeout: float) -> None:
    """Until the child's /readyz answers 200; ProfileFailed when it exits first or takes over `timeout`."""
    deadline = time.monotonic() + timeout
    while not _ready(url):
        code = child.poll()
        if code is not None:
            said = message.read_text(errors="replace").strip() if message.exists() else ""
            raise ProfileFailed(
                _server_failed(
                    f"the runtime exited with status {code} before it was ready"
                    + (f" ({said})" if said else "")
                )
            )
        if time.monotonic() > deadline:
            raise ProfileFailed(_server_failed(f"the runtime was not ready after {timeout:.0f}s"))
        time.sleep(1.0)


def stop_server(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after STOP_TIMEOUT_S."""
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    log.info("Stopped server exit_code=%s", child.returncode)


def _tokenizer_dir(serve: ServeConfig) -> str:
    """The model's folder, as serve made it local (a download is in its cache by now)."""
    from pagoda.runtime.models import modeluri, sources

    try:
        path = sources.resolve(modeluri.parse_model_uri(serve.model), serve.cache_dir, serve.revision)
    except modeluri.ModelSourceError as exc:
        raise ProfileFailed(termination.model_source(exc.reason, str(exc))) from None
    return str(path)


def measure(serve: ServeConfig, config: ProfileConfig, argv: Sequence[str]) -> ProfileResult:
    """The profile's result: against `config.target`, or against a child server started with `argv`
    (and, with --tune-engine, the best of several: `tune_engine`)."""
    if config.target is not None:
        assert config.tokenizer is not None
        report = run_guidellm(config, config.target, serve.name, config.tokenizer)
        return _summary(report, config)
    if config.tune_engine:
        return tune_engine(serve, config, argv)
    measured = profile_server(serve, config, argv, tune.Batch()).result
    assert measured is not None  # profile_server raises ProfileFailed rather than return a run without one
    return measured


def profile_server(
    serve: ServeConfig, config: ProfileConfig, argv: Sequence[str], batch: tune.Batch
) -> tune.Run:
    """Starts `serve` with `argv` and `batch`'s flags, profiles it and stops it. ProfileFailed when the
    server does not start or the load fails."""
    with tempfile.TemporaryDirectory(prefix="pagoda-profile-serve-") as scratch:
        message = Path(scratch) / "termination-log"
        child = start_server([*serve_argv(argv), *batch.flags()], serve.extra_args, message)
        try:
            url = _local_url(serve)
            wait_ready(child, url, message, READY_TIMEOUT_S)
            limits = batch_limits(url)
            log.info("Server ready url=%s limits=%s", url, limits)
            tokenizer = config.tokenizer or _tokenizer_dir(serve)
            report = run_guidellm(config, url, serve.name, tokenizer)
        finally:
            stop_server(child)
    return tune.Run(batch, limits, _summary(report, config))


def tune_engine(serve: ServeConfig, config: ProfileConfig, argv: Sequence[str]) -> ProfileResult:
    """The replica's own settings profiled first (the baseline: its failure is the profile's), then the
    token budgets and batch widths tune.py proposes, each a server of its own (one that fails is reported
    and skipped), keeping one server for the baseline again when a candidate beats it (tune.choose then
    compares with its better run); the result is the chosen run's, with `engine` (tune.engine_result)."""
    free = tune.tunable(serve)
    runs = [profile_server(serve, config, argv, tune.Batch())]
    for batch in tune.budget_candidates(runs[0], free)[: config.tune_max_runs - 2]:
        runs.append(_candidate(serve, config, argv, batch))
    room = config.tune_max_runs - 1 - len(runs)
    request_tokens = config.prompt_tokens + config.output_tokens
    for batch in tune.width_candidates(tune.choose(runs), runs[0], free, request_tokens, room):
        runs.append(_candidate(serve, config, argv, batch))
    if tune.choose(runs) is not runs[0]:
        runs.append(_candidate(serve, config, argv, tune.Batch()))  # the baseline again, to confirm
    chosen = tune.choose(runs)
    log.info(
        "Tuned the engine runs=%d chosen=%s goodput=%s baseline_goodput=%s",
        len(runs),
        chosen.batch.flags() or "the replica's own settings",
        chosen.goodput,
        tune.baseline_goodput(runs),
    )
    assert chosen.result is not None  # runs[0], which profile_server measured, or a run with a goodput
    return fit(chosen.result.model_copy(update={"engine": tune.engine_result(runs, chosen)}))


def _candidate(serve: ServeConfig, config: ProfileConfig, argv: Sequence[str], batch: tune.Batch) -> tune.Run:
    try:
        return profile_server(serve, config, argv, batch)
    except ProfileFailed as exc:
        log.warning("Skipped a candidate flags=%s reason=%s", batch.flags(), exc)
        return tune.Run(batch, None, None, str(exc))


def batch_limits(url: str) -> tune.Limits | None:
    """The started server's batch limits as vLLM resolved them (its /v1/pagoda/capacity), or None."""
    request = urllib.request.Request(f"{url}{contract.CAPACITY_PATH}")
    if api_key := os.environ.get("PAGODA_API_KEY"):
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            found = Capacity.model_validate_json(response.read())
    except (urllib.error.URLError, OSError, ValidationError) as exc:
        log.warning("Failed to read the batch limits url=%s error=%s", url, exc)
        return None
    if found.max_num_batched_tokens is None or found.max_num_seqs is None:
        log.warning("Failed to read the batch limits url=%s error=the answer has none", url)
        return None
    return tune.Limits(found.max_num_batched_tokens, found.max_num_seqs, found.kv_cache_tokens or None)


def _summary(report: Mapping[str, Any], config: ProfileConfig) -> ProfileResult:
    try:
        return summarize(report, config.slo, config.prompt_tokens, config.output_tokens)
    except (KeyError, ValueError, TypeError) as exc:
        raise ProfileFailed(load_failed(f"GuideLLM's report is not as expected ({exc})")) from None


def run(serve: ServeConfig, config: ProfileConfig, argv: Sequence[str]) -> int:
    """The whole profile: 0 with the result written to `config.result` and printed to stdout; 1 with the
    reason written there instead."""
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        result = measure(serve, config, argv)
    except ProfileFailed as exc:
        termination.write(exc.fatal, config.result)
        return 1
    except _Stop as exc:
        termination.write(
            termination.Fatal("ProfileStopped", f"stopped by {exc} before it finished"), config.result
        )
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    data = result_json(result)
    log.info(
        "Finished profile concurrency=%s requests_per_second=%s steps=%d",
        result.concurrency,
        result.requests_per_second,
        len(result.steps or []),
    )
    try:
        with open(config.result, "wb") as out:
            out.write(data)
    except OSError as exc:
        log.error("Failed to write the result path=%s error=%s", config.result, exc)
        return 1
    sys.stdout.write(data.decode() + "\n")
    sys.stdout.flush()
    return 0
