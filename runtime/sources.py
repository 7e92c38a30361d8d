"""Model sources: turn a model URI into a local directory vLLM can load.

- `file:///abs/path` (or a bare path): used in place.
- `pvc://<claim>/<path>`: the PersistentVolumeClaim is mounted at `/mnt/models/<claim>` (the operator's
  convention; `PAGODA_PVC_ROOT` overrides the root), so this is `/mnt/models/<claim>/<path>`.
- `oci://<registry>/<repository>[:tag][@digest]`: an image whose files are the model folder, mounted by the
  kubelet as an image volume at `/mnt/model-image` (`PAGODA_IMAGE_MODEL_DIR` overrides it): used in place.
- `hf://<org>/<name>`: downloaded into `<cache-dir>/hf` (token from `HF_TOKEN`); with no network the
  cached copy is used, and when there is none the error says so.
- `s3://<bucket>/<prefix>`: every object under the prefix, downloaded with the MinIO client (any S3 API
  store) into `<cache-dir>/s3/<bucket>/<prefix>`. Credentials from `AWS_ACCESS_KEY_ID`,
  `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`, endpoint from `AWS_ENDPOINT_URL` (or `S3_ENDPOINT_URL`;
  default AWS over https), region from `AWS_REGION`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from pagoda.runtime import contract

log = logging.getLogger("pagoda.runtime.sources")

PVC_ROOT_DEFAULT = contract.MODELS_DIR
LOCAL_SCHEMES = ("file", "pvc", "oci")  # on a volume of the pod already: nothing to download
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_HF_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_BUCKET = re.compile(rf"^{contract.S3_BUCKET_PATTERN}$")
_OCI = re.compile(rf"^{contract.OCI_REFERENCE_PATTERN}$")
S3_ENDPOINT_DEFAULT = "https://s3.amazonaws.com"
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
        if self.scheme == "hf":
            return self.location
        tail = self.key if self.scheme == "s3" else self.location
        return Path(tail.rstrip("/")).name or self.location


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
        return _resolve_hf(source, Path(cache_dir) / "hf", revision)
    return _resolve_s3(source, Path(cache_dir) / "s3")


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


def _resolve_hf(source: ModelSource, cache: Path, revision: str | None) -> Path:
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

    token = os.environ.get("HF_TOKEN") or None
    common: dict[str, Any] = {"repo_id": source.location, "revision": revision, "cache_dir": str(cache)}
    log.info("Started model download uri=%s cache=%s", source.uri, cache)
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
    log.info("Resolved model uri=%s path=%s", source.uri, path)
    return Path(path)


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
    var = next((v for v in ("AWS_ENDPOINT_URL", "S3_ENDPOINT_URL") if os.environ.get(v)), "")
    endpoint = os.environ[var] if var else S3_ENDPOINT_DEFAULT
    url = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
    if url.scheme not in ("http", "https") or not url.netloc or url.path.strip("/"):
        raise ModelSourceError(f"model {uri}: {var} {endpoint!r} must be http(s)://host[:port] with no path")
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


def _resolve_s3(source: ModelSource, cache: Path) -> Path:
    client = _s3_client(source.uri)
    bucket, prefix = source.location, source.key + "/"
    target = cache / bucket / source.key
    log.info("Started model download uri=%s cache=%s", source.uri, target)
    started = time.monotonic()
    try:
        listed = [
            (obj.object_name, int(obj.size or 0))
            for obj in client.list_objects(bucket, prefix=prefix, recursive=True)
            if obj.object_name and not obj.is_dir
        ]
        if not listed:
            raise ModelSourceError(
                f"model {source.uri}: no objects under s3://{bucket}/{prefix}", "ModelNotFound"
            )
        # Every key is checked before the first download, so that a refused model leaves no partial copy.
        objects = [(key, _s3_destination(source.uri, target, prefix, key), size) for key, size in listed]
        total, done, fetched = sum(size for _, _, size in objects), 0, 0
        progress = _Progress(source.uri)
        for count, (key, dest, size) in enumerate(objects, 1):
            if not (dest.is_file() and dest.stat().st_size == size):
                dest.parent.mkdir(parents=True, exist_ok=True)
                client.fget_object(bucket, key, str(dest))
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
