"""`pagoda-runtime profile`: what one replica can do within a latency SLO, measured with GuideLLM.

The operator runs it in a Job made from a replica's container (spec.slo): the replica's `serve` flags with
`serve` replaced by `profile` and the profile's flags appended. Without `--target` it starts
`pagoda-runtime serve` with those flags as a child process, waits until its /readyz answers 200, and loads
it with GuideLLM (`guidellm run`, docs/design/2026-12-04-capacity-profiling-generator.md): streamed chat
completions of synthetic prompts of exactly `--prompt-tokens` tokens asking for exactly `--output-tokens`
tokens, at each concurrency of `--streams` for `--step-seconds`, with the model's own tokenizer folder (no
hub). It then stops the server and writes a compact JSON result (`summarize`) to `--result` (the container's
termination message, which the operator copies into status.profile) and to stdout as one line.

With `--tune-engine` it profiles more servers, each restarted with other batch settings for the ones the
flags leave unset (runtime/profiling/tune.py), and the result is the best's, with an `engine` key saying what
was tried, what won and its goodput against the replica's own settings.

GuideLLM lives in a virtual environment of its own (it pins click and multidict lower than the runtime):
`--guidellm`, else `PAGODA_GUIDELLM` (the images set it), else `guidellm` on PATH. This module never imports
it: `summarize` reads its JSON report as plain data.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from pagoda import contract
from pagoda.runtime.profiling import tune
from pagoda.runtime.serving import termination
from pagoda.runtime.serving.config import ConfigError, ServeConfig

log = logging.getLogger("pagoda.runtime.profiling.profile")

GUIDELLM_ENV = "PAGODA_GUIDELLM"
GUIDELLM_WORKERS_ENV = "GUIDELLM__MAX_WORKER_PROCESSES"  # GuideLLM's own setting (default 10)
MAX_GUIDELLM_WORKERS = 10
MAX_STEPS = 20  # 20 steps of the result stay well under MAX_RESULT_BYTES
MAX_RESULT_BYTES = 4000  # the kubelet keeps 4096 bytes of a termination message
MAX_ERROR_RATIO = 0.05  # a step with more errored requests than this misses the SLO
SEED = 42
READY_TIMEOUT_S = 1800.0  # for the child server's /readyz: the model's download and the engine's start
STOP_TIMEOUT_S = 120.0  # for the child server to exit after SIGTERM (its drain), before SIGKILL
GUIDELLM_OVERHEAD_S = 120.0  # GuideLLM's own start and each step's set-up, on top of the steps' time

# The flags `profile` adds to `serve`'s, each with one value: stripped from the arguments the child gets.
PROFILE_FLAGS = (
    "--slo-ttft-ms",
    "--slo-itl-ms",
    "--prompt-tokens",
    "--output-tokens",
    "--streams",
    "--step-seconds",
    "--result",
    "--target",
    "--tokenizer",
    "--guidellm",
    "--tune-max-runs",
)
PROFILE_SWITCHES = ("--tune-engine",)  # the profile's flags without a value


@dataclass(frozen=True)
class Slo:
    """The objectives, each on the 95th percentile, in milliseconds."""

    ttft_ms: float
    inter_token_ms: float


@dataclass(frozen=True)
class ProfileConfig:
    """The profile's own flags, validated (`profile_config`)."""

    slo: Slo
    prompt_tokens: int
    output_tokens: int
    streams: tuple[int, ...]
    step_seconds: float
    result: str
    target: str | None
    tokenizer: str | None
    guidellm: str
    tune_engine: bool = False
    tune_max_runs: int = contract.TUNE_MAX_RUNS


class ProfileFailed(Exception):
    """The server or GuideLLM failed: `fatal` is the termination message."""

    def __init__(self, fatal: termination.Fatal) -> None:
        super().__init__(fatal.text())
        self.fatal = fatal


