"""spec.lora.adapters[].revision: a hub revision for an hf:// adapter, refused for other schemes (pydantic and
CEL alike), sent by the operator in the runtime's PUT, and used by the runtime when it downloads the adapter
(huggingface_hub faked: nothing is downloaded)."""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from pagoda.contract.management import Signer, new_private_key
from pagoda.operator.api import InferenceServiceSpec, error_messages
from pagoda.operator.api import rules as r
from pagoda.operator.kube.adapters import AdapterSync
from pagoda.runtime.serving.adapters import AdapterManager, management_app
from pagoda.runtime.tools.tinyadapter import make_tiny_adapter

Obj = dict[str, Any]
HF = "hf://example-org/sql-lora"
IP = "10.244.0.2"
SIGNER = Signer(new_private_key())  # the operator's key (the runtime here does not check it)


def _object(spec: Obj) -> Obj:
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "llama"},
        "spec": spec,
    }


def _with_adapter(spec: Obj, adapter: Obj) -> Obj:
    spec = copy.deepcopy(spec)
    spec["lora"] = {"maxLoras": 1, "adapters": [adapter]}
    return spec


# --- the API ---------------------------------------------------------------------------------------------


def test_a_revision_with_an_hf_uri_is_accepted(
    llama_spec: Obj, cel_check: Callable[[Obj], list[str]]
) -> None:
    spec = _with_adapter(llama_spec, {"name": "sql", "uri": HF, "revision": "v2"})
    parsed = InferenceServiceSpec.model_validate(spec)
    assert parsed.lora is not None and parsed.lora.adapters[0].revision == "v2"
    assert cel_check(_object(spec)) == []


@pytest.mark.parametrize(
    "uri",
    ["s3://adapters/sql", "pvc://adapters/llama/sql", "file:///adapters/sql"],
    ids=["s3", "pvc", "file"],
)
def test_a_revision_without_an_hf_uri_is_refused_by_pydantic_and_cel_alike(
    llama_spec: Obj, cel_check: Callable[[Obj], list[str]], uri: str
) -> None:
    spec = _with_adapter(llama_spec, {"name": "sql", "uri": uri, "revision": "v2"})
    with pytest.raises(ValidationError) as caught:
        InferenceServiceSpec.model_validate(spec)
    assert error_messages(caught.value) == [r.MSG_ADAPTER_REVISION]
    assert cel_check(_object(spec)) == [r.MSG_ADAPTER_REVISION]


def test_the_crd_bounds_the_revision(crd_root_schema: Obj) -> None:
    lora = crd_root_schema["properties"]["spec"]["properties"]["lora"]
    field = lora["properties"]["adapters"]["items"]["properties"]["revision"]
    assert field["type"] == "string" and field["minLength"] == 1 and field["maxLength"] == 255


# --- the operator ----------------------------------------------------------------------------------------


class RecordingRuntime:
    """The runtime's adapters API for one pod, keeping what each PUT asked for (source and revision)."""

    def __init__(self) -> None:
        self.adapters: dict[str, Obj] = {}
        self.puts: list[Obj] = []

    def __call__(
        self, method: str, url: str, data: bytes | None, headers: dict[str, str], timeout: float
    ) -> tuple[int, Obj]:
        name = url.split("/v1/pagoda/adapters", 1)[1].lstrip("/")
        body = json.loads(data) if data else None
        if method == "GET":
            return 200, {"enabled": True, "adapters": list(self.adapters.values())}
        if method == "DELETE":
            return 200, {**self.adapters.pop(name), "state": "Unloaded"}
        assert method == "PUT" and body is not None
        self.puts.append(body)
        self.adapters[name] = {"name": name, **body, "state": "Loaded"}
        return 200, self.adapters[name]


def spec_of(obj: Obj) -> InferenceServiceSpec:
    """The owner's spec as the reconcile passes it to AdapterSync.sync (parsed once per pass)."""
    return InferenceServiceSpec.model_validate(obj["spec"])


