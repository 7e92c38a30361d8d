"""LoRA adapters on a running engine: load, replace and unload at run time, and the HTTP API for it.

vLLM's pieces do the work: `EngineClient.add_lora` / `remove_lora` with a `LoRARequest` load the weights
into the engine (and check them), and vLLM's `OpenAIServingModels.lora_requests` (the dict its OpenAI
routes read) makes `model: <adapter>` route to the adapter and `/v1/models` list it with the base model as
its parent. The runtime adds what a Kubernetes operator needs: sources as for the base model (file://,
pvc://, hf://, s3://), checks that name the problem (lora.py), idempotent PUTs, a replacement that never
answers 404 (the new version is loaded before the old one drains), and an unload that drains: the name
leaves `lora_requests` at once (new requests get vLLM's 404), the requests inside finish (up to
--drain-timeout), then the engine drops the weights. Each request's adapter version is counted by a
subclass of vLLM's AsyncLLM around `generate` (adapter_engine_class), which also gives the metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pagoda import contract
from pagoda.contract.payloads import AdapterEntry, AdapterList, AdapterSource
from pagoda.runtime.models import modeluri, sources
from pagoda.runtime.serving.apierrors import openai_error
from pagoda.runtime.serving.lora import (
    AdapterError,
    AdapterFiles,
    AdapterRemoved,
    AdapterTracker,
    TokenCounter,
    check_adapter_dir,
    check_name,
    check_revision,
    check_source,
    described,
    vllm_error,
)

log = logging.getLogger("pagoda.runtime.serving.adapters")
PATH = contract.ADAPTERS_PATH
LOADING, LOADED, UNLOADING, FAILED = "Loading", "Loaded", "Unloading", "Failed"


@dataclass
class Adapter:
    name: str
    source: str
    state: str
    lora_id: int | None = None
    path: str | None = None
    rank: int | None = None
    error: str | None = None
    reason: str | None = None  # the error's type, e.g. AdapterRankTooLarge
    loaded_at: float | None = None
    revision: str | None = None  # hub revision of an hf:// source; None: the default branch

    def payload(self, tracker: AdapterTracker) -> AdapterEntry:
        """What the adapters API says of it (contract/payloads.py): the fields its state has, even when null
        (a Loaded adapter's path, a Failed one's reason)."""
        fields: dict[str, Any] = {"name": self.name, "source": self.source, "state": self.state}
        if self.revision is not None:
            fields["revision"] = self.revision
        if self.state in (LOADED, UNLOADING):
            counts = tracker.counts.get(self.name)
            fields |= {"path": self.path, "rank": self.rank, "loaded_at": self.loaded_at}
            fields |= {"in_flight": tracker.in_flight.get(self.lora_id or 0, 0)}
            fields |= {"requests": counts.requests if counts else 0}
        if self.state == FAILED:
            fields |= {"reason": self.reason, "error": self.error}
        return AdapterEntry(**fields)


class AdapterManager:
    def __init__(self, base_name: str, cache_dir: str, drain_timeout: float, enabled: bool) -> None:
        self.base_name, self.cache_dir, self.drain_timeout = base_name, cache_dir, drain_timeout
        self.enabled = enabled
        self.tracker = AdapterTracker()
        self.adapters: dict[str, Adapter] = {}
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.engine: Any = None
        self.models: Any = None  # vLLM's OpenAIServingModels
        self.base_dir = Path()
        self.max_rank = self.max_adapters = 0

    def attach(self, engine: Any, models: Any, base_dir: Path) -> None:
        """After the engine and vLLM's app are built."""
        self.engine, self.models, self.base_dir = engine, models, base_dir
        lora_config = engine.vllm_config.lora_config
        if self.enabled and lora_config is not None:
            self.max_rank, self.max_adapters = lora_config.max_lora_rank, lora_config.max_cpu_loras
            engine.adapter_tracker = self.tracker

    def describe(self) -> AdapterList:
        adapters = [a.payload(self.tracker) for a in sorted(self.adapters.values(), key=lambda a: a.name)]
        return AdapterList(
            enabled=self.enabled, max_adapters=self.max_adapters, max_rank=self.max_rank, adapters=adapters
        )

    def get(self, name: str) -> Adapter:
        adapter = self.adapters.get(name)
        if adapter is None:
            raise AdapterError(f"adapter {name} is not loaded", "AdapterNotFound", 404)
        return adapter

    async def load(self, name: str, source: str, revision: str | None = None) -> Adapter:
        """Load `name` from `source` (at `revision`, for hf://); the same source and revision again is a
        no-op, another one replaces it."""
        check_revision(name, check_source(check_name(name), source), revision)
        if not self.enabled or self.engine is None:
            raise AdapterError(
                "LoRA is not enabled on this server: start it with --enable-lora", "LoRADisabled", 409
            )
        if name == self.base_name:
            raise AdapterError(f"adapter {name}: that is the base model's name")
        async with self._locks[name]:
            current = self.adapters.get(name)
            if (
                current
                and current.state == LOADED
                and (current.source, current.revision) == (source, revision)
            ):
                return current
            serving = current if current and current.state == LOADED else None
            if serving is None:
                self.adapters[name] = Adapter(name, source, LOADING, revision=revision)
            try:
                self._check_room(name)
                new, request = await self._load(name, source, revision)
            except AdapterError as exc:
                log.error(
                    "Failed to load adapter name=%s source=%s revision=%s reason=%s: %s",
                    *(name, source, revision, exc.kind, exc),
                )
                if serving is None:  # a failed replacement keeps the old version serving
                    failed = Adapter(name, source, FAILED, error=str(exc), reason=exc.kind, revision=revision)
                    self.adapters[name] = failed
                raise
            self.models.lora_requests[name] = request  # from now on requests get the new version
            self.adapters[name] = new
            log.info(
                "Loaded adapter name=%s source=%s revision=%s path=%s rank=%s",
                *(name, source, revision, new.path, new.rank),
            )
            if serving is not None and serving.lora_id is not None:
                await self._retire(name, serving.lora_id)
            return new

    async def unload(self, name: str) -> Adapter:
        """Stop routing to `name` at once, let its requests finish, then drop it from the engine."""
        async with self._locks[name]:
            adapter = self.get(name)
            if adapter.state == LOADED and adapter.lora_id is not None:
                adapter.state = UNLOADING
                self.models.lora_requests.pop(name, None)  # new requests: vLLM's 404 model-not-found
                await self._retire(name, adapter.lora_id)
            del self.adapters[name]
            log.info("Unloaded adapter name=%s source=%s", name, adapter.source)
            return adapter

    async def load_at_start(self, flags: list[tuple[str, str]]) -> None:
        """The --lora adapters; one that fails is logged and listed as Failed, and the server starts."""
        for name, source in flags:
            try:
                await self.load(name, source)
            except AdapterError:
                pass

    def _check_room(self, name: str) -> None:
        held = [a for a in self.adapters.values() if a.name != name and a.state != FAILED]
        if len(held) >= self.max_adapters:
            raise AdapterError(
                f"adapter {name}: this replica already holds {len(held)} adapters, the most it may "
                f"(--max-cpu-loras {self.max_adapters}); remove one first",
                "TooManyAdapters",
                409,
            )

    async def _load(self, name: str, source: str, revision: str | None) -> tuple[Adapter, Any]:
        """Fetch, check and add to the engine; the Adapter and vLLM's LoRARequest for it."""
        from vllm.lora.request import LoRARequest

        files = await asyncio.to_thread(self._fetch, name, source, revision)
        lora_id = self.models.lora_id_counter.inc(1)
        request = LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=str(files.path))
        request.base_model_name = self.base_name
        try:
            await self.engine.add_lora(request)
        except Exception as exc:
            message = f"adapter {name} ({described(source, revision)}): {vllm_error(str(exc))}"
            raise AdapterError(message, "AdapterLoadFailed", 422) from None
        path, now = str(files.path), time.time()
        adapter = Adapter(name, source, LOADED, lora_id, path, files.rank, loaded_at=now, revision=revision)
        return adapter, request

    def _fetch(self, name: str, source: str, revision: str | None = None) -> AdapterFiles:
        """Blocking: download (hf://, s3://; an hf:// source at `revision`) and check the adapter's
        directory."""
        try:
            path = sources.fetch(modeluri.parse_model_uri(source), self.cache_dir, revision)
        except modeluri.ModelSourceError as exc:
            kind = "AdapterSourceNotFound" if exc.reason == "ModelNotFound" else "AdapterDownloadFailed"
            message = str(exc).removeprefix("model ").replace(source, described(source, revision), 1)
            raise AdapterError(f"adapter {name}: {message}", kind, 422) from None
        return check_adapter_dir(name, described(source, revision), path, self.base_dir, self.max_rank)

    async def _retire(self, name: str, lora_id: int) -> None:
        try:
            async with asyncio.timeout(self.drain_timeout):
                await self.tracker.drain(lora_id)
        except TimeoutError:
            log.warning(
                "Adapter drain timed out name=%s in_flight=%d", name, self.tracker.in_flight.get(lora_id, 0)
            )
        try:
            await self.engine.remove_lora(lora_id)
        except Exception as exc:  # the engine may be gone; nothing else holds the weights
            log.warning("Failed to remove adapter from the engine name=%s error=%s", name, exc)