def add_profile_flags(parser: argparse.ArgumentParser) -> None:
    """The flags `profile` takes beside `serve`'s, parsed as strings (`profile_config` checks them, so that
    an error names the flag as `serve`'s do)."""
    slo = parser.add_argument_group("the SLO (95th percentiles) and the load")
    slo.add_argument("--slo-ttft-ms", required=True, metavar="MS", help="time to first token objective")
    slo.add_argument("--slo-itl-ms", required=True, metavar="MS", help="inter-token latency objective")
    slo.add_argument(
        "--prompt-tokens",
        metavar="N",
        help=f"tokens in each synthetic prompt (default: {contract.PROFILE_PROMPT_TOKENS})",
    )
    slo.add_argument(
        "--output-tokens",
        metavar="N",
        help=f"tokens each request generates (default: {contract.PROFILE_OUTPUT_TOKENS})",
    )
    slo.add_argument(
        "--streams",
        metavar="N,N,...",
        help="the concurrency of each step, increasing (default: "
        f"{','.join(map(str, contract.PROFILE_STREAMS))}; at most {MAX_STEPS} steps)",
    )
    slo.add_argument(
        "--step-seconds",
        metavar="S",
        help=f"how long each step sends requests (default: {contract.PROFILE_STEP_SECONDS})",
    )
    slo.add_argument(
        "--result",
        metavar="PATH",
        help=f"where the JSON result goes (default: ${contract.TERMINATION_MESSAGE_ENV}, else "
        f"{contract.TERMINATION_MESSAGE_PATH}); on a failure, the reason",
    )
    slo.add_argument(
        "--target",
        metavar="URL",
        help="profile the OpenAI server at URL instead of starting one (then --tokenizer is required)",
    )
    slo.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="the tokenizer folder for the synthetic prompts (default: the model's folder, as serve made it "
        "local)",
    )
    slo.add_argument(
        "--guidellm", metavar="PATH", help=f"GuideLLM's executable (default: ${GUIDELLM_ENV}, else on PATH)"
    )
    slo.add_argument(
        "--tune-engine",
        action="store_true",
        help="also profile servers restarted with other batch settings (--max-num-batched-tokens, "
        "--max-num-seqs, those not given) and report the best (runtime/profiling/tune.py); at most "
        "--tune-max-runs servers in all",
    )
    slo.add_argument(
        "--tune-max-runs",
        metavar="N",
        help=f"the most servers --tune-engine profiles, the replica's own settings first (default: "
        f"{contract.TUNE_MAX_RUNS}, at least {tune.MIN_RUNS})",
    )


def _positive(flag: str, text: str | None, kind: type[int] | type[float], default: float | None) -> Any:
    """`text` as a positive int or float, `default` when not given; ConfigError naming `flag` otherwise."""
    if text is None:
        return default
    try:
        value = kind(text)
    except ValueError:
        raise ConfigError(f"{flag}: must be a positive {kind.__name__} (got {text!r})") from None
    if not value > 0 or not math.isfinite(value):
        raise ConfigError(f"{flag}: must be a positive {kind.__name__} (got {text!r})")
    return value


def parse_streams(text: str | None) -> tuple[int, ...]:
    """`--streams`: comma-separated positive integers, increasing, at most MAX_STEPS of them."""
    if text is None:
        return contract.PROFILE_STREAMS
    try:
        streams = tuple(int(part) for part in text.split(","))
    except ValueError:
        streams = ()
    if (
        not streams
        or any(s < 1 for s in streams)
        or any(b <= a for a, b in zip(streams, streams[1:], strict=False))
    ):
        raise ConfigError(
            f"--streams: must be comma-separated positive integers in increasing order (got {text!r})"
        )
    if len(streams) > MAX_STEPS:
        raise ConfigError(f"--streams: at most {MAX_STEPS} steps (got {len(streams)})")
    return streams


def _guidellm(given: str | None) -> str:
    path = given or os.environ.get(GUIDELLM_ENV) or shutil.which("guidellm")
    if not path:
        raise ConfigError(f"--guidellm: no GuideLLM found (set ${GUIDELLM_ENV} or put guidellm on PATH)")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise ConfigError(f"--guidellm: {path!r} is not an executable file")
    return os.path.abspath(path)  # GuideLLM runs in a scratch folder


