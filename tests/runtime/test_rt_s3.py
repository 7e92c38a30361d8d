"""Tier 3: the s3:// model source against a real S3 API server (MinIO, built by `make tools`) on loopback.

The tiny model is uploaded under a prefix with the MinIO client, then resolved through the runtime's
model-source code into a cache dir; the engine itself is not started (the lifecycle tests cover that).
"""

from __future__ import annotations

import io
import json
import logging
import os
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest
from minio.datatypes import Object
from minio.error import S3Error

from e2e.lab.minio import USER, MinioServer
from pagoda.runtime.models import s3store
from pagoda.runtime.models.modelcache import ModelCache
from pagoda.runtime.models.modeluri import ModelSourceError, parse_model_uri
from pagoda.runtime.models.sources import resolve
from tests.repo import REPO

pytestmark = pytest.mark.runtime

BIN_DIR = Path(os.environ.get("PAGODA_BIN", REPO / ".pagoda-dev" / "bin"))
BUCKET = "pagoda-models"
PREFIX = "llama/tiny"


@pytest.fixture(scope="module")
def minio_server(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[MinioServer]:
    server = MinioServer(workdir=tmp_path_factory.mktemp("minio"), bin_dir=BIN_DIR)
    try:
        server.start()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    with server:
        server.upload(BUCKET, PREFIX, tiny_model)
        yield server


@pytest.fixture
def s3_env(minio_server: MinioServer, monkeypatch: pytest.MonkeyPatch) -> MinioServer:
    for name in ("AWS_SESSION_TOKEN", "S3_ENDPOINT_URL", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", USER)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", minio_server.password)
    monkeypatch.setenv("AWS_ENDPOINT_URL", minio_server.url)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    return minio_server


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_s3_model_arrives_byte_identical_and_is_kept_on_the_next_start(
    s3_env: MinioServer, tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    expected = tree(tiny_model)
    assert "config.json" in expected and len(expected) >= 3
    uri = f"s3://{BUCKET}/{PREFIX}"
    with caplog.at_level(logging.INFO, logger="pagoda.runtime.models.sources"):
        path = resolve(parse_model_uri(uri), str(tmp_path))
    assert path == s3store.s3_folder(parse_model_uri(uri), tmp_path)
    assert path.relative_to(tmp_path).parts[1].startswith("127.0.0.1_")  # the store's folder
    assert tree(path) == expected
    size = sum(len(data) for data in expected.values())
    messages = [r.getMessage() for r in caplog.records]
    assert f"Downloaded model bytes uri={uri} done={size} total={size}" in "\n".join(messages)
    assert any(f"objects={len(expected)} fetched={len(expected)} bytes={size}" in m for m in messages)

    caplog.clear()  # A restarted pod finds the files in its cache volume and fetches nothing.
    with caplog.at_level(logging.INFO, logger="pagoda.runtime.models.sources"):
        assert resolve(parse_model_uri(uri), str(tmp_path)) == path
    assert any(f"objects={len(expected)} fetched=0" in r.getMessage() for r in caplog.records)


def test_s3_runtimes_sharing_a_cache_download_a_model_once(
    s3_env: MinioServer, tiny_model: Path, tmp_path: Path
) -> None:
    """Three runtimes start at once on one node cache (spec.model.cache.scope Node): one downloads, the
    others wait for it and move no byte, and all load the same whole files."""
    uri, expected = f"s3://{BUCKET}/{PREFIX}", tree(tiny_model)
    size = sum(len(data) for data in expected.values())
    caches = [ModelCache(tmp_path) for _ in range(3)]  # each opens its own lock files: flock(2) sees 3 owners
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda cache: cache.fetch(parse_model_uri(uri), None), caches))
    assert sorted(r.bytes_moved for r in results) == [0, 0, size]
    assert {r.path for r in results} == {s3store.s3_folder(parse_model_uri(uri), tmp_path)}
    assert tree(results[0].path) == expected
    assert ModelCache(tmp_path).report()["models"] == [
        {"uri": uri, "bytes": size, "inUse": True, "lastUsed": ANY}
    ]
    for cache in caches:  # the runtimes stop: the model stays, free to evict
        cache.release()
    assert [m["inUse"] for m in ModelCache(tmp_path).report()["models"]] == [False]