def _owner(adapters: list[Obj]) -> Obj:
    spec: Obj = {
        "model": {"uri": "file:///models/tiny", "servedName": "tiny"},
        "resources": {"gpu": {"count": 1}},
        "lora": {"maxLoras": 2, "adapters": adapters},
    }
    return {"metadata": {"name": "tiny", "namespace": "ns", "uid": "o1"}, "spec": spec}


def _pod() -> Obj:
    status = {"podIP": IP, "conditions": [{"type": "Ready", "status": "True"}], "containerStatuses": []}
    return {"metadata": {"uid": "p1"}, "status": status}


def test_the_operator_sends_the_revision_and_a_new_revision_replaces_the_adapter() -> None:
    runtime = RecordingRuntime()
    sync = AdapterSync(SIGNER, runtime)
    pinned = {"name": "sql", "uri": HF, "revision": "v1"}
    report = sync.sync(spec_of(_owner([pinned, {"name": "chat", "uri": "file:///adapters/chat"}])), [_pod()])
    assert report is not None and report.status["adaptersReady"] == "2/2"
    assert runtime.puts == [{"source": HF, "revision": "v1"}, {"source": "file:///adapters/chat"}]

    runtime.puts.clear()  # the same spec again: in step, nothing is sent
    sync.sync(spec_of(_owner([pinned, {"name": "chat", "uri": "file:///adapters/chat"}])), [_pod()])
    assert runtime.puts == []

    report = sync.sync(spec_of(_owner([{**pinned, "revision": "v2"}])), [_pod()])
    assert runtime.puts == [{"source": HF, "revision": "v2"}]
    assert report is not None and report.status["adapters"] == [
        {"name": "sql", "readyReplicas": 1, "replicas": 1, "state": "Ready"}
    ]

    runtime.puts.clear()  # dropping the revision goes back to the default branch: another replacement
    sync.sync(spec_of(_owner([{"name": "sql", "uri": HF}])), [_pod()])
    assert runtime.puts == [{"source": HF}]


def test_an_adapter_loaded_at_another_revision_is_not_counted_as_serving() -> None:
    runtime = RecordingRuntime()
    runtime.adapters["sql"] = {"name": "sql", "source": HF, "revision": "v1", "state": "Loaded"}
    sync = AdapterSync(SIGNER, lambda m, u, b, h, t: (503, {}) if m == "PUT" else runtime(m, u, b, h, t))
    report = sync.sync(spec_of(_owner([{"name": "sql", "uri": HF, "revision": "v2"}])), [_pod()])
    assert report is not None
    assert report.status["adapters"][0]["readyReplicas"] == 0
    assert report.status["adapters"][0]["state"] == "Failed"


# --- the runtime -----------------------------------------------------------------------------------------


class RevisionNotFoundError(Exception):
    """Named as huggingface_hub's: the runtime maps the class name to AdapterSourceNotFound."""


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """The adapters API on a fake engine; hf:// downloads go to a fake snapshot_download that records the
    revision and answers a tiny adapter's directory (per revision, so that two revisions differ). The fake
    module stands in for huggingface_hub, which is not imported: it reads HF_HUB_OFFLINE once, at import,
    and other tests set it first."""
    from starlette.testclient import TestClient

    base = tmp_path / "base"
    base.mkdir()
    config = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
    }
    (base / "config.json").write_text(json.dumps(config))
    downloads: list[Obj] = []

    def snapshot_download(**kwargs: Any) -> str:
        downloads.append(kwargs)
        if kwargs["revision"] == "missing":
            raise RevisionNotFoundError("Invalid rev id: missing")
        return str(make_tiny_adapter(base, tmp_path / "snapshots" / str(kwargs["revision"])))

    monkeypatch.setitem(sys.modules, "huggingface_hub", SimpleNamespace(snapshot_download=snapshot_download))
    engine = SimpleNamespace(
        vllm_config=SimpleNamespace(lora_config=SimpleNamespace(max_lora_rank=8, max_cpu_loras=2)),
        added=[],
        removed=[],
    )

    async def add_lora(request: Any) -> None:
        engine.added.append((request.lora_int_id, request.lora_path))

    async def remove_lora(lora_id: int) -> None:
        engine.removed.append(lora_id)

    engine.add_lora, engine.remove_lora = add_lora, remove_lora
    counter = SimpleNamespace(value=0)

    def inc(n: int) -> int:
        counter.value += n
        return counter.value

    models = SimpleNamespace(lora_requests={}, lora_id_counter=SimpleNamespace(inc=inc))
    manager = AdapterManager("tiny", str(tmp_path / "cache"), drain_timeout=1, enabled=True)
    manager.attach(engine, models, base)
    # The adapters app alone: the signature check in front of it is tests/unit/test_runtime_management.py's.
    return SimpleNamespace(
        client=TestClient(management_app(manager)), downloads=downloads, engine=engine, models=models
    )