def profile_config(ns: argparse.Namespace) -> ProfileConfig:
    """The profile's flags from `ns`, checked; ConfigError names every flag that is wrong."""
    problems: list[str] = []

    def check(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except ConfigError as exc:
            problems.append(str(exc))
            return None

    ttft = check(_positive, "--slo-ttft-ms", ns.slo_ttft_ms, float, None)
    itl = check(_positive, "--slo-itl-ms", ns.slo_itl_ms, float, None)
    prompt = check(_positive, "--prompt-tokens", ns.prompt_tokens, int, contract.PROFILE_PROMPT_TOKENS)
    output = check(_positive, "--output-tokens", ns.output_tokens, int, contract.PROFILE_OUTPUT_TOKENS)
    streams = check(parse_streams, ns.streams)
    step = check(_positive, "--step-seconds", ns.step_seconds, float, float(contract.PROFILE_STEP_SECONDS))
    result = (
        ns.result or os.environ.get(contract.TERMINATION_MESSAGE_ENV) or contract.TERMINATION_MESSAGE_PATH
    )
    if not os.path.isdir(os.path.dirname(os.path.abspath(result))):
        problems.append(f"--result: the folder of {result!r} does not exist")
    if ns.target is not None and not ns.target.startswith(("http://", "https://")):
        problems.append(f"--target: must be an http:// or https:// URL (got {ns.target!r})")
    if ns.target is not None and ns.tune_engine:
        problems.append("--tune-engine: restarts the server it profiles, so it cannot be used with --target")
    if ns.target is not None and ns.tokenizer is None:
        problems.append("--tokenizer: required with --target (the folder of the served model's tokenizer)")
    if ns.tls_cert_file is not None or ns.tls_key_file is not None:
        problems.append(
            "--tls-cert-file, --tls-key-file: the profile's server listens on loopback for the profile alone "
            "and serves plain HTTP; leave them out (the operator's profile Job does)"
        )
    if ns.tokenizer is not None and not os.path.isdir(ns.tokenizer):
        problems.append(f"--tokenizer: {ns.tokenizer!r} is not a folder")
    guidellm = check(_guidellm, ns.guidellm)
    runs = check(_positive, "--tune-max-runs", ns.tune_max_runs, int, contract.TUNE_MAX_RUNS)
    if runs is not None and runs < tune.MIN_RUNS:
        problems.append(
            f"--tune-max-runs: must be at least {tune.MIN_RUNS}, the replica's settings, a candidate and the "
            f"replica's settings again (got {runs})"
        )
    if problems:
        raise ConfigError("; ".join(problems))
    return ProfileConfig(
        slo=Slo(ttft, itl),
        prompt_tokens=prompt,
        output_tokens=output,
        streams=streams,
        step_seconds=step,
        result=result,
        target=ns.target.rstrip("/") if ns.target else None,
        tokenizer=os.path.abspath(ns.tokenizer) if ns.tokenizer else None,
        guidellm=guidellm,
        tune_engine=bool(ns.tune_engine),
        tune_max_runs=runs,
    )


def serve_argv(argv: Sequence[str]) -> list[str]:
    """`profile`'s arguments (before `--`, without the subcommand) less the profile's own flags: what the
    child `serve` gets (the parser takes no abbreviations, so each flag is spelled in full)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in PROFILE_FLAGS:
            skip = True
        elif arg in PROFILE_SWITCHES:
            continue
        elif arg.split("=", 1)[0] not in PROFILE_FLAGS:
            out.append(arg)
    return out


# --- the report ---------------------------------------------------------------------------------------------


def _at(data: Any, path: str) -> Any:
    """The value at a dotted `path` of a report's dicts; KeyError naming the path when it is missing."""
    for key in path.split("."):
        if not isinstance(data, Mapping) or key not in data:
            raise KeyError(f"GuideLLM's report has no {path}")
        data = data[key]
    return data


def _number(data: Any, path: str) -> float:
    value = _at(data, path)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise KeyError(f"GuideLLM's report has no number at {path} (got {value!r})")
    return float(value)


def _round(value: float) -> float:
    """Four significant digits: enough for a latency or a rate, short in the termination message."""
    return float(f"{value:.4g}") if math.isfinite(value) else 0.0


def step_summary(benchmark: Mapping[str, Any], slo: Slo) -> dict[str, Any]:
    """One concurrency step from one of GuideLLM 0.8.1's `benchmarks[i]` (its JSON output), read at:

    - `config.strategy.streams`: the step's concurrency;
    - `metrics.time_to_first_token_ms.successful.percentiles.p95` and
      `metrics.inter_token_latency_ms.successful.percentiles.p95`: the p95s, over successful requests;
    - `metrics.requests_per_second.successful.mean`, `metrics.output_tokens_per_second.successful.mean`;
    - `metrics.request_totals.successful` and `.errored`: `requests` counts both (requests the step's end
      cut off, `.incomplete`, are not counted), `errors` the errored ones.

    It meets the SLO when both p95s are within the objectives, at least one request succeeded and at most
    MAX_ERROR_RATIO of its requests errored."""
    metrics = _at(benchmark, "metrics")
    successful = int(_number(metrics, "request_totals.successful"))
    errors = int(_number(metrics, "request_totals.errored"))
    ttft = _number(metrics, "time_to_first_token_ms.successful.percentiles.p95")
    itl = _number(metrics, "inter_token_latency_ms.successful.percentiles.p95")
    requests = successful + errors
    meets = (
        successful > 0
        and errors <= MAX_ERROR_RATIO * requests
        and ttft <= slo.ttft_ms
        and itl <= slo.inter_token_ms
    )
    return {
        "concurrency": int(_number(benchmark, "config.strategy.streams")),
        "ttftP95Ms": _round(ttft),
        "interTokenP95Ms": _round(itl),
        "requestsPerSecond": _round(_number(metrics, "requests_per_second.successful.mean")),
        "outputTokensPerSecond": _round(_number(metrics, "output_tokens_per_second.successful.mean")),
        "requests": requests,
        "errors": errors,
        "meetsSlo": bool(meets),
    }


def summarize(report: Mapping[str, Any], slo: Slo, prompt_tokens: int, output_tokens: int) -> dict[str, Any]:
    """The profile's result from GuideLLM's JSON report (`benchmarks`, one per step, in the order run; see
    `step_summary`): the steps, and the highest concurrency that meets the SLO counting up from the first
    step and stopping at the first that misses it (null when the first does), with its throughput. Rounded
    to four significant digits; when the JSON would exceed MAX_RESULT_BYTES (more than MAX_STEPS steps) the
    last steps are left out of `steps`. KeyError or ValueError when the report lacks what is read."""
    benchmarks = _at(report, "benchmarks")
    if not isinstance(benchmarks, list) or not benchmarks:
        raise ValueError("GuideLLM's report has no benchmarks")
    steps = sorted((step_summary(b, slo) for b in benchmarks), key=lambda step: int(step["concurrency"]))
    chosen: dict[str, Any] | None = None
    for step in steps:
        if not step["meetsSlo"]:
            break
        chosen = step
    result: dict[str, Any] = {
        "slo": {"ttftMs": slo.ttft_ms, "interTokenMs": slo.inter_token_ms},
        "shape": {"promptTokens": prompt_tokens, "outputTokens": output_tokens},
        "concurrency": chosen["concurrency"] if chosen else None,
        "requestsPerSecond": chosen["requestsPerSecond"] if chosen else None,
        "outputTokensPerSecond": chosen["outputTokensPerSecond"] if chosen else None,
        "steps": steps,
    }
    return fit(result)


def fit(result: dict[str, Any]) -> dict[str, Any]:
    """`result` with the last steps left out while its JSON exceeds MAX_RESULT_BYTES (MAX_STEPS steps alone
    fit; with the engine's candidates too the last steps may go; the capacity and the choice are outside the
    steps anyway)."""
    while len(result_json(result)) > MAX_RESULT_BYTES and len(result["steps"]) > 1:
        result["steps"] = result["steps"][:-1]
    return result


def result_json(result: Mapping[str, Any]) -> bytes:
    """The result as the termination message carries it: compact JSON, one line."""
    return json.dumps(result, separators=(",", ":")).encode()


# --- running it ---------------------------------------------------------------------------------------------


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
            raise ProfileFailed(_load_failed(f"GuideLLM could not start ({exc})")) from None
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise ProfileFailed(_load_failed(f"GuideLLM did not finish in {timeout:.0f}s")) from None
        finally:
            _stop_group(proc)
        log.info("Finished GuideLLM exit_code=%d seconds=%.1f", code, time.monotonic() - started)
        if code != 0:
            raise ProfileFailed(_load_failed(f"GuideLLM exited with status {code}"))
        try:
            loaded: dict[str, Any] = json.loads(report.read_text())
        except (OSError, ValueError) as exc:
            raise ProfileFailed(_load_failed(f"GuideLLM's report cannot be read ({exc})")) from None
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


def _load_failed(what: str) -> termination.Fatal:
    return termination.Fatal(
        "ProfileLoadFailed",
        f"{what}; see the container log for GuideLLM's output (the profile is not retried)",
    )


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
    from pagoda.runtime.models import sources

    try:
        path = sources.resolve(sources.parse_model_uri(serve.model), serve.cache_dir, serve.revision)
    except sources.ModelSourceError as exc:
        raise ProfileFailed(termination.model_source(exc.reason, str(exc))) from None
    return str(path)


def measure(serve: ServeConfig, config: ProfileConfig, argv: Sequence[str]) -> dict[str, Any]:
    """The profile's result: against `config.target`, or against a child server started with `argv`
    (and, with --tune-engine, the best of several: `tune_engine`)."""
    if config.target is not None:
        assert config.tokenizer is not None
        report = run_guidellm(config, config.target, serve.name, config.tokenizer)
        return _summary(report, config)
    if config.tune_engine:
        return tune_engine(serve, config, argv)
    return dict(profile_server(serve, config, argv, tune.Batch()).result or {})


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


def tune_engine(serve: ServeConfig, config: ProfileConfig, argv: Sequence[str]) -> dict[str, Any]:
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
    result = dict(chosen.result or {})
    result["engine"] = tune.engine_result(runs, chosen)
    return fit(result)


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
            body = json.loads(response.read())
        kv = body.get("kvCacheTokens")
        return tune.Limits(int(body["maxNumBatchedTokens"]), int(body["maxNumSeqs"]), int(kv) if kv else None)
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("Failed to read the batch limits url=%s error=%s", url, exc)
        return None


def _summary(report: Mapping[str, Any], config: ProfileConfig) -> dict[str, Any]:
    try:
        return summarize(report, config.slo, config.prompt_tokens, config.output_tokens)
    except (KeyError, ValueError, TypeError) as exc:
        raise ProfileFailed(_load_failed(f"GuideLLM's report is not as expected ({exc})")) from None


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
        result["concurrency"],
        result["requestsPerSecond"],
        len(result["steps"]),
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
