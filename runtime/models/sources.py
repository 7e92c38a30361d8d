"""Model sources: turn a model URI into a local directory vLLM can load, checked (check_model_dir) before
the engine reads it.

- `file:///abs/path` (or a bare path): used in place.
- `pvc://<claim>/<path>`: the PersistentVolumeClaim is mounted at `/mnt/models/<claim>` (the operator's
  convention; `PAGODA_PVC_ROOT` overrides the root), so this is `/mnt/models/<claim>/<path>`.
- `oci://<registry>/<repository>[:tag][@digest]`: an image whose files are the model folder, mounted by the
  kubelet as an image volume at `/mnt/model-image` (`PAGODA_IMAGE_MODEL_DIR` overrides it): used in place.
- `hf://<org>/<name>`: downloaded with the Hugging Face client into its cache layout under `<cache-dir>/hf`
  (from `HF_ENDPOINT`'s hub, default huggingface.co; another hub's models land in
  `<cache-dir>/hf-hubs/<endpoint>`, hfhub.hf_cache), token from `HF_TOKEN`; with no network the cached copy
  is used, and when there is none the error says so. A cached file is served only when its bytes still hash
  to the name the hub gave it (hfhub.hf_damaged); one that does not is deleted and fetched again.
- `s3://<bucket>/<prefix>`: every object under the prefix, downloaded with the MinIO client (any S3 API
  store) into `<cache-dir>/s3/<endpoint>/<bucket>/<prefix>`, `<endpoint>` naming the store
  (s3store.s3_folder).
  Credentials from `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`, endpoint from
  `AWS_ENDPOINT_URL` (or `S3_ENDPOINT_URL`; default AWS over https), region from `AWS_REGION`. A file
  already in the cache is kept only when its content is what was downloaded for the same object (the
  manifest, s3store._S3Manifest); anything else is downloaded again.

Split by concern: the URI's parts (modeluri.py), the hf:// and s3:// downloads (hfhub.py, s3store.py) and
what they share (download.py: progress lines, hashing); here, the entry points and the model folder's checks.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from pagoda.runtime.models.hfhub import fetch_hf
from pagoda.runtime.models.modeluri import LOCAL_SCHEMES, ModelSource, ModelSourceError, parse_model_uri
from pagoda.runtime.models.s3store import fetch_s3

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
        return fetch_hf(source, Path(cache_dir), revision)
    return fetch_s3(source, Path(cache_dir))
