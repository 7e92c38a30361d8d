"""The name a model is served under when spec.model.servedName is unset (issue #40 §6): one rule, in
contract/__init__.py, that the runtime serves, the operator's models check adapters against, and the CRD's CEL
rule spells again for the API server. Each spelling is held to the others here, on every scheme (the CEL one
in celpy, with the Kubernetes strings functions of conftest.py); tier 2 (tests/integration/test_admission.py
and test_admission_properties.py) holds the real API server's evaluation to pydantic."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from pagoda import contract
from pagoda.operator.api import InferenceServiceSpec, error_messages
from pagoda.operator.api import rules as r
from pagoda.runtime.models.modeluri import ModelSource, ModelSourceError, parse_model_uri
from pagoda.runtime.serving.config import ServeConfig
from tests.unit.conftest import cel_evaluate

SERVED_NAME_CEL = contract.default_served_name_cel("uri")
cel_evaluate(SERVED_NAME_CEL, uri="file:///models/tiny")  # compiled once, before hypothesis runs

# (model URI, the name the runtime serves it under without --served-model-name)
NAMES: list[tuple[str, str]] = [
    ("file:///models/tiny", "tiny"),
    ("file:///models/tiny/", "tiny"),
    ("file:///models/tiny/./", "tiny"),
    ("file:///models//tiny", "tiny"),
    ("pvc://models/mistralai/Mixtral", "Mixtral"),
    ("pvc://models/tiny/", "tiny"),
    ("pvc://models", "models"),
    ("pvc://models/", "models"),
    ("oci://registry.example:5000/models/llama:3.1", contract.IMAGE_MODEL_NAME),
    ("oci://registry.example/org/llama@sha256:" + "0" * 64, contract.IMAGE_MODEL_NAME),
    ("hf://gpt2", "gpt2"),
    ("hf://gpt2/", "gpt2"),
    ("hf://mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-v0.3"),
    ("hf://mistralai/Mistral-7B-v0.3/", "mistralai/Mistral-7B-v0.3"),
    ("s3://my-bucket/llama/3.1/8b-instruct", "8b-instruct"),
    ("s3://my-bucket/llama/3.1/8b-instruct/", "8b-instruct"),
    ("s3://my-bucket/tiny", "tiny"),
]


@pytest.fixture(autouse=True)
def _default_mounts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime's pvc:// and oci:// folders as the operator mounts them."""
    monkeypatch.delenv("PAGODA_PVC_ROOT", raising=False)
    monkeypatch.delenv("PAGODA_IMAGE_MODEL_DIR", raising=False)


@pytest.mark.parametrize(("uri", "name"), NAMES, ids=[uri for uri, _ in NAMES])
def test_every_spelling_of_the_rule_gives_the_runtimes_name(uri: str, name: str) -> None:
    assert contract.default_served_name(uri) == name
    assert parse_model_uri(uri).default_name == name
    assert ServeConfig(model=uri).name == name
    assert cel_evaluate(SERVED_NAME_CEL, uri=uri) == name
    assert InferenceServiceSpec.model_validate(_spec(uri)).served_name == name


def test_a_bare_path_is_a_file_uri() -> None:
    assert contract.default_served_name("/models/tiny/") == parse_model_uri("/models/tiny/").default_name
    assert contract.default_served_name("/models/tiny/") == "tiny"


def test_the_oci_name_is_where_the_image_is_mounted() -> None:
    assert contract.IMAGE_MODEL_NAME == Path(contract.IMAGE_MODEL_DIR).name == "model-image"


def test_a_served_name_given_wins() -> None:
    spec = InferenceServiceSpec.model_validate(_spec("file:///models/tiny", servedName="base"))
    assert spec.served_name == "base"


def _spec(uri: str, adapters: tuple[str, ...] = (), **model: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"uri": uri, **model}, "resources": {"gpu": {"count": 1}}}
    if adapters:
        spec["lora"] = {
            "maxLoras": len(adapters),
            "adapters": [{"name": name, "uri": f"pvc://adapters/{name}"} for name in adapters],
        }
    return spec


def _object(spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "llama"}, "spec": spec}


# (model URI, an adapter named like the model's served name)
CLASHES: list[tuple[str, str]] = [
    ("file:///models/tiny", "tiny"),
    ("file:///models/tiny/", "tiny"),
    ("pvc://models/llama/8b-instruct", "8b-instruct"),
    ("pvc://llama", "llama"),
    ("oci://registry.example/models/llama:3.1", contract.IMAGE_MODEL_NAME),
    ("hf://gpt2", "gpt2"),
    ("hf://gpt2/", "gpt2"),
    ("s3://my-bucket/llama/3.1/8b-instruct/", "8b-instruct"),
]


