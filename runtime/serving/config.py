"""The runtime's configuration: `pagoda-runtime serve` flags, validated with pydantic.

Each field maps to one flag (`max_model_len` <-> `--max-model-len`); a validation error names the flag and
the process exits with status 2, like argparse does for a flag it cannot parse.
"""

from __future__ import annotations

import argparse
import os

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pagoda import contract
from pagoda.contract import management, vllmflags
from pagoda.contract.chattemplate import compile_error
from pagoda.runtime.models.modeluri import ModelSourceError, parse_model_uri
from pagoda.runtime.serving.lora import AdapterError, parse_lora_flag

BLOCK_SIZES, LORA_RANKS = contract.BLOCK_SIZES, contract.LORA_RANKS


class ConfigError(ValueError):
    """A flag has an invalid value; the message names the flag."""


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


class ServeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1)
    served_model_name: str | None = Field(default=None, min_length=1, max_length=256)
    revision: str | None = Field(default=None, min_length=1)
    host: str = "0.0.0.0"
    port: int = Field(default=contract.HTTP_PORT, ge=1, le=65535)
    dtype: contract.Dtype = "auto"
    quantization: contract.Quantization | None = None
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    max_model_len: int | None = Field(default=None, ge=16, le=10_000_000)
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    block_size: int | None = None
    enable_prefix_caching: bool | None = None
    max_num_seqs: int | None = Field(default=None, ge=1, le=65_536)
    max_num_batched_tokens: int | None = Field(default=None, ge=1, le=10_000_000)
    chat_template: str | None = Field(default=None, min_length=1)  # a file, or the template itself
    enable_lora: bool = False
    max_loras: int | None = Field(default=None, ge=1, le=1024)
    max_lora_rank: int | None = None
    max_cpu_loras: int | None = Field(default=None, ge=1, le=65_536)
    lora: tuple[str, ...] = ()  # NAME=SOURCE, loaded at start (validated after the limits)
    drain_timeout: float = Field(default=30.0, ge=0.0, le=3600.0)
    max_connection_age: float = Field(default=30.0, ge=0.0, le=86_400.0)  # 0: never
    max_request_body_bytes: int = Field(default=contract.MAX_REQUEST_BODY_BYTES, gt=0)
    # 0: never; None: from the engine's step budget once it is loaded (progress.default_stall_timeout)
    stall_timeout: float | None = Field(default=None, ge=0.0, le=3600.0)
    cache_dir: str = contract.CACHE_DIR
    cache_max_bytes: int | None = Field(default=None, gt=0)  # evict unused models past it (modelcache.py)
    management_public_key_file: str | None = Field(default=None, min_length=1)
    tls_cert_file: str | None = Field(default=None, min_length=1)  # both or neither (tls.py)
    tls_key_file: str | None = Field(default=None, min_length=1)
    extra_args: tuple[str, ...] = ()

    @field_validator("model")
    @classmethod
    def _model_uri(cls, value: str) -> str:
        try:
            parse_model_uri(value)
        except ModelSourceError as exc:
            raise ValueError(str(exc)) from exc
        return value

    @field_validator("block_size")
    @classmethod
    def _block_size(cls, value: int | None) -> int | None:
        if value is not None and value not in BLOCK_SIZES:
            raise ValueError(f"must be one of {', '.join(map(str, BLOCK_SIZES))}")
        return value

    @field_validator("chat_template")
    @classmethod
    def _chat_template(cls, value: str | None) -> str | None:
        """A template that cannot compile would fail every chat request: refused at start, with its line.
        Read as vLLM reads the flag: a file when one is there, else the template itself when it looks like
        one (Jinja's braces or a newline); anything else (the name of one of vLLM's own templates, a missing
        file) is left to vLLM, which says what it is missing."""
        if value is None:
            return value
        if os.path.isfile(value):
            try:
                with open(value, encoding="utf-8") as source:
                    text = source.read()
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"cannot read the chat template file: {exc}") from None
        elif any(c in value for c in "{}\n"):
            text = value
        else:
            return value
        if (error := compile_error(text)) is not None:
            raise ValueError(f"the Jinja chat template does not compile: {error}")
        return value

    @field_validator("lora")
    @classmethod
    def _lora(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        served = info.data.get("served_model_name")
        if served is None and "model" in info.data:
            served = parse_model_uri(info.data["model"]).default_name
        names: set[str] = set()
        for flag in value:
            try:
                name, _ = parse_lora_flag(flag)
            except AdapterError as exc:
                raise ValueError(str(exc)) from None
            if name in names:
                raise ValueError(f"adapter {name!r} is given twice")
            if name == served:
                raise ValueError(f"adapter {name!r} has the served model's name")
            names.add(name)
        limit = info.data.get("max_cpu_loras") or info.data.get("max_loras") or 1
        if len(names) > limit:
            raise ValueError(
                f"{len(names)} adapters but a replica holds at most {limit} "
                "(--max-cpu-loras, which defaults to --max-loras, 1)"
            )
        return value

    @field_validator("management_public_key_file")
    @classmethod
    def _management_key(cls, value: str | None) -> str | None:
        """A key that cannot be read would refuse every management call: refused at start instead."""
        if value is not None:
            try:
                management.read_public_key(value)
            except management.Unauthorized as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("max_lora_rank")
    @classmethod
    def _max_lora_rank(cls, value: int | None) -> int | None:
        if value is not None and value not in LORA_RANKS:
            raise ValueError(f"must be one of {', '.join(map(str, LORA_RANKS))}")
        return value

    @field_validator("max_cpu_loras")
    @classmethod
    def _max_cpu_loras(cls, value: int | None, info: ValidationInfo) -> int | None:
        max_loras = info.data.get("max_loras") or 1
        if value is not None and value < max_loras:
            raise ValueError(f"must be at least --max-loras ({max_loras})")
        return value

    @field_validator("extra_args")
    @classmethod
    def _no_owned_flags(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """Flags the runtime sets itself may not be passed again after `--`, in any spelling."""
        for arg in value:
            if owned := vllmflags.owned(arg):
                raise ValueError(f"{owned} is set by pagoda-runtime itself; use its own flag instead")
        return value

    @model_validator(mode="after")
    def _tls_pair(self) -> ServeConfig:
        """The files themselves are checked by tls.load (cli.py), whose failure has its own reason."""
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            given, missing = (
                ("--tls-cert-file", "--tls-key-file")
                if self.tls_key_file is None
                else ("--tls-key-file", "--tls-cert-file")
            )
            raise ValueError(f"{missing}: required with {given} (TLS takes both files, or neither)")
        return self

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None

    @property
    def lora_enabled(self) -> bool:
        """--enable-lora, or any other LoRA flag (which imply it)."""
        limits = (self.max_loras, self.max_lora_rank, self.max_cpu_loras)
        return self.enable_lora or bool(self.lora) or any(v is not None for v in limits)

    @property
    def name(self) -> str:
        """The model name clients use: --served-model-name, else the one derived from the model URI
        (contract.default_served_name: hf://org/name serves org/name, file:///models/tiny tiny)."""
        return self.served_model_name or parse_model_uri(self.model).default_name


def _default(field: str) -> str:
    """ServeConfig's default of `field`, for a flag's help: the defaults are stated once, in the model."""
    return f"default: {ServeConfig.model_fields[field].default}"


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    """Flags are parsed as strings here, without defaults (a flag not given is left to ServeConfig's
    default); pydantic does every type and range check."""
    parser.add_argument("--model", required=True, help="model URI: file://, pvc://, hf:// or s3://")
    parser.add_argument(
        "--served-model-name", help="name clients use (default: from the URI: file:///models/tiny is tiny)"
    )
    parser.add_argument("--revision", help="hub revision (branch, tag or commit) for hf:// models")
    parser.add_argument("--host", help=_default("host"))
    parser.add_argument("--port", help=_default("port"))
    parser.add_argument("--dtype", help=f"{'|'.join(contract.DTYPES)} ({_default('dtype')})")
    parser.add_argument("--quantization", help="|".join(contract.QUANTIZATIONS))
    parser.add_argument("--tensor-parallel-size", help=_default("tensor_parallel_size"))
    parser.add_argument("--max-model-len")
    parser.add_argument("--gpu-memory-utilization", help=_default("gpu_memory_utilization"))
    parser.add_argument("--block-size")
    prefix = parser.add_mutually_exclusive_group()
    prefix.add_argument(
        "--enable-prefix-caching", dest="enable_prefix_caching", action="store_const", const=True
    )
    prefix.add_argument(
        "--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_const", const=False
    )
    parser.add_argument("--max-num-seqs", help="sequences in one engine step (vLLM's default when unset)")
    parser.add_argument(
        "--max-num-batched-tokens",
        help="tokens in one engine step, prefill chunks and decodes together (vLLM's default when unset)",
    )
    parser.add_argument(
        "--chat-template",
        metavar="FILE|TEMPLATE",
        help="a Jinja chat template instead of the model's own, as vLLM's --chat-template (a file, or the "
        "template itself); one that does not compile is refused at start",
    )
    lora = parser.add_argument_group("LoRA adapters (any of these turns LoRA on)")
    lora.add_argument("--enable-lora", action="store_const", const=True, help="serve LoRA adapters")
    lora.add_argument(
        "--lora", action="append", metavar="NAME=SOURCE", help="an adapter loaded at start (repeatable)"
    )
    lora.add_argument("--max-loras", help="adapters in one batch (vLLM's --max-loras, default 1)")
    lora.add_argument("--max-lora-rank", help=f"highest adapter rank: {'|'.join(map(str, LORA_RANKS))}")
    lora.add_argument("--max-cpu-loras", help="adapters held in memory, the most a replica serves")
    parser.add_argument(
        "--drain-timeout", help=f"seconds to finish requests after SIGTERM ({_default('drain_timeout')})"
    )
    parser.add_argument(
        "--max-connection-age",
        help="seconds after which a kept-alive client connection is closed after its next response, so that "
        "a Service (kube-proxy balances connections, not requests) spreads the load over new replicas; "
        f"0: never ({_default('max_connection_age')})",
    )
    parser.add_argument(
        "--max-request-body-bytes",
        help="a request whose body is larger (in bytes) gets 413 before vLLM holds it in memory; a chat "
        "request with 128k tokens of English context is about 0.5 MB, and the default leaves room for a few "
        f"inline base64 images ({_default('max_request_body_bytes')})",
    )
    parser.add_argument(
        "--stall-timeout",
        help="seconds the engine may hold requests and complete no step (a decode step, or one chunk of a "
        "prefill) before the runtime calls it stalled (/livez and /readyz 503) and exits 1, so that the "
        "kubelet restarts it; a hung EngineCore never completes one; 0: never (default: the longest a step "
        "may take at a slow CPU's 50 prompt tokens/s: max(30, max-num-batched-tokens * (1 + max-model-len "
        "/ 32768) / 50) seconds: 44 with vLLM's CPU step budget, 2048 tokens, and a 2048-token context)",
    )
    parser.add_argument("--cache-dir", help=f"where hf:// and s3:// models go ({_default('cache_dir')})")
    parser.add_argument(
        "--cache-max-bytes",
        help="the model cache's bound: past it, the least recently used models no runtime sharing the cache "
        "serves are deleted (runtime/models/modelcache.py); unset: no bound",
    )
    parser.add_argument(
        "--management-public-key-file",
        metavar="PEM",
        help="the operator's Ed25519 public key: the management API (adapters) answers only calls signed "
        "with its private key (contract/management.py); without it the management API answers 403",
    )
    tls = parser.add_argument_group("TLS (both or neither)")
    tls.add_argument(
        "--tls-cert-file",
        metavar="PEM",
        help="serve HTTPS with this certificate (chain) on the one port; the files are looked at every few "
        "seconds and a renewed certificate is used for new connections without a restart "
        "(runtime/serving/tls.py)",
    )
    tls.add_argument("--tls-key-file", metavar="PEM", help="the certificate's private key (unencrypted)")


def config_from_args(ns: argparse.Namespace, extra_args: list[str]) -> ServeConfig:
    values = {k: v for k, v in vars(ns).items() if k in ServeConfig.model_fields and v is not None}
    values["extra_args"] = tuple(extra_args)
    if "lora" in values:
        values["lora"] = tuple(values["lora"])
    try:
        return ServeConfig.model_validate(values)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            if not err["loc"]:  # a rule across flags: its message names them
                problems.append(str(err["msg"]).removeprefix("Value error, "))
                continue
            field = str(err["loc"][0])
            flag = "arguments after --" if field == "extra_args" else flag_name(field)
            given = values.get(field)
            problems.append(f"{flag}: {err['msg']} (got {given!r})")
        raise ConfigError("; ".join(problems)) from None
