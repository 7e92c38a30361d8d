"""Tier 1: model URI parsing and local resolution (file://, pvc://, hf:// cache, s3:// settings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagoda.runtime.sources import ModelSourceError, parse_model_uri, resolve


def write_model(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return path


@pytest.mark.parametrize(
    ("uri", "scheme", "location", "name"),
    [
        ("file:///models/tiny", "file", "/models/tiny", "tiny"),
        ("/models/tiny/", "file", "/models/tiny/", "tiny"),
        ("pvc://models/mistralai/Mixtral", "pvc", "/mnt/models/models/mistralai/Mixtral", "Mixtral"),
        ("pvc://models", "pvc", "/mnt/models/models", "models"),
        ("hf://mistralai/Mistral-7B-v0.3", "hf", "mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-v0.3"),
        ("hf://gpt2", "hf", "gpt2", "gpt2"),
        ("s3://my-bucket/llama/3-8b", "s3", "my-bucket", "3-8b"),
    ],
)
def test_parse(uri: str, scheme: str, location: str, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGODA_PVC_ROOT", raising=False)
    source = parse_model_uri(uri)
    assert (source.scheme, source.location, source.default_name) == (scheme, location, name)


@pytest.mark.parametrize(
    "uri",
    [
        "models/tiny",  # relative path
        "file://models/tiny",  # not absolute
        "pvc://Bad_Claim/x",
        "pvc://claim/../../etc",
        "hf://",
        "hf://a/b/c",
        "s3://bucket",  # no prefix
        "s3://B/x",  # invalid bucket name
        "gs://bucket/x",
    ],
)
def test_parse_rejects_with_the_uri_in_the_message(uri: str) -> None:
    with pytest.raises(ModelSourceError, match="model "):
        parse_model_uri(uri)


def test_pvc_root_follows_the_mount_convention(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGODA_PVC_ROOT", str(tmp_path))
    model = write_model(tmp_path / "weights" / "llama")
    assert resolve(parse_model_uri("pvc://weights/llama"), str(tmp_path / "cache")) == model


def test_missing_and_broken_models_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match=r"model file:///nowhere: /nowhere does not exist"):
        resolve(parse_model_uri("file:///nowhere"), str(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelSourceError, match="no config.json"):
        resolve(parse_model_uri(f"file://{empty}"), str(tmp_path))
    (empty / "config.json").write_text("{not json")
    with pytest.raises(ModelSourceError, match="not JSON"):
        resolve(parse_model_uri(f"file://{empty}"), str(tmp_path))


def test_hf_uses_the_cached_copy_when_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "cache"
    # The hub's cache layout: models--org--name/{refs/main, snapshots/<commit>/...}.
    repo = cache / "hf" / "models--acme--tiny"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = write_model(repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    assert resolve(parse_model_uri("hf://acme/tiny"), str(cache)).resolve() == snapshot.resolve()


def test_hf_without_network_or_cache_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ModelSourceError, match=r"model hf://acme/missing: could not download .* no cached copy"
    ):
        resolve(parse_model_uri("hf://acme/missing"), str(tmp_path))


@pytest.mark.parametrize("missing", ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"])
def test_s3_without_credentials_names_the_uri(
    missing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.delenv(missing)
    with pytest.raises(
        ModelSourceError,
        match=r"model s3://models/llama: s3:// needs credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET",
    ):
        resolve(parse_model_uri("s3://models/llama"), str(tmp_path))


@pytest.mark.parametrize("var", ["AWS_ENDPOINT_URL", "S3_ENDPOINT_URL"])
@pytest.mark.parametrize("endpoint", ["ftp://store:21", "http://", "http://store:9000/models"])
def test_s3_bad_endpoint_names_the_variable(
    var: str, endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv(var, endpoint)
    with pytest.raises(ModelSourceError, match=rf"model s3://models/llama: {var} .* must be http"):
        resolve(parse_model_uri("s3://models/llama"), str(tmp_path))