def test_s3_wrong_credentials_name_the_uri(
    s3_env: MinioServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-password")
    with pytest.raises(
        ModelSourceError,
        match=rf"model s3://{BUCKET}/{PREFIX}: the store refused the credentials .*SignatureDoesNotMatch",
    ):
        resolve(parse_model_uri(f"s3://{BUCKET}/{PREFIX}"), str(tmp_path))
    assert not (
        s3store.s3_folder(parse_model_uri(f"s3://{BUCKET}/{PREFIX}"), tmp_path) / "config.json"
    ).exists()


def test_s3_missing_prefix_and_bucket_are_clear_errors(s3_env: MinioServer, tmp_path: Path) -> None:
    with pytest.raises(
        ModelSourceError,
        match=rf"model s3://{BUCKET}/llama/absent: no objects under s3://{BUCKET}/llama/absent/",
    ):
        resolve(parse_model_uri(f"s3://{BUCKET}/llama/absent"), str(tmp_path))
    # "llama/ti" is a string prefix of the upload's keys, but not a folder of it.
    with pytest.raises(ModelSourceError, match="no objects under"):
        resolve(parse_model_uri(f"s3://{BUCKET}/llama/ti"), str(tmp_path))
    with pytest.raises(ModelSourceError, match=r"model s3://no-such-bucket/x: the bucket does not exist"):
        resolve(parse_model_uri("s3://no-such-bucket/x"), str(tmp_path))


@pytest.mark.parametrize("template", ["p//tmp/{unique}", "p/a/../../{unique}"])
def test_s3_key_leaving_the_cache_is_refused_before_any_download(
    template: str, s3_env: MinioServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MinIO will not store either key: the server answers `p//...` with XMinioInvalidObjectName, and the
    MinIO client refuses '..' parts before sending (past that check, the HTTP layer would send the
    normalised path `/<bucket>/<unique>`). AWS S3 accepts any UTF-8 key, these included, so the key is
    added to MinIO's real listing (a fake listing over the real store), while the real object under the
    prefix would still come from MinIO: nothing may be downloaded, and nothing written where the key
    points."""
    key = template.format(unique=f"pagoda-s3-escape-{secrets.token_hex(8)}")
    store = s3_env.client()
    with pytest.raises((S3Error, ValueError)):
        store.put_object(BUCKET, key, io.BytesIO(b"{}"), 2)
    store.put_object(BUCKET, "p/config.json", io.BytesIO(b"{}"), 2)
    assert [o.object_name for o in store.list_objects(BUCKET, prefix="p/", recursive=True)] == [
        "p/config.json"
    ]

    extra = [key]
    real_client = s3store._s3_client

    def client_listing_extra_keys(uri: str) -> Any:
        client = real_client(uri)
        listed = client.list_objects

        def list_objects(bucket: str, **kwargs: Any) -> Iterator[Object]:
            yield from listed(bucket, **kwargs)
            yield from (Object(bucket, name, size=2) for name in extra)

        client.list_objects = list_objects
        return client

    monkeypatch.setattr(s3store, "_s3_client", client_listing_extra_keys)
    target = s3store.s3_folder(parse_model_uri(f"s3://{BUCKET}/p"), tmp_path)
    would_write = Path(os.path.normpath(target / key.removeprefix("p/")))
    with pytest.raises(ModelSourceError) as caught:
        resolve(parse_model_uri(f"s3://{BUCKET}/p"), str(tmp_path))
    assert caught.value.reason == "ModelInvalid"
    assert f"model s3://{BUCKET}/p: refused object key {key!r}" in str(caught.value)
    assert not would_write.exists() and not target.exists()

    extra.clear()  # the same client without the key: the real object comes from MinIO
    assert tree(resolve(parse_model_uri(f"s3://{BUCKET}/p"), str(tmp_path))) == {"config.json": b"{}"}


def test_the_same_bucket_and_prefix_on_two_stores_share_no_file(
    s3_env: MinioServer,
    tiny_model: Path,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two MinIO servers hold `s3://pagoda-models/llama/tiny`, with different configs: a cache shared by
    both (a namespace's node cache) gives each runtime its own store's files (issue #40 §5)."""
    other_model = tmp_path / "other"
    other_model.mkdir()
    for path in tiny_model.iterdir():
        if path.is_file():
            (other_model / path.name).write_bytes(path.read_bytes())
    config = json.loads((tiny_model / "config.json").read_text())
    (other_model / "config.json").write_text(json.dumps({**config, "pagoda_store": "other"}))
    other = MinioServer(
        workdir=tmp_path_factory.mktemp("minio-other"), bin_dir=BIN_DIR, password=s3_env.password
    )
    other.start()
    with other:
        other.upload(BUCKET, PREFIX, other_model)
        uri, cache = f"s3://{BUCKET}/{PREFIX}", tmp_path / "cache"
        first = ModelCache(cache).fetch(parse_model_uri(uri), None)
        monkeypatch.setenv("AWS_ENDPOINT_URL", other.url)
        second = ModelCache(cache).fetch(parse_model_uri(uri), None)
    assert first.path != second.path and first.bytes_moved > 0 and second.bytes_moved > 0
    assert tree(first.path) == tree(tiny_model)
    assert tree(second.path) == tree(other_model)
    assert first.path.parts[-2:] == second.path.parts[-2:] == tuple(PREFIX.split("/"))


def test_a_damaged_cached_file_of_the_right_size_is_downloaded_again(
    s3_env: MinioServer, tiny_model: Path, tmp_path: Path
) -> None:
    """The size alone called a model "already downloaded" (issue #40 §5): a shard damaged in the cache, its
    size kept, is fetched again, and the start is no cache hit."""
    uri = f"s3://{BUCKET}/{PREFIX}"
    first = ModelCache(tmp_path).fetch(parse_model_uri(uri), None)
    weights = max(first.path.glob("*.safetensors"), key=lambda path: path.stat().st_size)
    whole = weights.read_bytes()
    damaged = bytearray(whole)
    damaged[-1] ^= 0xFF  # tensor data: the header still checks out
    weights.write_bytes(bytes(damaged))
    again = ModelCache(tmp_path).fetch(parse_model_uri(uri), None)
    assert again.path == first.path and again.bytes_moved == len(whole)
    assert weights.read_bytes() == whole
    assert tree(again.path) == tree(tiny_model)
    assert ModelCache(tmp_path).fetch(parse_model_uri(uri), None).bytes_moved == 0  # whole again: a hit


def test_an_object_replaced_by_one_of_the_same_size_is_downloaded_again(
    s3_env: MinioServer, tiny_model: Path, tmp_path: Path
) -> None:
    """A retrained model's shards often keep their sizes: the store's ETag tells the new object apart."""
    store, prefix = s3_env.client(), f"replaced-{secrets.token_hex(4)}"
    store.put_object(BUCKET, f"{prefix}/config.json", io.BytesIO(b'{"v": 1}'), 8)
    path = resolve(parse_model_uri(f"s3://{BUCKET}/{prefix}"), str(tmp_path))
    assert (path / "config.json").read_bytes() == b'{"v": 1}'
    store.put_object(BUCKET, f"{prefix}/config.json", io.BytesIO(b'{"v": 2}'), 8)
    assert (
        resolve(parse_model_uri(f"s3://{BUCKET}/{prefix}"), str(tmp_path)) / "config.json"
    ).read_bytes() == (b'{"v": 2}')
