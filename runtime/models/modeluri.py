"""What a model URI names: its parts, checked, with no file read and nothing downloaded (the schemes are
listed in sources.py). The serving config, the LoRA adapters and the served name read a URI here."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from pagoda import contract

PVC_ROOT_DEFAULT = contract.MODELS_DIR
LOCAL_SCHEMES = ("file", "pvc", "oci")  # on a volume of the pod already: nothing to download
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_HF_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_BUCKET = re.compile(rf"^{contract.S3_BUCKET_PATTERN}$")
_OCI = re.compile(rf"^{contract.OCI_REFERENCE_PATTERN}$")


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
