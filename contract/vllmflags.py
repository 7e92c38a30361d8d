"""The vLLM flags pagoda-runtime keeps out of users' hands, in one place for the runtime and the operator.

Owned flags: the runtime sets them itself (from its own flags and spec fields), so they may not come again
after `--` (the CRD's spec.engine.extraArgs). Refused flags: options of vLLM's own API server that the
runtime's HTTP server does not apply; accepting them would mean silently ignoring them.

vLLM's parser reads `--served_model_name` as `--served-model-name` (it turns `_` into `-` in flag names),
so every check compares normalised names. Only the standard library: the operator loads this without the
engine, and the runtime without the operator.
"""

from __future__ import annotations

import argparse

OWNED_FLAGS = (
    "--model",
    "--host",
    "--port",
    "--served-model-name",
    "--uds",
    "--api-key",
    # LoRA: the runtime's own flags set these, and it loads the adapters itself (runtime/serving/adapters.py).
    "--enable-lora",
    "--max-loras",
    "--max-lora-rank",
    "--max-cpu-loras",
    "--lora-modules",
)

_TLS = (
    "the runtime serves TLS with its own flags --tls-cert-file and --tls-key-file, which reload a renewed "
    "certificate without a restart (an InferenceService: spec.runtime.tls.secretName)"
)
_ACCESS_LOG = "the runtime's HTTP server logs warnings only and writes no access log"
_ONE_SERVER = "the runtime runs one HTTP API server in each pod: scale with replicas"
# Flag -> why the runtime refuses it.
REFUSED_FLAGS = {
    **dict.fromkeys(
        (
            "--ssl-keyfile",
            "--ssl-certfile",
            "--ssl-ca-certs",
            "--ssl-cert-reqs",
            "--ssl-ciphers",
            "--enable-ssl-refresh",
        ),
        _TLS,
    ),
    **dict.fromkeys(
        ("--uvicorn-log-level", "--disable-uvicorn-access-log", "--disable-access-log-for-endpoints"),
        _ACCESS_LOG,
    ),
    **dict.fromkeys(
        ("--h11-max-incomplete-event-size", "--h11-max-header-count"),
        "the runtime's HTTP server keeps uvicorn's own h11 limits",
    ),
    **dict.fromkeys(
        (
            "--headless",
            "--api-server-count",
            "--grpc",
            "--grpc-port",
            "--data-parallel-multi-port-external-lb",
            "--data-parallel-supervisor-port",
            "--dp-supervisor-probe-interval-s",
            "--dp-supervisor-probe-timeout-s",
            "--dp-supervisor-probe-failure-threshold",
        ),
        _ONE_SERVER,
    ),
}


def normalised(arg: str) -> str:
    """The flag name of a command-line word as vLLM's parser reads it: `--served_model_name=x` ->
    `--served-model-name`."""
    return arg.split("=", 1)[0].replace("_", "-")


def owned(arg: str) -> str | None:
    """The owned flag `arg` spells (in any spelling vLLM accepts), or None."""
    name = normalised(arg)
    return name if name in OWNED_FLAGS else None


def owned_flag_pattern() -> str:
    """A regular expression (RE2 and Python alike, for CEL) matching every spelling of every owned flag,
    alone or as `--flag=value`."""
    names = "|".join(flag.removeprefix("--").replace("-", "[-_]") for flag in OWNED_FLAGS)
    return rf"^--({names})(=.*)?$"


def parse_refusing(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`parser.parse_args(argv)` for vLLM's parser, raising ValueError that names each refused flag given,
    in whatever spelling the parser accepted (refused flags get a marker default while parsing, so only a
    given one has a value)."""
    dests = {flag.removeprefix("--").replace("-", "_"): flag for flag in REFUSED_FLAGS}
    defaults = {dest: parser.get_default(dest) for dest in dests}
    unset = object()
    parser.set_defaults(**dict.fromkeys(dests, unset))
    args = parser.parse_args(argv)
    given = [flag for dest, flag in dests.items() if getattr(args, dest) is not unset]
    if given:
        raise ValueError(
            "; ".join(f"{flag} is not supported by pagoda-runtime: {REFUSED_FLAGS[flag]}" for flag in given)
        )
    for dest, value in defaults.items():
        setattr(args, dest, value)
    return args
