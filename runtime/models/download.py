"""What the hf:// and s3:// downloads share: their progress lines in the log, and the hashing that checks a
cached copy before it is served again."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# The model sources' one log (sources.py, hfhub.py, s3store.py, download.py): its lines kept the logger they
# had before the split, so a log filter or a test that follows it still sees every one.
log = logging.getLogger("pagoda.runtime.models.sources")


class Progress:
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