def adapter_engine_class() -> Any:
    """vLLM's AsyncLLM, counting each adapter version's requests around `generate` (for the drain and the
    metrics) and refusing an adapter version that is being removed with vLLM's 404."""
    from vllm.exceptions import VLLMNotFoundError
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    class AdapterEngine(AsyncLLM):  # type: ignore[misc,unused-ignore]
        adapter_tracker: AdapterTracker | None = None

        async def generate(
            self,
            prompt: Any,
            sampling_params: Any,
            request_id: str,
            *,
            lora_request: Any = None,
            **kwargs: Any,
        ) -> AsyncGenerator[Any, None]:
            args = (prompt, sampling_params, request_id)
            tracker = self.adapter_tracker
            if lora_request is None or tracker is None:
                async for out in super().generate(*args, lora_request=lora_request, **kwargs):
                    yield out
                return
            tokens = TokenCounter(delta=sampling_params.output_kind == RequestOutputKind.DELTA)
            serving = tracker.serving(lora_request.lora_name, lora_request.lora_int_id)
            try:
                counts = serving.__enter__()
            except AdapterRemoved:
                raise VLLMNotFoundError(f"The model `{lora_request.lora_name}` does not exist.") from None
            try:
                async for out in super().generate(*args, lora_request=lora_request, **kwargs):
                    tokens.add(out)
                    yield out
            finally:
                counts.generation_tokens += tokens.total
                serving.__exit__(None, None, None)

    return AdapterEngine


