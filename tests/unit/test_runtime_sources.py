"""Tier 1: model URI parsing and local resolution (file://, pvc://, the hf:// cache and its checks, s3://)."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from minio.datatypes import Object

from pagoda.runtime.models import download, hfhub, s3store
from pagoda.runtime.models.modelcache import ModelCache
from pagoda.runtime.models.modeluri import ModelSourceError, parse_model_uri
from pagoda.runtime.models.sources import resolve, safetensors_header


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
        "pvc://claim//etc",
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


COMMIT = "0123456789abcdef0123456789abcdef01234567"
CONFIG = b'{"model_type": "llama"}'


def hub_snapshot(
    hub: Path, repo_id: str, lfs: dict[str, bytes], git: dict[str, bytes], shared: bool = False
) -> Path:
    """One revision in the Hugging Face client's cache layout, as it writes it: each blob
    `models--org--name/blobs/<name>` named by content (an LFS file's SHA-256; git's blob id, SHA-1 over
    b"blob <size>\\0" + bytes, for the others), the snapshot's files relative links to them, refs/main
    naming the commit. `shared`: the LFS bytes in the client's cache-wide store `<hub>/blobs/<xx>/<xet
    hash>`, the repository's blob a link there."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    for name, data in {**lfs, **git}.items():
        digest = hashlib.sha256(data) if name in lfs else hashlib.sha1(b"blob %d\0" % len(data) + data)
        blob = repo / "blobs" / digest.hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        if shared and name in lfs:
            store = hub / "blobs" / "ab" / hashlib.sha256(b"xet" + data).hexdigest()
            store.parent.mkdir(parents=True, exist_ok=True)
            store.write_bytes(data)
            blob.symlink_to(os.path.relpath(store, blob.parent))
        else:
            blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


def tiny_files(tmp_path: Path) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """hf://acme/tiny's files, LFS and git: whole weights, a config, a nested file."""
    weights = write_weights(tmp_path).read_bytes()
    return {"model.safetensors": weights}, {"config.json": CONFIG, "sub/t.json": b"{}"}


def tiny_on_the_hub(cache: Path, shared: bool = False) -> Path:
    """hf://acme/tiny in the cache `cache`, in the folder of HF_ENDPOINT's hub."""
    return hub_snapshot(
        hfhub.hf_cache("hf://acme/tiny", cache), "acme/tiny", *tiny_files(cache.parent), shared
    )


@dataclass
class FakeHub:
    """A Hugging Face hub on 127.0.0.1 serving one repository at one commit, as the real one answers the
    client: the revision, the tree listing, and each file (HEAD, then GET) with its commit and its ETag, the
    blob name (an LFS file's SHA-256 in X-Linked-Etag, else the git blob id). `served`: the files sent."""

    repo: str
    lfs: dict[str, bytes]
    git: dict[str, bytes]
    served: list[str] = field(default_factory=list)

    def etag(self, name: str) -> str:
        data = {**self.lfs, **self.git}[name]
        if name in self.lfs:
            return hashlib.sha256(data).hexdigest()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

    def answer(self, path: str) -> tuple[int, dict[str, str], bytes]:
        api, resolve_ = f"/api/models/{self.repo}/", f"/{self.repo}/resolve/{COMMIT}/"
        files = {**self.lfs, **self.git}
        if path.startswith(api + "revision/"):
            return 200, {}, json.dumps({"id": self.repo, "sha": COMMIT}).encode()
        if path.startswith(api + "tree/"):
            tree = [
                {"type": "file", "path": name, "size": len(data), "oid": self.etag(name)}
                | (
                    {"lfs": {"oid": self.etag(name), "size": len(data), "pointerSize": 134}}
                    if name in self.lfs
                    else {}
                )
                for name, data in files.items()
            ]
            return 200, {}, json.dumps(tree).encode()
        if path.startswith(resolve_) and (name := path.removeprefix(resolve_)) in files:
            headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{self.etag(name)}"'}
            if name in self.lfs:
                headers |= {"X-Linked-Etag": f'"{self.etag(name)}"', "X-Linked-Size": str(len(files[name]))}
            return 200, headers, files[name]
        return 404, {}, b"{}"


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        pytest.skip(
            "HF_HUB_OFFLINE was set when huggingface_hub was first imported: the client stays offline"
        )
    hub = FakeHub("acme/tiny", *tiny_files(tmp_path))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.reply(body=False)

        def do_GET(self) -> None:
            self.reply(body=True)

        def reply(self, body: bool) -> None:
            path = urlsplit(self.path).path
            status, headers, data = hub.answer(path)
            self.send_response(status)
            for name, value in (headers | {"Content-Length": str(len(data))}).items():
                self.send_header(name, value)
            self.end_headers()
            if body:
                if "/resolve/" in path:
                    hub.served.append(path.rsplit(f"{COMMIT}/", 1)[-1])
                self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()


def test_a_damaged_hf_file_is_downloaded_again_alone_and_the_start_is_no_hit(
    tmp_path: Path, fake_hub: FakeHub
) -> None:
    cache, source = tmp_path / "cache", parse_model_uri("hf://acme/tiny")
    snapshot = resolve(source, str(cache))
    assert sorted(fake_hub.served) == ["config.json", "model.safetensors", "sub/t.json"]
    assert snapshot.parent.parent.parent.parent.name == "hf-hubs"  # the fake hub's own folder
    fake_hub.served.clear()
    assert ModelCache(cache).fetch(source, None).bytes_moved == 0  # whole: a hit, nothing sent
    assert fake_hub.served == []
    weights = (snapshot / "model.safetensors").resolve()
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x01")  # a tensor byte; the size kept
    fetched = ModelCache(cache).fetch(source, None)
    assert fake_hub.served == ["model.safetensors"]
    assert fetched.bytes_moved == len(fake_hub.lfs["model.safetensors"])
    assert (snapshot / "model.safetensors").read_bytes() == fake_hub.lfs["model.safetensors"]
    assert resolve(source, str(cache)) == snapshot


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No network: a hub that refuses connections, so the cached copy is all there is. Not HF_HUB_OFFLINE:
    the client reads it once, when first imported, and the fake hub's test needs the client online."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")


def test_git_blob_ids_are_the_ones_git_gives() -> None:
    assert download.file_digest(Path(os.devnull), "git-sha1") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"


def test_git_blob_id_of_content(tmp_path: Path) -> None:
    (tmp_path / "hello").write_bytes(b"hello\n")  # `git hash-object` of it
    assert download.file_digest(tmp_path / "hello", "git-sha1") == "ce013625030ba8dba906f756967f9e9ca394464a"
    with pytest.raises(ValueError, match="kind must be sha256 or git-sha1, got 'md5'"):
        download.file_digest(tmp_path / "hello", "md5")


@pytest.mark.parametrize("shared", [False, True], ids=["repo-blobs", "shared-store"])
def test_hf_uses_the_cached_copy_when_offline(tmp_path: Path, offline: None, shared: bool) -> None:
    snapshot = tiny_on_the_hub(tmp_path / "cache", shared)
    assert resolve(parse_model_uri("hf://acme/tiny"), str(tmp_path / "cache")) == snapshot
    assert sorted(p.name for p in snapshot.rglob("*")) == [
        "config.json",
        "model.safetensors",
        "sub",
        "t.json",
    ]


@pytest.mark.parametrize("shared", [False, True], ids=["repo-blobs", "shared-store"])
@pytest.mark.parametrize(
    ("name", "change"),
    [
        (
            "model.safetensors",
            lambda b: b[:-1] + bytes([b[-1] ^ 1]),
        ),  # a tensor byte: still whole safetensors
        ("config.json", lambda b: b.replace(b"llama", b"qwen2")),
        ("sub/t.json", lambda b: b"[]"),
    ],
    ids=["lfs-sha256", "git-sha1", "nested"],
)
def test_a_cached_hf_file_changed_with_its_size_kept_is_not_served(
    tmp_path: Path, offline: None, shared: bool, name: str, change: object
) -> None:
    """A blob altered in the node cache (the same size, still a valid file) is deleted, not served: offline,
    the start fails naming the file (online, the client would fetch it again into the place it left)."""
    snapshot = tiny_on_the_hub(tmp_path / "cache", shared)
    content = (snapshot / name).resolve()
    content.write_bytes(change(content.read_bytes()))  # type: ignore[operator]
    with pytest.raises(ModelSourceError) as caught:
        resolve(parse_model_uri("hf://acme/tiny"), str(tmp_path / "cache"))
    assert caught.value.reason == "ModelDownloadFailed"
    assert str(caught.value) == (
        f"model hf://acme/tiny: cached file(s) {name} did not hash to the name the hub's cache gives them, "
        "were deleted, and could not be downloaded again (no network, or the hub sent other bytes)"
    )
    assert not content.exists() and not (snapshot / name).is_symlink()
    blobs = snapshot.parent.parent / "blobs"
    assert len(list(blobs.iterdir())) == 2  # the other files' blobs stay
    # What is left is whole: only the deleted file is missing (the client fetches that one alone).
    assert hfhub.hf_damaged(snapshot, hfhub.hf_cache("hf://acme/tiny", tmp_path / "cache")) == []


def test_hf_snapshot_entries_that_are_not_hash_named_blobs_are_deleted_never_outside_the_cache(
    tmp_path: Path, offline: None
) -> None:
    snapshot = tiny_on_the_hub(tmp_path / "cache")
    hub = hfhub.hf_cache("hf://acme/tiny", tmp_path / "cache")
    outside = tmp_path / "outside.json"
    outside.write_bytes(CONFIG)
    (snapshot / "planted.json").write_bytes(CONFIG)  # a file, not a link to a blob
    (snapshot / "away.json").symlink_to(outside)  # a link out of the cache
    sha1 = hashlib.sha1(b"blob %d\0" % len(CONFIG) + CONFIG).hexdigest()
    (snapshot / "other.json").symlink_to(hub / "models--acme--other" / "blobs" / sha1)
    blobs = snapshot.parent.parent / "blobs"
    named = blobs / "config.json"  # in blobs/ but named by no hash, as the client's `.incomplete` files
    named.write_bytes(CONFIG)
    (snapshot / "named.json").symlink_to(named)
    escaping = blobs / hashlib.sha1(b"blob 0\0").hexdigest()  # a hash-named blob whose bytes are elsewhere
    (tmp_path / "empty").write_bytes(b"")
    escaping.symlink_to(tmp_path / "empty")
    (snapshot / "escaping.json").symlink_to(escaping)
    assert hfhub.hf_damaged(snapshot, hub) == [
        "away.json",
        "escaping.json",
        "named.json",
        "other.json",
        "planted.json",
    ]
    assert outside.read_bytes() == CONFIG and (tmp_path / "empty").exists()  # nothing outside is deleted
    assert named.exists() and not escaping.is_symlink()  # only a hash-named blob goes with its link
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json", "model.safetensors", "sub"]


def test_a_ref_that_is_no_commit_hash_is_deleted_not_followed(tmp_path: Path, offline: None) -> None:
    """Offline the client serves `snapshots/<text of refs/main>`: a ref reading `../..` would serve a folder
    outside the model's, which no check covers."""
    snapshot = tiny_on_the_hub(tmp_path / "cache")
    elsewhere = write_model(tmp_path / "elsewhere")
    ref = snapshot.parent.parent / "refs" / "main"
    ref.write_text(os.path.relpath(elsewhere, snapshot.parent))
    with pytest.raises(ModelSourceError, match="no cached copy"):
        resolve(parse_model_uri("hf://acme/tiny"), str(tmp_path / "cache"))
    assert not ref.exists() and elsewhere.is_dir()


@pytest.mark.parametrize(
    ("endpoint", "folder"),
    [
        (None, "hf"),
        ("https://huggingface.co", "hf"),
        ("https://HuggingFace.co:443/", "hf"),
        ("https://hf-mirror.example", "hf-hubs/hf-mirror.example_"),
        ("http://hub.internal:8080/api/hf", "hf-hubs/hub.internal_"),
    ],
)
def test_each_hub_has_its_own_cache_folder(
    endpoint: str | None, folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    if endpoint:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
    cache = hfhub.hf_cache("hf://acme/tiny", tmp_path)
    assert cache.relative_to(tmp_path).as_posix().startswith(folder)
    assert hfhub.hf_folder(parse_model_uri("hf://acme/tiny"), tmp_path) == cache / "models--acme--tiny"


def test_two_hubs_are_two_folders_and_one_spelling_of_a_hub_is_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def folder(endpoint: str) -> Path:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        return hfhub.hf_folder(parse_model_uri("hf://acme/tiny"), tmp_path)

    mirror = folder("https://hub.example")
    assert folder("https://Hub.example:443/") == mirror
    others = {
        folder("http://hub.example"),
        folder("https://hub.example:8443"),
        folder("https://hub.example/a"),
    }
    assert len(others | {mirror, folder("https://huggingface.co")}) == 5


def test_a_model_cached_from_one_hub_is_not_served_for_another(
    tmp_path: Path, offline: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny_on_the_hub(tmp_path / "cache")  # from the hub at 127.0.0.1:1
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:2")
    with pytest.raises(ModelSourceError) as caught:
        resolve(parse_model_uri("hf://acme/tiny"), str(tmp_path / "cache"))
    assert str(caught.value).endswith(f"no cached copy is in {hfhub.hf_cache('hf://', tmp_path / 'cache')}")


@pytest.mark.parametrize(
    "endpoint",
    ["ftp://hub", "https://", "hub.example", "https://hub:nine", "https://hub/x?y=1", "https://h:0"],
)
def test_bad_hf_endpoint_names_the_variable(
    endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    with pytest.raises(
        ModelSourceError, match=r"model hf://acme/tiny: HF_ENDPOINT .* must be http\(s\)://host"
    ):
        resolve(parse_model_uri("hf://acme/tiny"), str(tmp_path))


def test_hf_without_network_or_cache_is_a_clear_error(tmp_path: Path, offline: None) -> None:
    with pytest.raises(
        ModelSourceError, match=r"(?s)model hf://acme/missing: could not download .* no cached copy"
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
@pytest.mark.parametrize(
    "endpoint",
    ["ftp://store:21", "http://", "http://store:9000/models", "http://store:nine", "http://s:99999"],
)
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
    each with its size and ETag (the MD5 of a single-part upload), and fget_object writes each object where
    it is told, as the real one does. An object's bytes are `data[key]`, `{}` when not there."""

    keys: list[str]
    written: list[str] = field(default_factory=list)
    data: dict[str, bytes] = field(default_factory=dict)

    def content(self, key: str) -> bytes:
        return self.data.get(key, b"{}")

    def list_objects(self, bucket: str, prefix: str, recursive: bool) -> list[Object]:
        return [
            Object(bucket, key, size=len(self.content(key)), etag=hashlib.md5(self.content(key)).hexdigest())
            for key in self.keys
        ]

    def fget_object(self, bucket: str, key: str, path: str) -> None:
        self.written.append(path)
        temporary = Path(f"{path}.part")
        temporary.write_bytes(self.content(key))
        temporary.replace(path)


def s3_store(monkeypatch: pytest.MonkeyPatch, keys: list[str]) -> FakeS3Client:
    store = FakeS3Client(keys)
    monkeypatch.setattr(s3store, "_s3_client", lambda uri: store)
    return store


def s3_target(cache: Path, uri: str = "s3://bkt/p") -> Path:
    return s3store.s3_folder(parse_model_uri(uri), cache)


def test_s3_objects_under_the_prefix_land_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = s3_store(monkeypatch, ["p/config.json", "p/sub/model.safetensors", "p/a..b"])
    target = s3_target(tmp_path)
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
        "p/a/../../escaped",  # lands in <cache>/s3/<store>/bkt, beside the model's folder
        "p/../escaped",
        "q/config.json",  # not under the prefix at all
    ],
)
def test_s3_key_that_leaves_the_cache_folder_is_refused_before_any_download(
    key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = key.format(outside=tmp_path / "outside" / "escaped")
    store = s3_store(monkeypatch, ["p/config.json", key])
    target = s3_target(tmp_path / "cache")
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
    target = s3_target(tmp_path / "cache")
    target.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (target / "link").symlink_to(elsewhere)
    store = s3_store(monkeypatch, ["p/link/config.json"])
    with pytest.raises(ModelSourceError, match=r"refused object key 'p/link/config.json'") as caught:
        resolve(parse_model_uri("s3://bkt/p"), str(tmp_path / "cache"))
    assert caught.value.reason == "ModelInvalid"
    assert store.written == [] and list(elsewhere.iterdir()) == []


@pytest.mark.parametrize(
    ("first", "second", "same"),
    [
        ("http://minio-a:9000", "http://minio-b:9000", False),
        ("http://store:9000", "http://store:9001", False),
        ("http://store:9000", "https://store:9000", False),
        ("https://s3.eu.example", "https://s3.us.example", False),
        ("https://Store.Example", "https://store.example:443/", True),  # one store, written two ways
        ("store.example", "https://store.example", True),
    ],
)
def test_the_same_bucket_and_prefix_on_two_stores_are_two_folders(
    first: str, second: str, same: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keyed by bucket and prefix alone, a runtime would serve the files another store's credentials fetched
    (issue #40 §5): the folder names the store too."""
    monkeypatch.delenv("S3_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", first)
    one = s3_target(tmp_path, "s3://models/llama")
    monkeypatch.setenv("AWS_ENDPOINT_URL", second)
    other = s3_target(tmp_path, "s3://models/llama")
    assert (one == other) is same
    assert one.parts[-2:] == other.parts[-2:] == ("models", "llama")
    assert one.parent.parent.parent == tmp_path / "s3"


def test_two_stores_with_the_same_bucket_and_prefix_share_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stores = {
        "http://minio-a:9000": FakeS3Client(["p/config.json"], data={"p/config.json": b'{"a": 1}'}),
        "http://minio-b:9000": FakeS3Client(["p/config.json"], data={"p/config.json": b'{"b": 2}'}),
    }
    monkeypatch.setattr(s3store, "_s3_client", lambda uri: stores[os.environ["AWS_ENDPOINT_URL"]])
    monkeypatch.delenv("S3_ENDPOINT_URL", raising=False)
    found = {}
    for endpoint in stores:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        found[endpoint] = (resolve(parse_model_uri("s3://bkt/p"), str(tmp_path)) / "config.json").read_bytes()
    assert found == {"http://minio-a:9000": b'{"a": 1}', "http://minio-b:9000": b'{"b": 2}'}
    assert all(len(store.written) == 1 for store in stores.values())


def test_a_damaged_file_of_the_right_size_is_downloaded_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The size alone called a model "already downloaded" (issue #40 §5): the bytes must hash to what was
    written for the same object."""
    store = s3_store(monkeypatch, ["p/config.json", "p/weights.bin"])
    store.data = {"p/config.json": b'{"model_type": "llama"}', "p/weights.bin": b"\x01" * 64}
    target = resolve(parse_model_uri("s3://bkt/p"), str(tmp_path))
    assert len(store.written) == 2
    assert resolve(parse_model_uri("s3://bkt/p"), str(tmp_path)) == target and len(store.written) == 2
    (target / "weights.bin").write_bytes(b"\x02" * 64)  # same size, other bytes
    resolve(parse_model_uri("s3://bkt/p"), str(tmp_path))
    assert store.written[2:] == [str(target / "weights.bin")]
    assert (target / "weights.bin").read_bytes() == b"\x01" * 64


def test_an_object_replaced_by_one_of_the_same_size_is_downloaded_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retrained model's shards often keep their sizes: the store's ETag tells the new object apart."""
    store = s3_store(monkeypatch, ["p/config.json", "p/weights.bin"])
    store.data = {"p/config.json": b'{"model_type": "llama"}', "p/weights.bin": b"\x01" * 64}
    target = resolve(parse_model_uri("s3://bkt/p"), str(tmp_path))
    store.data["p/weights.bin"] = b"\x03" * 64
    resolve(parse_model_uri("s3://bkt/p"), str(tmp_path))
    assert store.written[2:] == [str(target / "weights.bin")]
    assert (target / "weights.bin").read_bytes() == b"\x03" * 64


def test_files_without_a_manifest_are_downloaded_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file an older runtime wrote, or one put there by anything but a download, is not taken on trust."""
    store = s3_store(monkeypatch, ["p/config.json"])
    target = s3_target(tmp_path)
    target.mkdir(parents=True)
    (target / "config.json").write_text("[]")  # the listed size, 2 bytes
    resolve(parse_model_uri("s3://bkt/p"), str(tmp_path))
    assert store.written == [str(target / "config.json")] and (target / "config.json").read_text() == "{}"
    s3store.manifest_path(tmp_path, target).write_text("not json")
    resolve(parse_model_uri("s3://bkt/p"), str(tmp_path))
    assert len(store.written) == 2


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
    header = safetensors_header(weights)
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
