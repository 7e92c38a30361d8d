"""LoRA adapters, the parts without the engine: names, checks of an adapter directory, and per-adapter counts.

An adapter is checked before vLLM sees it, because vLLM's own checks stop short: it refuses a rank above
--max-lora-rank, but on the CPU backend it accepts an adapter whose shapes belong to another base model. So
the runtime reads adapter_config.json (rank) and the safetensors headers of the adapter and of the base model
(shapes, no tensor is loaded), and names the first module that does not fit.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagoda import contract
from pagoda.runtime.models.modeluri import ModelSourceError, parse_model_uri
from pagoda.runtime.models.sources import safetensors_header

# Adapter names (what clients send as `model`): short, and usable in Kubernetes names and label values.
NAME = re.compile(contract.ADAPTER_NAME_PATTERN)
CONFIG_FILE = "adapter_config.json"
PEFT_PREFIX = "base_model.model."


class AdapterError(Exception):
    """An adapter cannot be loaded or found. `kind` is the stable CamelCase word of the HTTP error's `type`;
    `status` its HTTP status."""

    def __init__(self, message: str, kind: str = "InvalidAdapterRequest", status: int = 400) -> None:
        super().__init__(message)
        self.kind, self.status = kind, status


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise AdapterError(
            f"adapter name {name!r}: use 1-63 letters, digits, '.', '_' or '-', starting and ending with a "
            "letter or digit"
        )
    return name


def check_source(name: str, source: str) -> str:
    try:
        parse_model_uri(source)
    except ModelSourceError as exc:
        raise AdapterError(f"adapter {name}: source {str(exc).removeprefix('model ')}") from None
    return source


def check_revision(name: str, source: str, revision: str | None) -> str | None:
    """A hub revision (branch, tag or commit) is for an hf:// source only."""
    if revision is None:
        return None
    if not source.startswith("hf://"):
        raise AdapterError(
            f"adapter {name} ({source}): a revision is a hub revision (branch, tag or commit) and needs an "
            "hf:// source"
        )
    if not 1 <= len(revision) <= 255:
        raise AdapterError(f"adapter {name} ({source}): revision must be 1-255 characters")
    return revision


def described(source: str, revision: str | None) -> str:
    """The source as messages name it: `hf://org/name@v2` with a revision."""
    return source if revision is None else f"{source}@{revision}"


def parse_lora_flag(value: str) -> tuple[str, str]:
    """`--lora NAME=SOURCE` -> (name, source)."""
    name, sep, source = value.partition("=")
    if not sep or not source:
        raise AdapterError(f"{value!r}: use NAME=SOURCE (sql=file:///adapters/sql)")
    return check_name(name), check_source(name, source)


@dataclass(frozen=True)
class AdapterFiles:
    path: Path
    rank: int
    base_model: str  # adapter_config.json's base_model_name_or_path, for messages


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape, from a .safetensors file's JSON header (the tensors are not read)."""
    header = safetensors_header(path)
    return {k: list(v["shape"]) for k, v in header.items() if k != "__metadata__"}


def model_shapes(model_dir: Path) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        shapes.update(safetensors_shapes(file))
    return shapes


def shape_mismatch(adapter: dict[str, list[int]], base: dict[str, list[int]]) -> str | None:
    """The first adapter module whose lora_A/lora_B do not fit the base model's weight, described; None when
    all fit. Modules whose base weight is not a plain `.weight` (quantized models) are left to vLLM."""
    for key in sorted(adapter):
        if not key.endswith(".lora_A.weight"):
            continue
        module = key.removeprefix(PEFT_PREFIX).removesuffix(".lora_A.weight")
        a, b = adapter[key], adapter.get(key.replace(".lora_A.", ".lora_B."))
        weight = base.get(module + ".weight")
        if weight is None or b is None or len(weight) != 2 or len(a) != 2 or len(b) != 2:
            continue
        out_features, in_features = weight
        if a[1] != in_features or b[0] != out_features or a[0] != b[1]:
            return (
                f"{module} is {out_features}x{in_features} in the base model but the adapter's "
                f"lora_B x lora_A is {b[0]}x{b[1]} x {a[0]}x{a[1]}"
            )
    return None