def management_app(manager: AdapterManager) -> Any:
    """GET /v1/pagoda/adapters, GET|PUT|DELETE /v1/pagoda/adapters/{name}: an ASGI app of its own, not a
    part of vLLM's. The server's gate lets only calls the operator signed reach it (server.py,
    management.py); vLLM's API key (spec.runtime.apiKeySecret) is for the inference API and not asked."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route, Router

    def error(exc: AdapterError) -> JSONResponse:
        return JSONResponse(openai_error(str(exc), exc.status, exc.kind), status_code=exc.status)

    async def list_adapters(request: Request) -> JSONResponse:
        return JSONResponse(manager.describe().wire())

    async def one_adapter(request: Request) -> JSONResponse:
        name = request.path_params["name"]
        try:
            if request.method == "GET":
                adapter = manager.get(name)
            elif request.method == "DELETE":
                adapter = await manager.unload(name)
                unloaded = adapter.payload(manager.tracker).model_copy(update={"state": "Unloaded"})
                return JSONResponse(unloaded.wire())
            else:
                adapter = await manager.load(name, *await _source(request, name))
        except AdapterError as exc:
            return error(exc)
        return JSONResponse(adapter.payload(manager.tracker).wire())

    return Router(
        routes=[
            Route(PATH, list_adapters, methods=["GET"]),
            Route(PATH + "/{name}", one_adapter, methods=["GET", "PUT", "DELETE"]),
        ]
    )


async def _source(request: Any, name: str) -> tuple[str, str | None]:
    """The PUT body (contract/payloads.py AdapterSource): {"source": "<URI>"}, and "revision" for an hf://
    source."""
    try:
        body = AdapterSource.model_validate_json(await request.body())
    except ValidationError as exc:
        if [error["loc"] for error in exc.errors()] == [("revision",)]:
            raise AdapterError(
                f"adapter {name}: revision must be a string (a branch, tag or commit)"
            ) from None
        body = None
    if body is None or not body.source:
        raise AdapterError(
            f'adapter {name}: send a JSON body {{"source": "<URI>"}} (file://, pvc://, hf://, s3://), with '
            '"revision" for an hf:// source'
        )
    return body.source, body.revision
