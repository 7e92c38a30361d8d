"""The model cache: the folder hf:// and s3:// models are downloaded into, shared by every runtime that
mounts it (the pod's own emptyDir, the node's folder, or a shared claim: spec.model.cache in the operator).

Runtimes sharing the folder coordinate with flock(2) locks under `<root>/.pagoda/locks`. They are the
kernel's, so they hold between containers on one node and go away with a process that dies:
- `<key>.use`, shared while a runtime serves the model (taken before its fetch): an eviction takes it
  exclusively without waiting, so a model that a runtime serves or is fetching is never deleted;
- `<key>.fetch`, exclusive while one runtime downloads: a second start on the node waits for it, then finds
  the files in place (the S3 and Hugging Face clients write each file under a temporary name and rename it
  when whole, so no reader sees a torn file), and its fetch moves no bytes.
Each model has a record `<root>/.pagoda/models/<key>.json` (URI, revision, folder, bytes, last use). With a
bound (`--cache-max-bytes`), the least recently used models that nobody serves are deleted until the cache
fits; what is in use stays, with a warning, even past the bound.

A model found in the folder is not taken on trust: its folder is per store (an s3:// model's endpoint, an
hf:// model's hub), not only per name, and each file is kept only when its bytes still hash to what was
downloaded: for s3://, to the manifest written with it (s3store._S3Manifest); for hf://, to the hash the
hub's cache names its blob by (hfhub.hf_damaged). A file that differs is downloaded again, and the fetch
is no hit.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pagoda.contract import rfc3339
from pagoda.runtime.models import hfhub, s3store, sources
from pagoda.runtime.models.modeluri import LOCAL_SCHEMES, ModelSource

log = logging.getLogger("pagoda.runtime.models.modelcache")

STATE_DIR = ".pagoda"


def model_folder(source: ModelSource, root: Path) -> Path:
    """The folder a downloaded model occupies in the cache, as sources.fetch lays it out (for hf://, the
    hub's repository folder with every revision, one per hub; for s3://, one per store, bucket and prefix):
    the lock and the record are per folder, so two hubs' or stores' copies of one name are two models."""
    if source.scheme == "s3":
        return s3store.s3_folder(source, root)
    if source.scheme == "hf":
        return hfhub.hf_folder(source, root)
    raise ValueError(f"{source.uri}: only hf:// and s3:// models are downloaded into the cache")


def stored_bytes(path: Path) -> int:
    """Bytes of the regular files under `path`, links not followed (the hub's snapshots link to its blobs,
    which are counted once)."""
    return sum(size for _, _, size in _files(path).values())


def _files(path: Path) -> dict[str, tuple[int, int, int]]:
    """Each regular file under `path`: (inode, mtime, size). The clients write a file under a temporary name
    and rename it, so a file downloaded again, even with the same size, is a new inode."""
    found: dict[str, tuple[int, int, int]] = {}
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(folder, name))
                if not os.path.islink(os.path.join(folder, name)):
                    found[os.path.join(folder, name)] = (info.st_ino, info.st_mtime_ns, info.st_size)
    return found


@dataclass(frozen=True)
class Fetched:
    path: Path  # the model folder to load
    bytes_moved: int  # what this fetch wrote into the cache: 0 on a hit


class ModelCache:
    """One runtime's view of the cache folder `root`. `max_bytes`: the bound, None for none."""

    def __init__(self, root: Path, max_bytes: int | None = None) -> None:
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"cache max bytes must be positive, got {max_bytes}")
        self.root, self.max_bytes = root, max_bytes
        self._held: dict[str, IO[str]] = {}  # key -> the open `.use` lock this process holds (shared)

    @property
    def _locks(self) -> Path:
        return self.root / STATE_DIR / "locks"

    @property
    def _records(self) -> Path:
        return self.root / STATE_DIR / "models"

    def _key(self, folder: Path) -> str:
        return hashlib.sha256(str(folder.relative_to(self.root)).encode()).hexdigest()[:24]

    def _open_lock(self, key: str, kind: str) -> IO[str]:
        self._locks.mkdir(parents=True, exist_ok=True)
        return (self._locks / f"{key}.{kind}").open("a")

    def fetch(
        self, source: ModelSource, revision: str | None, download: Callable[[], Path] | None = None
    ) -> Fetched:
        """The model's folder, downloaded first unless another runtime sharing the cache has it (or is
        fetching it: then this waits). The model stays in use (safe from eviction) while this process lives.
        `download`: what moves the bytes (sources.fetch by default)."""
        if source.scheme in LOCAL_SCHEMES:
            return Fetched(sources.fetch(source, str(self.root), revision), 0)
        folder = model_folder(source, self.root)
        key = self._key(folder)
        if key not in self._held:
            use = self._open_lock(key, "use")
            fcntl.flock(use, fcntl.LOCK_SH)  # waits only while an eviction deletes this very model
            self._held[key] = use
        with self._open_lock(key, "fetch") as fetching:
            try:
                fcntl.flock(fetching, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("Waiting for another runtime's download uri=%s cache=%s", source.uri, self.root)
                fcntl.flock(fetching, fcntl.LOCK_EX)
            before = _files(folder)
            path = (download or (lambda: sources.fetch(source, str(self.root), revision)))()
            files = _files(folder)
            after = sum(size for _, _, size in files.values())
            self._write_record(key, source, revision, folder, after)
        # A file written again counts, even where it replaced one of the same size (a damaged copy): a hit
        # is a fetch that wrote nothing.
        moved = sum(ident[2] for name, ident in files.items() if before.get(name) != ident)
        log.info(
            "Cached model uri=%s cache=%s hit=%s bytes=%d moved=%d",
            source.uri,
            self.root,
            str(moved == 0).lower(),
            after,
            moved,
        )
        self.evict()
        return Fetched(path, moved)

    def _write_record(
        self, key: str, source: ModelSource, revision: str | None, folder: Path, size: int
    ) -> None:
        self._records.mkdir(parents=True, exist_ok=True)
        record = {
            "uri": source.uri,
            "revision": revision,
            "folder": str(folder.relative_to(self.root)),
            "bytes": size,
            "lastUsed": time.time(),
        }
        temporary = self._records / f".{key}.{os.getpid()}.tmp"
        temporary.write_text(json.dumps(record))
        temporary.replace(self._records / f"{key}.json")  # readers see the old record or the new one

    def records(self) -> dict[str, dict[str, Any]]:
        """key -> record, for the models whose folder is still there."""
        found: dict[str, dict[str, Any]] = {}
        for path in sorted(self._records.glob("*.json")) if self._records.is_dir() else []:
            try:
                record = json.loads(path.read_text())
                folder = self.root / str(record["folder"])
                float(record["lastUsed"]), int(record["bytes"])
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("Ignored unreadable cache record path=%s", path)
                continue
            if folder.is_dir() and folder.resolve().is_relative_to(self.root.resolve()):
                found[path.stem] = record
        return found

    @contextlib.contextmanager
    def _unused(self, key: str) -> Iterator[bool]:
        """Whether no runtime uses the model `key` (this one included), holding that true while inside."""
        with self._open_lock(key, "use") as use:
            try:
                fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True

    def evict(self) -> int:
        """Delete least recently used models nobody serves until the cache fits its bound; bytes freed."""
        if self.max_bytes is None:
            return 0
        records = self.records()
        total = sum(int(r["bytes"]) for r in records.values())
        freed = 0
        for key, record in sorted(records.items(), key=lambda item: float(item[1]["lastUsed"])):
            if total - freed <= self.max_bytes:
                break
            with self._unused(key) as unused:
                if not unused:
                    continue
                folder = self.root / str(record["folder"])
                shutil.rmtree(folder, ignore_errors=True)
                if str(record["folder"]).startswith("s3/"):
                    s3store.manifest_path(self.root, folder).unlink(missing_ok=True)
                (self._records / f"{key}.json").unlink(missing_ok=True)
            freed += int(record["bytes"])
            log.info("Evicted model uri=%s bytes=%d", record["uri"], int(record["bytes"]))
        if total - freed > self.max_bytes:
            log.warning(
                "Model cache over its bound: the rest is in use bytes=%d max_bytes=%d",
                total - freed,
                self.max_bytes,
            )
        return freed

    def report(self) -> dict[str, Any]:
        """What /v1/pagoda/capacity says under `modelCache`: the models in the folder, biggest first."""
        models = []
        for key, record in self.records().items():
            with self._unused(key) as unused:
                in_use = not unused
            item = {"uri": record["uri"], "bytes": int(record["bytes"]), "inUse": in_use}
            item["lastUsed"] = rfc3339(float(record["lastUsed"]))
            if record.get("revision"):
                item["revision"] = record["revision"]
            models.append(item)
        models.sort(key=lambda item: (-int(item["bytes"]), str(item["uri"])))
        body: dict[str, Any] = {"bytes": sum(int(m["bytes"]) for m in models), "models": models}
        if self.max_bytes is not None:
            body["maxBytes"] = self.max_bytes
        return body

    def release(self) -> None:
        """Drop this process's use of its models (the kernel does it anyway when the process ends)."""
        for handle in self._held.values():
            handle.close()
        self._held.clear()
