"""Model sources: turn a model URI into a local directory vLLM can load.

- `file:///abs/path` (or a bare path): used in place.
- `pvc://<claim>/<path>`: the PersistentVolumeClaim is mounted at `/mnt/models/<claim>` (the operator's
  convention; `PAGODA_PVC_ROOT` overrides the root), so this is `/mnt/models/<claim>/<path>`.
- `oci://<registry>/<repository>[:tag][@digest]`: an image whose files are the model folder, mounted by the
  kubelet as an image volume at `/mnt/model-image` (`PAGODA_IMAGE_MODEL_DIR` overrides it): used in place.
- `hf://<org>/<name>`: downloaded with the Hugging Face client into its cache layout under `<cache-dir>/hf`
  (from `HF_ENDPOINT`'s hub, default huggingface.co; another hub's models land in
  `<cache-dir>/hf-hubs/<endpoint>`, hf_cache), token from `HF_TOKEN`; with no network the cached copy is used,
  and when there is none the error says so. A cached file is served only when its bytes still hash to the
  name the hub gave it (hf_damaged); one that does not is deleted and fetched again.
- `s3://<bucket>/<prefix>`: every object under the prefix, downloaded with the MinIO client (any S3 API
  store) into `<cache-dir>/s3/<endpoint>/<bucket>/<prefix>`, `<endpoint>` naming the store (s3_folder).
  Credentials from `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`, endpoint from
  `AWS_ENDPOINT_URL` (or `S3_ENDPOINT_URL`; default AWS over https), region from `AWS_REGION`. A file
  already in the cache is kept only when its content is what was downloaded for the same object (the
  manifest, _S3Manifest); anything else is downloaded again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import SplitResult, urlsplit

from pagoda import contract

log = logging.getLogger("pagoda.runtime.models.sources")

PVC_ROOT_DEFAULT = contract.MODELS_DIR
LOCAL_SCHEMES = ("file", "pvc", "oci")  # on a volume of the pod already: nothing to download
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_HF_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_BUCKET = re.compile(rf"^{contract.S3_BUCKET_PATTERN}$")
_OCI = re.compile(rf"^{contract.OCI_REFERENCE_PATTERN}$")
S3_ENDPOINT_DEFAULT = "https://s3.amazonaws.com"
HF_ENDPOINT_DEFAULT = "https://huggingface.co"
# S3 error codes that mean the credentials are wrong or not allowed to read the bucket.
_S3_AUTH_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "ExpiredToken",
    "InvalidToken",
}


# huggingface_hub errors (by class name) that say the model is not there or not ours to read.
_HF_REASONS = {
    "RepositoryNotFoundError": "ModelNotFound",
    "RevisionNotFoundError": "ModelNotFound",
    "EntryNotFoundError": "ModelNotFound",
    "GatedRepoError": "ModelAccessDenied",
}


class ModelSourceError(ValueError):
    """The model URI is malformed, or the model behind it is missing or broken. `reason` is the stable
    CamelCase word the termination message starts with (see termination.py)."""

    def __init__(self, message: str, reason: str = "ModelURIInvalid") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ModelSource:
    uri: str
    scheme: str  # file | pvc | oci | hf | s3
    location: str  # local path, hf repo id, or bucket
    key: str = ""  # s3 prefix

    @property
    def default_name(self) -> str:
        """The name the model is served under without --served-model-name: the contract's rule, from the URI
        alone (the operator's admission applies the same one)."""
        return contract.default_served_name(self.uri)


def parse_model_uri(uri: str) -> ModelSource:
    scheme, sep, rest = uri.partition("://")
    if not sep:
        if not uri.startswith("/"):
            raise ModelSourceError(
                f"model {uri!r}: use a URI (file://, pvc://, oci://, hf://, s3://) or an absolute path"
            )
        return ModelSource(uri, "file", uri)
    if scheme == "file":
        if not rest.startswith("/"):
            raise ModelSourceError(f"model {uri!r}: file:// needs an absolute path (file:///models/x)")
        return ModelSource(uri, "file", rest)
    if scheme == "pvc":
        claim, _, path = rest.partition("/")
        if not _DNS1123.match(claim) or len(claim) > 253:
            raise ModelSourceError(f"model {uri!r}: pvc:// needs a claim name (pvc://<claim>/<path>)")
        if path.startswith("/"):  # joined to the claim's folder it would name a path outside it
            raise ModelSourceError(f"model {uri!r}: the path after the claim may not start with '/'")
        if ".." in Path(path).parts:
            raise ModelSourceError(f"model {uri!r}: the path may not contain '..'")
        root = Path(os.environ.get("PAGODA_PVC_ROOT", PVC_ROOT_DEFAULT))
        return ModelSource(uri, "pvc", str(root / claim / path))
    if scheme == "oci":
        if not _OCI.match(rest):
            raise ModelSourceError(
                f"model {uri!r}: oci:// needs an image reference (oci://<registry>/<repository>[:tag])"
            )
        return ModelSource(uri, "oci", os.environ.get("PAGODA_IMAGE_MODEL_DIR", contract.IMAGE_MODEL_DIR))
    if scheme == "hf":
        parts = rest.strip("/").split("/")
        if not 1 <= len(parts) <= 2 or not all(_HF_PART.match(p) for p in parts):
            raise ModelSourceError(f"model {uri!r}: hf:// needs a repository id (hf://<org>/<name>)")
        return ModelSource(uri, "hf", "/".join(parts))
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        prefix = prefix.removesuffix("/")
        if not _BUCKET.match(bucket) or not prefix:
            raise ModelSourceError(
                f"model {uri!r}: s3:// needs a bucket and a prefix (s3://<bucket>/<prefix>)"
            )
        # The prefix is also the cache folder's path under <cache-dir>/s3/<bucket>: a '..' would leave it, and
        # '.' or an empty part would name an S3 prefix other than the folder the files land in.
        if any(part in ("", ".", "..") for part in prefix.split("/")):
            raise ModelSourceError(
                f"model {uri!r}: the s3:// prefix {prefix!r} may not contain '.', '..' or empty parts ('//')"
            )
        return ModelSource(uri, "s3", bucket, prefix)
    raise ModelSourceError(f"model {uri!r}: unknown scheme {scheme!r} (use file, pvc, oci, hf or s3)")


SAFETENSORS_HEADER_LIMIT = 100 * 1024**2  # the format's own bound on the JSON header


def safetensors_header(path: Path) -> dict[str, Any]:
    """A .safetensors file's JSON header (tensor name -> dtype, shape, data_offsets; no tensor is read),
    checked against the file's size: ValueError saying what is wrong when the file is not safetensors or
    holds fewer bytes than its header promises (a copy cut short)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise ValueError(f"has {size} bytes, too few for a safetensors header")
        (length,) = struct.unpack("<Q", prefix)
        if length > SAFETENSORS_HEADER_LIMIT or 8 + length > size:
            raise ValueError(f"announces a {length}-byte header but the file has {size} bytes in all")
        try:
            header: dict[str, Any] = json.loads(f.read(length))
            end = max(
                (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0
            )
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise ValueError(f"has a header that is not safetensors JSON ({exc})") from None
    if 8 + length + end != size:
        raise ValueError(
            f"has {size - 8 - length} bytes of tensor data where its header lists {end}: "
            + ("the copy is cut short" if 8 + length + end > size else "trailing bytes")
        )
    return header


def check_weights(uri: str, path: Path) -> None:
    """Every top-level .safetensors file whole, and every shard a safetensors index names present: a model
    copied in part fails here in milliseconds, not after the engine's start (a minute and more)."""
    for file in sorted(path.glob("*.safetensors")):
        try:
            safetensors_header(file)
        except (OSError, ValueError) as exc:
            raise ModelSourceError(f"model {uri}: {file.name} {exc}", "ModelInvalid") from None
    for index in sorted(path.glob("*.safetensors.index.json")):
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
            message = f"model {uri}: {index.name} has no readable weight_map ({exc})"
            raise ModelSourceError(message, "ModelInvalid") from None
        if missing := sorted(s for s in shards if not (path / s).is_file()):
            raise ModelSourceError(
                f"model {uri}: {index.name} names weight files that are not there: {', '.join(missing)}",
                "ModelInvalid",
            )


def check_model_dir(uri: str, path: Path) -> Path:
    """A loadable model directory has a readable config.json and whole safetensors weights; anything else
    is a clear error."""
    if not path.is_dir():
        raise ModelSourceError(f"model {uri}: {path} does not exist or is not a directory", "ModelNotFound")
    config = path / "config.json"
    try:
        json.loads(config.read_text())
    except FileNotFoundError:
        raise ModelSourceError(f"model {uri}: no config.json in {path}", "ModelInvalid") from None
    except (OSError, ValueError) as exc:
        raise ModelSourceError(
            f"model {uri}: {config} is unreadable or not JSON ({exc})", "ModelInvalid"
        ) from None
    check_weights(uri, path)
    return path


def check_local(uri: str) -> None:
    """`check_model_dir` for a model already on this machine (file://, pvc://, oci://), for `serve` to run
    before it imports the engine: a wrong path or a damaged copy then fails in milliseconds rather than after
    the 15 s of importing torch and vLLM. Downloads (hf://, s3://) are checked when they have arrived."""
    source = parse_model_uri(uri)
    if source.scheme in LOCAL_SCHEMES:
        check_model_dir(uri, Path(source.location))


def resolve(source: ModelSource, cache_dir: str, revision: str | None = None) -> Path:
    """Return a local model directory, downloading it first for hf:// and s3://. Blocking."""
    return check_model_dir(source.uri, fetch(source, cache_dir, revision))


def fetch(source: ModelSource, cache_dir: str, revision: str | None = None) -> Path:
    """The local directory behind `source`, downloaded first for hf:// and s3:// (unchecked; LoRA adapters
    use this too). Blocking."""
    if source.scheme in LOCAL_SCHEMES:
        return Path(source.location)
    if source.scheme == "hf":
        return _resolve_hf(source, Path(cache_dir), revision)
    return _resolve_s3(source, Path(cache_dir))


class _Progress:
    """Logs download progress at most every few seconds, as key=value lines."""

    def __init__(self, uri: str, interval: float = 5.0) -> None:
        self.uri, self.interval, self.last = uri, interval, 0.0

    def report(
        self, done: int, total: int | None, objects: tuple[int, int] | None = None, force: bool = False
    ) -> None:
        now = time.monotonic()
        if force or now - self.last >= self.interval:
            self.last = now
            if objects is None:
                log.info("Downloaded model bytes uri=%s done=%d total=%s", self.uri, done, total or "?")
            else:
                log.info(
                    "Downloaded model bytes uri=%s done=%d total=%s objects_done=%d objects_total=%d",
                    self.uri,
                    done,
                    total or "?",
                    *objects,
                )


def _hf_endpoint(uri: str) -> tuple[str, str]:
    """The hub the environment names (HF_ENDPOINT, else huggingface.co), checked: the URL to give the client
    (a mirror may have a path, as the client allows) and its normalized form (scheme, host, port, path)."""
    endpoint = os.environ.get("HF_ENDPOINT") or HF_ENDPOINT_DEFAULT
    url = urlsplit(endpoint.rstrip("/"))
    try:
        valid = url.scheme in ("http", "https") and bool(url.hostname) and not (url.query or url.fragment)
        valid = valid and (url.port is None or url.port > 0)
    except ValueError:  # a port that is not a number, or out of range
        valid = False
    if not valid:
        raise ModelSourceError(f"model {uri}: HF_ENDPOINT {endpoint!r} must be http(s)://host[:port][/path]")
    port = url.port or (443 if url.scheme == "https" else 80)
    return url.geturl(), f"{url.scheme}://{(url.hostname or '').lower()}:{port}{url.path}"


def hf_cache(uri: str, cache_dir: Path) -> Path:
    """The hub cache (the Hugging Face client's layout) that hf:// models of HF_ENDPOINT's hub land in:
    `<cache-dir>/hf` for huggingface.co, where it has always been (nothing cached is downloaded again), and
    `<cache-dir>/hf-hubs/<host>_<hash>` for any other hub (a mirror, a private hub), the hash of its
    normalized URL. The same `org/name` on two hubs is two models, whatever they hold: in one folder a
    runtime would serve the files another hub (and another token) gave (a node cache is shared by the
    namespace's runtimes). Outside `hf` so that no name the client gives its own folders can be a hub's."""
    _, normalized = _hf_endpoint(uri)
    if normalized == f"{HF_ENDPOINT_DEFAULT}:443":
        return cache_dir / "hf"
    digest = hashlib.sha256(normalized.encode()).hexdigest()[:12]
    label = re.sub(r"[^a-z0-9.-]", "-", urlsplit(normalized).hostname or "")[:64]
    return cache_dir / "hf-hubs" / f"{label}_{digest}"


def hf_folder(source: ModelSource, cache_dir: Path) -> Path:
    """The hub's folder of an hf:// model, every revision in it: `models--<org>--<name>` in hf_cache."""
    return hf_cache(source.uri, cache_dir) / ("models--" + source.location.replace("/", "--"))


def _resolve_hf(source: ModelSource, cache_dir: Path, revision: str | None) -> Path:
    import huggingface_hub
    from tqdm.auto import tqdm  # type: ignore[import-untyped,unused-ignore]

    progress = _Progress(source.uri)

    class LogTqdm(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = False
            kwargs["file"] = open(os.devnull, "w")  # noqa: SIM115 - closed with the bar
            super().__init__(*args, **kwargs)

        def display(self, *args: Any, **kwargs: Any) -> None:
            progress.report(int(self.n), int(self.total) if self.total else None)

    cache = hf_cache(source.uri, cache_dir)
    token = os.environ.get("HF_TOKEN") or None
    common: dict[str, Any] = {
        "repo_id": source.location,
        "revision": revision,
        "cache_dir": str(cache),
        "endpoint": _hf_endpoint(source.uri)[0],  # the hub the folder is keyed by, read once
    }
    log.info("Started model download uri=%s cache=%s", source.uri, cache)
    _hf_drop_bad_refs(hf_folder(source, cache_dir))
    try:
        path = huggingface_hub.snapshot_download(**common, token=token, tqdm_class=LogTqdm)
    except Exception as online_error:  # network down, offline mode, auth, missing repo
        try:
            path = huggingface_hub.snapshot_download(**common, local_files_only=True)
        except Exception:
            raise ModelSourceError(
                f"model {source.uri}: could not download it ({type(online_error).__name__}: {online_error}) "
                f"and no cached copy is in {cache}",
                _HF_REASONS.get(type(online_error).__name__, "ModelDownloadFailed"),
            ) from None
        log.warning(
            "Used cached model copy uri=%s path=%s reason=%s", source.uri, path, type(online_error).__name__
        )
    # Only a snapshot in the shared cache is checked: the client answers no other (a stand-in may).
    in_cache = Path(path).resolve().is_relative_to(cache.resolve())
    if in_cache and (damaged := hf_damaged(Path(path), cache)):
        # The client fetches again what hf_damaged deleted, and only that. With no network it answers with the
        # cached snapshot as it is (it falls back by itself): what did not come back whole is then an error.
        try:
            path = huggingface_hub.snapshot_download(**common, token=token, tqdm_class=LogTqdm)
        except Exception as exc:
            raise _hf_damaged_error(source.uri, damaged, f"{type(exc).__name__}: {exc}") from None
        missing = [rel for rel in damaged if not (Path(path) / rel).is_file()]
        if left := sorted(set(hf_damaged(Path(path), cache) + missing)):
            raise _hf_damaged_error(source.uri, left, "no network, or the hub sent other bytes")
    log.info("Resolved model uri=%s path=%s", source.uri, path)
    return Path(path)


def _hf_damaged_error(uri: str, damaged: list[str], why: str) -> ModelSourceError:
    return ModelSourceError(
        f"model {uri}: cached file(s) {', '.join(damaged)} did not hash to the name the hub's cache gives "
        f"them, were deleted, and could not be downloaded again ({why})",
        "ModelDownloadFailed",
    )


def _hf_drop_bad_refs(folder: Path) -> None:
    """Delete each ref of the model's hub folder (`refs/<branch or tag>`) that is not a commit hash: offline,
    the client joins a ref's text to `snapshots/` and serves that folder, so a ref reading `../../x` would
    serve files from outside the model's folder, unchecked. Online the client writes the ref again."""
    for ref in (folder / "refs").rglob("*") if (folder / "refs").is_dir() else []:
        with contextlib.suppress(OSError):
            if ref.is_symlink() or (ref.is_file() and not _COMMIT.fullmatch(ref.read_text())):
                log.warning("Cached model ref is not a commit hash: deleted ref=%s", ref)
                ref.unlink()


_COMMIT = re.compile(r"[0-9a-f]{40}")
_HASH_KINDS = {64: "sha256", 40: "git-sha1"}  # the hub's blob names: LFS files' SHA-256, git's blob id
_HEX = re.compile(r"^[0-9a-f]+$")


def hf_damaged(snapshot: Path, cache: Path) -> list[str]:
    """The files of the hub snapshot `snapshot` (a folder of hf_cache `cache`) that are not what the hub
    sent, each deleted, so that the next download fetches it again: the paths in the snapshot, sorted.

    The client names each blob by its content (`blobs/<sha256>` for an LFS file, `blobs/<git blob id>` for
    a file kept in git) and reuses what it finds under that name without reading it. A node cache outlives
    pods and is written by every runtime of the namespace, so a damaged or changed file (a bad disk, a runtime
    that wrote into the cache) would be served. Every snapshot file must be a link to `blobs/<hash>` of its
    own repository folder whose bytes (there, or in the client's shared store `cache/blobs`) hash to that
    name; anything else is deleted (never a file elsewhere). Each start reads the model once, up to
    HASH_THREADS files side by side, before the engine reads it again."""
    repo_blobs = Path(os.path.normpath(snapshot.parent.parent / "blobs"))
    root = cache.resolve()
    checks: dict[str, tuple[Path, Path | None, Path | None, str]] = {}  # rel -> link, blob, bytes, kind
    for folder, dirs, files in os.walk(snapshot):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            link = Path(folder, name)
            checks[link.relative_to(snapshot).as_posix()] = (link, *_hf_blob(link, repo_blobs, root))
    wanted = sorted({(content, kind) for _, _, content, kind in checks.values() if content and kind})
    digests = dict(zip(wanted, file_digests(wanted), strict=True))
    damaged = []
    for rel, (link, blob, content, kind) in sorted(checks.items()):
        if blob and content and digests[(content, kind)] == blob.name:
            continue
        damaged.append(rel)
        log.warning("Cached model file differs from its hash: deleted, to fetch it again file=%s", rel)
        for path in (link, blob, content):
            if path is not None:
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)
    return damaged


def _hf_blob(link: Path, repo_blobs: Path, root: Path) -> tuple[Path | None, Path | None, str]:
    """A snapshot entry's blob (`blobs/<hash>` of the repository folder), the file holding its bytes (the
    blob itself, or the client's shared store `<root>/blobs/<xx>/<xet hash>` it links to) and the hash its
    name is; None and "" for what is not such a link, None for bytes anywhere else."""
    if not link.is_symlink():
        return None, None, ""
    blob = Path(os.path.normpath(link.parent / os.readlink(link)))
    kind = _HASH_KINDS.get(len(blob.name), "") if _HEX.match(blob.name) else ""
    if blob.parent != repo_blobs or not kind:
        return None, None, ""
    content = blob.resolve()
    stored = content.parent == repo_blobs.resolve() or content.parent.parent == root / "blobs"
    return blob, content if stored else None, kind


def _s3_endpoint(uri: str) -> SplitResult:
    """The S3 store the environment names (AWS_ENDPOINT_URL, else S3_ENDPOINT_URL, else AWS), checked."""
    var = next((v for v in ("AWS_ENDPOINT_URL", "S3_ENDPOINT_URL") if os.environ.get(v)), "")
    endpoint = os.environ[var] if var else S3_ENDPOINT_DEFAULT
    url = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
    try:
        valid = url.scheme in ("http", "https") and bool(url.hostname) and not url.path.strip("/")
        valid = valid and (url.port is None or url.port > 0)
    except ValueError:  # a port that is not a number, or out of range
        valid = False
    if not valid:
        raise ModelSourceError(f"model {uri}: {var} {endpoint!r} must be http(s)://host[:port] with no path")
    return url


def s3_folder(source: ModelSource, cache_dir: Path) -> Path:
    """Where the objects of an s3:// source land: `<cache-dir>/s3/<endpoint>/<bucket>/<prefix>`, where
    `<endpoint>` is the store's host and a hash of its normalized URL (scheme, host, port). The same
    `s3://bucket/prefix` on two stores is two models, whatever they hold: keyed by bucket and prefix alone,
    a runtime would serve the files another store's credentials fetched (a node cache is shared by the
    namespace's services). Bucket names have no '_', so no folder of this layout is one of the layout before
    it (`<cache-dir>/s3/<bucket>/<prefix>`), whose files are downloaded again rather than trusted."""
    url = _s3_endpoint(source.uri)
    host = (url.hostname or "").lower()
    normalized = f"{url.scheme}://{host}:{url.port or (443 if url.scheme == 'https' else 80)}"
    digest = hashlib.sha256(normalized.encode()).hexdigest()[:12]
    label = re.sub(r"[^a-z0-9.-]", "-", host)[:64]
    return cache_dir / "s3" / f"{label}_{digest}" / source.location / source.key


def _s3_client(uri: str) -> Any:
    """A MinIO client from the usual AWS environment; a missing credential is a clear error."""
    from minio import Minio

    access, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not access or not secret:
        raise ModelSourceError(
            f"model {uri}: s3:// needs credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(the InferenceService's credentialsSecret)",
            "ModelAccessDenied",
        )
    url = _s3_endpoint(uri)
    return Minio(
        url.netloc,
        access_key=access,
        secret_key=secret,
        session_token=os.environ.get("AWS_SESSION_TOKEN") or None,
        secure=url.scheme == "https",
        region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None,
    )


def _s3_error(uri: str, exc: Exception) -> ModelSourceError:
    from minio.error import S3Error

    code = exc.code if isinstance(exc, S3Error) else ""
    if code == "NoSuchBucket":
        why, reason = f"the bucket does not exist ({code})", "ModelNotFound"
    elif code in _S3_AUTH_CODES:
        why = f"the store refused the credentials in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY ({code})"
        reason = "ModelAccessDenied"
    else:
        why, reason = f"download failed ({type(exc).__name__}: {exc})", "ModelDownloadFailed"
    return ModelSourceError(f"model {uri}: {why}", reason)


def _s3_destination(uri: str, target: Path, prefix: str, key: str) -> Path:
    """Where the object `key` (listed under `prefix`) is written: a file inside `target`. S3 accepts any UTF-8
    key, `p//etc/x` and `p/a/../../x` included, so a key whose part after the prefix is empty, absolute or
    has a '..' is refused, as is one whose path, resolved, is not inside `target` (a symlink in the cache)."""
    rel = key[len(prefix) :] if key.startswith(prefix) else ""
    dest = target / rel
    resolved, root = dest.resolve(), target.resolve()
    climbs = PurePosixPath(rel).is_absolute() or ".." in PurePosixPath(rel).parts
    if not rel or climbs or resolved == root or not resolved.is_relative_to(root):
        raise ModelSourceError(
            f"model {uri}: refused object key {key!r}: its path after {prefix!r} must stay inside {target}",
            "ModelInvalid",
        )
    return dest


HASH_CHUNK = 8 * 1024**2
HASH_THREADS = 8  # hashlib releases the GIL: shards are hashed side by side, at the disk's pace


def file_digest(path: Path, kind: str = "sha256") -> str:
    """The hex digest of a file's bytes: `kind` "sha256", or "git-sha1", git's blob id (SHA-1 over
    `blob <size>\\0` and the bytes), the name the Hugging Face hub gives a file kept in git, not LFS."""
    with path.open("rb") as f:
        if kind == "git-sha1":
            digest = hashlib.sha1(f"blob {os.fstat(f.fileno()).st_size}\0".encode(), usedforsecurity=False)
        elif kind == "sha256":
            digest = hashlib.sha256()
        else:
            raise ValueError(f"kind must be sha256 or git-sha1, got {kind!r}")
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_digests(files: list[tuple[Path, str]]) -> list[str | None]:
    """file_digest of each (path, kind), None for a file that cannot be read: the one hashing of the cache
    checks (s3:// and hf://), up to HASH_THREADS files side by side."""

    def digest(item: tuple[Path, str]) -> str | None:
        try:
            return file_digest(*item)
        except OSError:
            return None

    with ThreadPoolExecutor(min(HASH_THREADS, max(1, len(files)))) as pool:
        return list(pool.map(digest, files))


class _S3Manifest:
    """What a model folder's files are, written as each one arrives: per file (its path in the folder) the
    object's size and ETag as the store listed them, and the SHA-256 of the bytes written. A file is kept
    on the next fetch only when the store lists the same size and ETag for it (the object was not replaced,
    not even by one of the same size: a retrained model's shards often are) and the file's bytes still hash
    to what was written (not damaged or changed in the cache since: a node cache outlives pods and is
    written by every runtime of the namespace). A file with no entry, such as one an older runtime wrote, is
    downloaded again. Kept under `<cache-dir>/s3/.manifests` (no endpoint folder starts with '.'), one per
    folder, so the model's folder holds only the store's files."""

    def __init__(self, cache_dir: Path, target: Path) -> None:
        self.path = manifest_path(cache_dir, target)
        self.files: dict[str, dict[str, Any]] = {}
        try:
            files = json.loads(self.path.read_text())["files"]
            self.files = {str(k): dict(v) for k, v in files.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # none yet, or unreadable: every file is downloaded again

    def kept(self, objects: list[tuple[str, Path, int, str | None]], target: Path) -> set[str]:
        """The paths (in the folder) of the listed objects whose file may be kept, each hashed."""
        candidates = []
        for _, dest, size, etag in objects:
            rel = dest.relative_to(target).as_posix()
            entry = self.files.get(rel)
            if entry and entry.get("size") == size and entry.get("etag") == etag and _size(dest) == size:
                candidates.append((rel, dest, str(entry.get("sha256"))))
        hashes = file_digests([(dest, "sha256") for _, dest, _ in candidates])
        kept = set()
        for (rel, _, expected), actual in zip(candidates, hashes, strict=True):
            if actual == expected:
                kept.add(rel)
            else:
                log.warning("Cached file differs from what was downloaded: fetching it again file=%s", rel)
        return kept

    def record(self, rel: str, size: int, etag: str | None, dest: Path) -> None:
        self.files[rel] = {"size": size, "etag": etag, "sha256": file_digest(dest)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps({"files": self.files}))
        temporary.replace(self.path)  # readers see the old manifest or the new one


def manifest_path(cache_dir: Path, target: Path) -> Path:
    """The manifest of the s3:// model folder `target` (s3_folder) in the cache `cache_dir`."""
    s3 = cache_dir / "s3"
    name = hashlib.sha256(target.relative_to(s3).as_posix().encode()).hexdigest()[:32]
    return s3 / ".manifests" / f"{name}.json"


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size if path.is_file() else None
    except OSError:
        return None


def _resolve_s3(source: ModelSource, cache_dir: Path) -> Path:
    target = s3_folder(source, cache_dir)
    client = _s3_client(source.uri)
    bucket, prefix = source.location, source.key + "/"
    log.info("Started model download uri=%s cache=%s", source.uri, target)
    started = time.monotonic()
    try:
        listed = [
            (obj.object_name, int(obj.size or 0), getattr(obj, "etag", None) or None)
            for obj in client.list_objects(bucket, prefix=prefix, recursive=True)
            if obj.object_name and not obj.is_dir
        ]
        if not listed:
            raise ModelSourceError(
                f"model {source.uri}: no objects under s3://{bucket}/{prefix}", "ModelNotFound"
            )
        # Every key is checked before the first download, so that a refused model leaves no partial copy.
        objects = [
            (key, _s3_destination(source.uri, target, prefix, key), size, etag) for key, size, etag in listed
        ]
        manifest = _S3Manifest(cache_dir, target)
        kept = manifest.kept(objects, target)
        total, done, fetched = sum(size for _, _, size, _ in objects), 0, 0
        progress = _Progress(source.uri)
        for count, (key, dest, size, etag) in enumerate(objects, 1):
            rel = dest.relative_to(target).as_posix()
            if rel not in kept:
                dest.parent.mkdir(parents=True, exist_ok=True)
                client.fget_object(bucket, key, str(dest))
                manifest.record(rel, size, etag, dest)
                fetched += 1
            done += size
            progress.report(done, total, objects=(count, len(objects)), force=count == len(objects))
    except ModelSourceError:
        raise
    except Exception as exc:  # S3Error, connection errors, a full disk
        raise _s3_error(source.uri, exc) from None
    log.info(
        "Resolved model uri=%s path=%s objects=%d fetched=%d bytes=%d seconds=%.1f",
        source.uri,
        target,
        len(objects),
        fetched,
        total,
        time.monotonic() - started,
    )
    return target
