"""`pagoda-runtime`: `serve` (the runtime); `profile` (one replica's capacity within a latency SLO,
runtime/profiling/profile.py); `seed-model-info` (an image's build step, runtime/models/modelinfo.py);
`make-tiny-model` and `make-tiny-adapter` (for tests)."""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import sys
from types import ModuleType

from pagoda.runtime.models import sources
from pagoda.runtime.models.modeluri import ModelSourceError
from pagoda.runtime.profiling.config import add_profile_flags, profile_config
from pagoda.runtime.serving import signals, termination
from pagoda.runtime.serving.config import ConfigError, ServeConfig, add_serve_flags, config_from_args

log = logging.getLogger("pagoda.runtime")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagoda-runtime", description="Pagoda's serving layer over vLLM.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="serve a model (OpenAI API, /livez, /readyz, /metrics)",
        epilog="Arguments after `--` go to vLLM's own engine argument parser verbatim.",
    )
    add_serve_flags(serve)
    profile = sub.add_parser(
        "profile",
        help="measure what one replica can do within a latency SLO (GuideLLM at rising concurrency)",
        description="Starts `serve` with the same flags (unless --target), loads it with GuideLLM at each "
        "concurrency of --streams, and writes the highest concurrency whose p95 time to first token and "
        "inter-token latency meet the SLO, with the whole curve, as JSON to --result and stdout.",
        epilog="Arguments after `--` go to vLLM's own engine argument parser verbatim, as for serve.",
        allow_abbrev=False,  # the child serve gets the flags that are not the profile's, spelled in full
    )
    add_serve_flags(profile)
    add_profile_flags(profile)
    seed = sub.add_parser(
        "seed-model-info",
        help="answer vLLM's model-registry inspection for every architecture ahead of time (image builds)",
        epilog="serve copies the answers into its cache when PAGODA_VLLM_SEED_DIR names the folder.",
    )
    seed.add_argument("directory", help="the folder to write (its modelinfos/ subfolder)")
    tiny = sub.add_parser("make-tiny-model", help="write a tiny random-weight Llama (nothing downloaded)")
    tiny.add_argument("directory")
    tiny.add_argument("--seed", type=int, default=0)
    adapter = sub.add_parser(
        "make-tiny-adapter", help="write a random-weight LoRA adapter (PEFT format) for a tiny model"
    )
    adapter.add_argument("--model", required=True, help="the base model's directory (its config.json)")
    adapter.add_argument("--out", required=True, help="the adapter's directory (created)")
    adapter.add_argument("--rank", type=int, default=8)
    adapter.add_argument("--seed", type=int, default=0)
    return parser


def _setup_logging() -> None:
    """Pagoda's loggers get their own handler: vLLM's dependencies change the root logger's level."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger("pagoda")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False


def _serve(ns: argparse.Namespace, extra: list[str], parser: argparse.ArgumentParser) -> int:
    signals.record_early()  # before the heavy imports below (runtime/serving/signals.py)
    try:
        config = config_from_args(ns, extra)
    except ConfigError as exc:
        termination.write(termination.invalid_config(str(exc)))
        parser.exit(2, f"pagoda-runtime serve: error: {exc}\n")

    certificate = None
    if config.tls_cert_file is not None and config.tls_key_file is not None:
        from pagoda.runtime.serving import tls

        try:
            certificate = tls.CertificateReloader(config.tls_cert_file, config.tls_key_file)
        except tls.TlsError as exc:
            termination.write(termination.tls_invalid(str(exc)))
            parser.exit(2, f"pagoda-runtime serve: error: {exc}\n")

    try:
        sources.check_local(config.model)
    except ModelSourceError as exc:  # the same lines as a failure after the engine's imports
        log.error("Failed to load model uri=%s error=%s: %s", config.model, type(exc).__name__, exc)
        termination.write(termination.model_source(exc.reason, str(exc)))
        log.info("Stopped runtime exit_code=1")
        return 1

    import uvloop

    from pagoda.runtime.models import modelinfo
    from pagoda.runtime.serving import engine, lifecycle

    engine.apply_env_defaults()
    modelinfo.install()
    vllm_args = _parse_vllm_args(engine, config)
    log.info("Starting runtime model=%s name=%s port=%d", config.model, config.name, config.port)
    runtime = lifecycle.Runtime(config, vllm_args, certificate)
    code: int = uvloop.run(runtime.run())
    if runtime.abandoned_load:  # see Runtime.abandoned_load: the exit code must be the one decided here
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _profile(
    ns: argparse.Namespace, argv: list[str], extra: list[str], parser: argparse.ArgumentParser
) -> int:
    """`profile`: its flags and serve's checked as serve checks them (exit 2 naming the flag), then the
    profile (runtime/profiling/profile.py). `argv`: the arguments after the subcommand, before `--`."""
    from pagoda.runtime.profiling import profile

    try:
        serve = config_from_args(ns, extra)
        config = profile_config(ns)
    except ConfigError as exc:
        path = ns.result or None  # else the termination-message path of the environment
        termination.write(termination.invalid_config(str(exc)), path)
        parser.exit(2, f"pagoda-runtime profile: error: {exc}\n")
    return profile.run(serve, config, argv)


def _parse_vllm_args(engine: ModuleType, config: ServeConfig) -> argparse.Namespace:
    """vLLM's parser prints its error and exits 2; its last line also becomes the termination message."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            args: argparse.Namespace = engine.parse_vllm_args(config, model_path=config.model)
    except SystemExit as exc:
        sys.stderr.write(captured.getvalue())
        lines = captured.getvalue().strip().splitlines()
        termination.write(termination.invalid_config(lines[-1] if lines else f"exit status {exc.code}"))
        raise
    except (TypeError, ValueError) as exc:  # validate_parsed_serve_args
        termination.write(termination.invalid_config(str(exc)))
        raise SystemExit(2) from exc
    sys.stderr.write(captured.getvalue())
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = _parser()
    ns = parser.parse_args(argv)
    _setup_logging()
    if ns.command not in ("serve", "profile") and extra:
        parser.error(f"{ns.command} takes no arguments after --")
    if ns.command == "make-tiny-adapter":
        from pagoda.runtime.tools.tinyadapter import TinyAdapterSpec, make_tiny_adapter

        if ns.rank < 1:
            parser.error(f"--rank: must be at least 1 (got {ns.rank})")
        make_tiny_adapter(ns.model, ns.out, TinyAdapterSpec(rank=ns.rank, seed=ns.seed))
        return 0
    if ns.command == "seed-model-info":
        from pagoda.runtime.models import modelinfo

        return modelinfo.main([ns.directory])
    if ns.command == "make-tiny-model":
        from pagoda.runtime.tools.tinymodel import TinyModelSpec, make_tiny_model

        make_tiny_model(ns.directory, TinyModelSpec(seed=ns.seed))
        return 0
    if ns.command == "profile":
        return _profile(ns, argv[argv.index("profile") + 1 :], extra, parser)
    return _serve(ns, extra, parser)


if __name__ == "__main__":
    sys.exit(main())