def check_adapter_dir(name: str, source: str, path: Path, base_dir: Path, max_rank: int) -> AdapterFiles:
    """A loadable adapter: adapter_config.json readable, rank within max_rank, shapes of the base model."""
    what = f"adapter {name} ({source})"
    if not path.is_dir():
        raise AdapterError(
            f"{what}: {path} does not exist or is not a directory", "AdapterSourceNotFound", 422
        )
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
        ranks = [int(config["r"]), *(int(r) for r in (config.get("rank_pattern") or {}).values())]
    except FileNotFoundError:
        raise AdapterError(f"{what}: no {CONFIG_FILE} in {path}", "AdapterInvalid", 422) from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise AdapterError(
            f"{what}: {path / CONFIG_FILE} is not a PEFT LoRA config ({type(exc).__name__}: {exc})",
            "AdapterInvalid",
            422,
        ) from None
    base_model = str(config.get("base_model_name_or_path") or "?")
    if max(ranks) > max_rank:
        raise AdapterError(
            f"{what}: rank {max(ranks)} is above this server's maximum {max_rank} (--max-lora-rank)",
            "AdapterRankTooLarge",
            422,
        )
    weights = path / "adapter_model.safetensors"
    if weights.is_file():
        try:
            mismatch = shape_mismatch(safetensors_shapes(weights), model_shapes(base_dir))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise AdapterError(
                f"{what}: {weights} is not a readable safetensors file ({exc})", "AdapterInvalid", 422
            ) from None
        if mismatch:
            raise AdapterError(
                f"{what}: made for another base model ({base_model} in its {CONFIG_FILE}): {mismatch}",
                "AdapterBaseModelMismatch",
                422,
            )
    return AdapterFiles(path, max(ranks), base_model)


def vllm_error(message: str) -> str:
    """The worker's own message out of vLLM's wrapping: "Call to add_lora method failed: Worker failed with
    error '<message>', please check the stack trace above for the root cause"."""
    found = re.search(r"failed with error '(.*)', please check", message, re.S)
    return found[1] if found else message.removeprefix("Call to add_lora method failed: ")


class TokenCounter:
    """Tokens generated over one request's RequestOutputs: each output's completions hold the new tokens
    (delta) or all tokens so far (cumulative and final-only), per completion index."""

    def __init__(self, delta: bool) -> None:
        self.delta, self.summed, self.latest = delta, 0, dict[int, int]()

    def add(self, output: Any) -> None:
        for completion in output.outputs:
            if self.delta:
                self.summed += len(completion.token_ids)
            else:
                self.latest[completion.index] = len(completion.token_ids)

    @property
    def total(self) -> int:
        return self.summed + sum(self.latest.values())


class AdapterRemoved(Exception):
    """A request reached the engine for an adapter version that is being (or was) removed."""


@dataclass
class AdapterCounts:
    requests: int = 0
    generation_tokens: int = 0


@dataclass
class AdapterTracker:
    """Per adapter version (vLLM's lora_int_id, never reused): requests in the engine now, and the versions
    being removed; per adapter name: requests and generated tokens since start (the metrics)."""

    in_flight: dict[int, int] = field(default_factory=dict)
    removing: set[int] = field(default_factory=set)
    counts: dict[str, AdapterCounts] = field(default_factory=dict)
    _idle: dict[int, asyncio.Event] = field(default_factory=dict)

    @contextmanager
    def serving(self, name: str, lora_id: int) -> Iterator[AdapterCounts]:
        """Around one request's generation; AdapterRemoved once the version is being removed."""
        if lora_id in self.removing:
            raise AdapterRemoved(name)
        counts = self.counts.setdefault(name, AdapterCounts())
        counts.requests += 1
        self.in_flight[lora_id] = self.in_flight.get(lora_id, 0) + 1
        try:
            yield counts
        finally:
            self.in_flight[lora_id] -= 1
            if not self.in_flight[lora_id]:
                del self.in_flight[lora_id]
                if event := self._idle.pop(lora_id, None):
                    event.set()

    async def drain(self, lora_id: int) -> None:
        """Refuse new requests for this version, then wait for its requests to finish (the caller bounds
        the wait)."""
        self.removing.add(lora_id)
        if self.in_flight.get(lora_id):
            await self._idle.setdefault(lora_id, asyncio.Event()).wait()