def test_the_runtime_downloads_the_revision_and_a_new_revision_replaces_the_adapter(
    runtime: SimpleNamespace,
) -> None:
    first = runtime.client.put("/v1/pagoda/adapters/sql", json={"source": HF, "revision": "v1"})
    assert first.status_code == 200, first.text
    assert first.json()["revision"] == "v1" and first.json()["state"] == "Loaded"
    assert [(d["repo_id"], d["revision"]) for d in runtime.downloads] == [("example-org/sql-lora", "v1")]
    again = runtime.client.put("/v1/pagoda/adapters/sql", json={"source": HF, "revision": "v1"})
    assert again.json()["loadedAt"] == first.json()["loadedAt"] and len(runtime.downloads) == 1
    second = runtime.client.put("/v1/pagoda/adapters/sql", json={"source": HF, "revision": "v2"})
    assert second.status_code == 200 and second.json()["revision"] == "v2"
    assert second.json()["path"].endswith("/v2") and runtime.downloads[-1]["revision"] == "v2"
    assert runtime.engine.removed == [1]  # the v1 version, after the v2 one serves
    assert runtime.models.lora_requests["sql"].lora_int_id == 2
    listed = runtime.client.get("/v1/pagoda/adapters").json()["adapters"]
    assert [(a["name"], a["revision"]) for a in listed] == [("sql", "v2")]
    default = runtime.client.put("/v1/pagoda/adapters/sql", json={"source": HF})
    assert default.status_code == 200 and "revision" not in default.json()
    assert runtime.downloads[-1]["revision"] is None


def test_the_runtime_names_a_missing_revision(runtime: SimpleNamespace) -> None:
    answer = runtime.client.put("/v1/pagoda/adapters/sql", json={"source": HF, "revision": "missing"})
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["type"] == "AdapterSourceNotFound"
    assert error["message"].startswith(
        f"adapter sql: {HF}@missing: could not download it (RevisionNotFoundError"
    )
    entry = runtime.client.get("/v1/pagoda/adapters/sql").json()
    assert entry["state"] == "Failed" and entry["revision"] == "missing"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"source": "file:///adapters/sql", "revision": "v1"}, "needs an hf:// source"),
        ({"source": "s3://adapters/sql", "revision": "v1"}, "needs an hf:// source"),
        ({"source": HF, "revision": 3}, "revision must be a string"),
        ({"source": HF, "revision": ""}, "revision must be 1-255 characters"),
    ],
)
def test_the_runtime_refuses_a_revision_it_cannot_use(
    runtime: SimpleNamespace, body: Obj, message: str
) -> None:
    answer = runtime.client.put("/v1/pagoda/adapters/sql", json=body)
    assert answer.status_code == 400
    assert answer.json()["error"]["type"] == "InvalidAdapterRequest"
    assert message in answer.json()["error"]["message"]
    assert runtime.downloads == []