@pytest.mark.parametrize(("uri", "adapter"), CLASHES, ids=[uri for uri, _ in CLASHES])
def test_an_adapter_named_like_the_derived_served_name_is_refused(
    uri: str, adapter: str, cel_check: Callable[[dict[str, Any]], list[str]]
) -> None:
    """What every pod would refuse (ServeConfig: the adapter has the served model's name) is refused at
    admission (CEL) and by the operator's models, with the same message."""
    spec = _spec(uri, ("sql", adapter))
    with pytest.raises(ValidationError) as caught:
        InferenceServiceSpec.model_validate(spec)
    assert r.MSG_ADAPTER_SERVED_NAME in error_messages(caught.value)
    assert cel_check(_object(spec)) == [r.MSG_ADAPTER_SERVED_NAME]
    with pytest.raises(ValidationError, match="has the served model's name"):
        ServeConfig(
            model=uri, max_loras=2, lora=(f"sql={spec['lora']['adapters'][0]['uri']}", f"{adapter}=/a")
        )


# (model URI, an adapter name the model is not served under: another part of the URI)
NO_CLASHES: list[tuple[str, str]] = [
    ("file:///models/tiny", "models"),
    ("pvc://models/llama/8b-instruct", "models"),
    ("pvc://models/llama/8b-instruct", "llama"),
    ("oci://registry.example/models/llama:3.1", "llama"),
    ("hf://org/name", "name"),
    ("hf://org/name", "org"),
    ("s3://my-bucket/llama/8b-instruct", "my-bucket"),
    ("s3://my-bucket/llama/8b-instruct", "llama"),
]


@pytest.mark.parametrize(("uri", "adapter"), NO_CLASHES, ids=[f"{u}-{a}" for u, a in NO_CLASHES])
def test_an_adapter_named_like_another_part_of_the_uri_is_accepted(
    uri: str, adapter: str, cel_check: Callable[[dict[str, Any]], list[str]]
) -> None:
    spec = _spec(uri, (adapter,))
    InferenceServiceSpec.model_validate(spec)
    assert cel_check(_object(spec)) == []
    ServeConfig(model=uri, lora=(f"{adapter}=/a",))


def test_with_a_served_name_the_derived_name_is_free(
    cel_check: Callable[[dict[str, Any]], list[str]],
) -> None:
    spec = _spec("file:///models/tiny", ("tiny",), servedName="base")
    InferenceServiceSpec.model_validate(spec)
    assert cel_check(_object(spec)) == []
    refused = _spec("file:///models/tiny", ("base",), servedName="base")
    assert cel_check(_object(refused)) == [r.MSG_ADAPTER_SERVED_NAME]


# Model URIs the CRD's pattern admits, built from parts that make every path rule come up: empty parts ('//'),
# '.', '..', trailing slashes, names with dots.
_PART = st.sampled_from(["tiny", "models", "a.b", "x-1", "Llama_3", ".", "..", "", "model-image", "a.b.c"])
_PATH = st.lists(_PART, min_size=0, max_size=4).map("/".join)
_HF_PART = st.from_regex(r"[A-Za-z0-9][-._A-Za-z0-9]{0,8}", fullmatch=True)
MODEL_URIS = st.one_of(
    st.builds(lambda p, s: f"file:///{p}{s}", _PATH, st.sampled_from(["", "/", "/.", "//"])),
    st.builds(
        lambda c, p: f"pvc://{c}" + (f"/{p}" if p is not None else ""),
        st.sampled_from(["c", "my-claim"]),
        st.none() | _PATH,
    ),
    st.builds(lambda p, s: f"s3://my-bucket/{p}{s}", _PATH.filter(bool), st.sampled_from(["", "/"])),
    st.builds(
        lambda o, n, s: f"hf://{o}" + (f"/{n}" if n else "") + s,
        _HF_PART,
        st.none() | _HF_PART,
        st.sampled_from(["", "/"]),
    ),
    st.sampled_from(["oci://registry.example/models/llama:3.1", "oci://registry.example:5000/tiny-model"]),
    st.from_regex(r.MODEL_URI_PATTERN, fullmatch=True),
).filter(lambda uri: re.match(r.MODEL_URI_PATTERN, uri) is not None and "\n" not in uri)


def _pathlib_name(source: ModelSource) -> str:
    """The runtime's rule before it moved to the contract, which it must keep: hf:// its repository id, oci://
    its folder's name, the others Path(...).name of their path (a trailing '/' dropped), else the location."""
    if source.scheme == "hf":
        return source.location
    tail = source.key if source.scheme == "s3" else source.location
    return Path(tail.rstrip("/")).name or source.location


@settings(max_examples=300, deadline=None, derandomize=True)
@given(MODEL_URIS)
def test_the_cel_spelling_and_the_runtime_agree_with_the_rule_on_any_admitted_uri(uri: str) -> None:
    name = contract.default_served_name(uri)
    assert cel_evaluate(SERVED_NAME_CEL, uri=uri) == name, uri
    try:
        source = parse_model_uri(uri)
    except ModelSourceError:  # admitted, refused by every pod at start ('..' or '//' in a pvc:// path, ...)
        return
    assert source.default_name == name
    assert _pathlib_name(source) == name, uri
