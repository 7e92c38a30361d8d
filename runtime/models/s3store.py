"""s3:// models: every object under the prefix, downloaded with the MinIO client (any S3 API store) into a
folder per store (s3_folder), each file kept on the next fetch only when the manifest written with it
(_S3Manifest) says it is still what was downloaded for the same object."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import SplitResult, urlsplit

from pagoda.runtime.models.download import Progress, file_digest, file_digests
from pagoda.runtime.models.modeluri import ModelSource, ModelSourceError

# The model sources' one log (sources.py, hfhub.py, s3store.py, download.py): its lines kept the logger they
# had before the split, so a log filter or a test that follows it still sees every one.
log = logging.getLogger("pagoda.runtime.models.sources")

S3_ENDPOINT_DEFAULT = "https://s3.amazonaws.com"
# S3 error codes that mean the credentials are wrong or not allowed to read the bucket.
_S3_AUTH_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "ExpiredToken",
    "InvalidToken",
}


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


def fetch_s3(source: ModelSource, cache_dir: Path) -> Path:
    """The s3_folder of an s3:// model, each object downloaded unless its manifest entry keeps the file.
    Blocking."""
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
        progress = Progress(source.uri)
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
