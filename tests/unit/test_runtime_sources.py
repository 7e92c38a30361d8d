"""Tier 1: model URI parsing and local resolution (file://, pvc://, hf:// cache, s3:// settings)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from minio.datatypes import Object

from pagoda.runtime import sources
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
        ("s3://my-bucket/llama/3-8b/", "s3", "my-bucket", "3-8b"),
        ("oci://registry.example:5000/models/llama:3.1", "oci", "/mnt/model-image", "model-image"),
        ("oci://ghcr.io/org/llama@sha256:" + "0" * 64, "oci", "/mnt/model-image", "model-image"),
    ],
)
def test_parse(uri: str, scheme: str, location: str, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGODA_PVC_ROOT", raising=False)
    monkeypatch.delenv("PAGODA_IMAGE_MODEL_DIR", raising=False)
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
        "oci://registry",  # no repository
        "oci://registry/Upper",  # repositories are lower case
        "oci://registry/x:bad tag",
    ],
)
def test_parse_rejects_with_the_uri_in_the_message(uri: str) -> None:
    with pytest.raises(ModelSourceError, match="model "):
        parse_model_uri(uri)


@pytest.mark.parametrize(
    "uri",
    [
        "s3://bucket/../x",
        "s3://bucket/llama/../../x",
        "s3://bucket/llama/..",
        "s3://bucket//etc",
        "s3://bucket/llama//tiny",
        "s3://bucket/llama/tiny//",
        "s3://bucket/llama/./tiny",
    ],
)
def test_s3_prefix_with_dot_dot_or_empty_parts_is_refused(uri: str) -> None:
    """The prefix is also the cache folder's path: '..' would leave the cache, and '.' or `//` would name
    another S3 prefix than the folder the files are written to."""
    with pytest.raises(ModelSourceError) as caught:
        parse_model_uri(uri)
    assert str(caught.value).startswith(f"model {uri!r}: the s3:// prefix ")
    assert "may not contain '.', '..' or empty parts ('//')" in str(caught.value)


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


@dataclass
class FakeS3Client:
    """A fake MinIO client: list_objects answers `keys` whatever the prefix (AWS S3 accepts any UTF-8 key,
    `p//tmp/x` and `p/a/../../x` included; MinIO refuses to store them, see tests/runtime/test_rt_s3.py),
    and fget_object writes each object where it is told, as the real one does."""

    keys: list[str]
    written: list[str] = field(default_factory=list)

    def list_objects(self, bucket: str, prefix: str, recursive: bool) -> list[Object]:
        return [Object(bucket, key, size=len(b"{}")) for key in self.keys]

    def fget_object(self, bucket: str, key: str, path: str) -> None:
        self.written.append(path)
        Path(path).write_text("{}")


def s3_store(monkeypatch: pytest.MonkeyPatch, keys: list[str]) -> FakeS3Client:
    store = FakeS3Client(keys)
    monkeypatch.setattr(sources, "_s3_client", lambda uri: store)
    return store


def test_s3_objects_under_the_prefix_land_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = s3_store(monkeypatch, ["p/config.json", "p/sub/model.safetensors", "p/a..b"])
    target = tmp_path / "s3" / "bkt" / "p"
    assert resolve(parse_model_uri("s3://bkt/p"), str(tmp_path)) == target
    assert store.written == [
        str(target / "config.json"),
        str(target / "sub/model.safetensors"),
        str(target / "a..b"),
    ]


@pytest.mark.parametrize(
    "key",
    [
        "p/{outside}",  # p//tmp/...: the remainder is an absolute path
        "p/a/../../escaped",  # lands in <cache>/s3/bkt, beside the model's folder
        "p/../escaped",
        "q/config.json",  # not under the prefix at all
    ],
)
def test_s3_key_that_leaves_the_cache_folder_is_refused_before_any_download(
    key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = key.format(outside=tmp_path / "outside" / "escaped")
    store = s3_store(monkeypatch, ["p/config.json", key])
    target = tmp_path / "cache" / "s3" / "bkt" / "p"
    would_write = Path(os.path.normpath(target / key.removeprefix("p/")))
    with pytest.raises(ModelSourceError) as caught:
        resolve(parse_model_uri("s3://bkt/p"), str(tmp_path / "cache"))
    assert caught.value.reason == "ModelInvalid"
    assert f"model s3://bkt/p: refused object key {key!r}" in str(caught.value)
    assert store.written == []  # not even p/config.json, which comes first
    assert not would_write.exists() and not target.exists()


def test_s3_key_through_a_symlink_out_of_the_cache_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "cache" / "s3" / "bkt" / "p"
    target.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (target / "link").symlink_to(elsewhere)
    store = s3_store(monkeypatch, ["p/link/config.json"])
    with pytest.raises(ModelSourceError, match=r"refused object key 'p/link/config.json'") as caught:
        resolve(parse_model_uri("s3://bkt/p"), str(tmp_path / "cache"))
    assert caught.value.reason == "ModelInvalid"
    assert store.written == [] and list(elsewhere.iterdir()) == []


def write_weights(path: Path, name: str = "model.safetensors") -> Path:
    """A real safetensors file (two tensors) written by the safetensors library, as a model's weights."""
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"a": np.zeros((4, 8), np.float32), "b": np.ones(3, np.float16)}, str(path / name))
    return path / name


def test_whole_weights_pass_and_give_their_header(tmp_path: Path) -> None:
    model = write_model(tmp_path / "m")
    weights = write_weights(model)
    assert resolve(parse_model_uri(f"file://{model}"), str(tmp_path / "cache")) == model
    header = sources.safetensors_header(weights)
    assert (header["a"]["shape"], header["b"]["dtype"]) == ([4, 8], "F16")


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda b: b[:-5], "has 129 bytes of tensor data where its header lists 134: the copy is cut"),
        (lambda b: b + b"\0", "has 135 bytes of tensor data where its header lists 134: trailing bytes"),
        (lambda b: b[:100], "announces a "),
        (lambda b: b[:5], "has 5 bytes, too few for a safetensors header"),
        (lambda b: b[:8] + b"{" * (len(b) - 8), "has a header that is not safetensors JSON"),
    ],
    ids=["cut-short", "trailing", "cut-in-header", "tiny", "not-json"],
)
def test_damaged_weights_are_model_invalid_naming_the_file(tmp_path: Path, damage: object, said: str) -> None:
    model = write_model(tmp_path / "m")
    weights = write_weights(model)
    weights.write_bytes(damage(weights.read_bytes()))  # type: ignore[operator]
    with pytest.raises(ModelSourceError) as caught:
        resolve(parse_model_uri(f"file://{model}"), str(tmp_path / "cache"))
    assert caught.value.reason == "ModelInvalid"
    assert f"model file://{model}: model.safetensors {said}" in str(caught.value)


def test_a_shard_the_index_names_but_the_folder_lacks_is_model_invalid(tmp_path: Path) -> None:
    model = write_model(tmp_path / "m")
    write_weights(model, "model-00001-of-00002.safetensors")
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ModelSourceError) as caught:
        resolve(parse_model_uri(f"file://{model}"), str(tmp_path / "cache"))
    assert caught.value.reason == "ModelInvalid"
    assert str(caught.value).endswith(
        "model.safetensors.index.json names weight files that are not there: model-00002-of-00002.safetensors"
    )
    (model / "model.safetensors.index.json").write_text("[]")
    with pytest.raises(ModelSourceError, match="has no readable weight_map"):
        resolve(parse_model_uri(f"file://{model}"), str(tmp_path / "cache"))
