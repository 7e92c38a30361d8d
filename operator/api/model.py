"""spec.model: where the weights come from, the name they are served under, their cache."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from pagoda.contract import IMAGE_MODEL_DIR, IMAGE_MODEL_NAME, MODELS_DIR

from .base import ApiModel, ObjectName, Quantity
from .rules import (
    CACHE_RULES,
    MODEL_RULES,
    MODEL_URI_PATTERN,
    MSG_CACHE,
    MSG_CACHE_NODE,
    MSG_CACHE_SIZE,
    MSG_CACHE_STORAGE_CLASS,
    MSG_MODEL_REVISION,
    MSG_URI,
    ZERO_QUANTITY_PATTERN,
    validations,
)

CacheScope = Literal["Pod", "Node"]
NODE_CACHE_ROOT = "/var/lib/pagoda/model-cache"  # on each node, a folder per namespace under it


class ModelCache(ApiModel):
    """Where the runtime keeps downloaded weights (mounted at /var/cache/pagoda)."""

    model_config = ConfigDict(json_schema_extra=validations(CACHE_RULES))

    scope: CacheScope = Field(
        default="Pod",
        description="Pod (the default, and the safer): each pod downloads into its own volume (below), gone "
        "with the pod; it passes the restricted Pod Security level. Node: one cache per node and namespace "
        f"({NODE_CACHE_ROOT}/<namespace>, a hostPath the operator names from the namespace), shared by "
        "every replica and restart on the node, so a model is downloaded once per node; runtimes starting "
        "together download once, and with size the least recently used models no replica serves are "
        "deleted past it. Node costs the namespace its Pod Security: a hostPath volume needs the "
        "privileged level, which then admits any pod of the namespace, and a root init container hands "
        "the folder to the runtime's user; docs/security.md#the-pods.",
    )
    pvc: ObjectName | None = Field(
        default=None,
        description="Name of an existing PersistentVolumeClaim shared by every replica (ReadWriteMany for "
        "more than one replica). Mutually exclusive with size.",
    )
    size: Quantity | None = Field(
        default=None,
        description="Size of a per-pod cache volume, e.g. 200Gi. Without storageClass it is an emptyDir "
        "with this size limit; with storageClass it is a generic ephemeral volume (a PVC per pod). With "
        "scope Node: the node cache's bound, past which unused models are evicted.",
    )
    storage_class: ObjectName | None = Field(
        default=None,
        description="StorageClass of the per-pod ephemeral cache volume; requires size.",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> ModelCache:
        if self.pvc is not None and self.size is not None:
            raise ValueError(MSG_CACHE)
        if self.storage_class is not None and self.size is None:
            raise ValueError(MSG_CACHE_STORAGE_CLASS)
        if self.size is not None and re.match(ZERO_QUANTITY_PATTERN, str(self.size)):
            raise ValueError(MSG_CACHE_SIZE)
        if self.scope == "Node" and (self.pvc is not None or self.storage_class is not None):
            raise ValueError(MSG_CACHE_NODE)
        return self


class ModelSource(ApiModel):
    """The model to serve."""

    model_config = ConfigDict(json_schema_extra=validations(MODEL_RULES))

    uri: str = Field(
        max_length=2048,
        description="Where the weights are: hf://org/name (Hugging Face hub), s3://bucket/path, "
        f"pvc://claim/path (mounted read-only at {MODELS_DIR}/<claim>), oci://registry/repository:tag (an "
        f"image whose files are the model folder, mounted read-only at {IMAGE_MODEL_DIR} as an image "
        "volume: the node's container runtime pulls and keeps it) or file:///path (inside the image).",
    )
    served_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="Model name clients send in OpenAI requests (`model`). Unset, the runtime derives it "
        "from the URI: the repository id of hf:// (hf://org/name serves org/name), the last part of a "
        f"file://, pvc:// or s3:// path (file:///models/tiny serves tiny), {IMAGE_MODEL_NAME} for oci://.",
    )
    revision: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description="Hub revision (branch, tag or commit) for hf:// models.",
    )
    credentials_secret: ObjectName | None = Field(
        default=None,
        description="Name of a Secret in the same namespace whose keys become environment variables of the "
        "runtime: HF_TOKEN for hf://, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_ENDPOINT_URL for s3://. "
        "A reference only: never put a token in the spec.",
    )
    cache: ModelCache | None = Field(
        default=None,
        description="Model cache volume; an unbounded emptyDir when unset.",
    )

    @field_validator("uri")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if not re.match(MODEL_URI_PATTERN, value):
            raise ValueError(MSG_URI)
        return value

    @model_validator(mode="after")
    def _revision_needs_hf(self) -> ModelSource:
        if self.revision is not None and not self.uri.startswith("hf://"):
            raise ValueError(MSG_MODEL_REVISION)
        return self

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0]

    @property
    def node_cache(self) -> bool:
        """cache.scope Node: the node's folder, one per namespace, shared by the pods on the node."""
        return self.cache is not None and self.cache.scope == "Node"

    @property
    def oci_reference(self) -> str | None:
        """The image reference of an oci:// URI, or None."""
        return self.uri.removeprefix("oci://") if self.scheme == "oci" else None

    @property
    def pvc_claim(self) -> str | None:
        """The claim of a pvc:// URI, or None."""
        if self.scheme != "pvc":
            return None
        return self.uri.removeprefix("pvc://").split("/", 1)[0]
