"""`pagoda-runtime profile`'s own flags: parsed beside `serve`'s, checked (`profile_config`), and taken out of
the arguments the child `serve` gets (`serve_argv`). profile.py runs the profile they describe.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pagoda import contract
from pagoda.runtime.profiling import tune
from pagoda.runtime.serving.config import ConfigError

GUIDELLM_ENV = "PAGODA_GUIDELLM"
MAX_STEPS = 20  # 20 steps of the result stay well under result.py's MAX_RESULT_BYTES

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
