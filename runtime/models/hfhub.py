"""hf:// models: downloaded with the Hugging Face client into its cache layout, one cache per hub
(hf_cache), and every file of the snapshot served checked against the name the hub's blob store gives it
(hf_damaged)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pagoda.runtime.models.download import Progress, file_digests
from pagoda.runtime.models.modeluri import ModelSource, ModelSourceError

# The model sources' one log (sources.py, hfhub.py, s3store.py, download.py): its lines kept the logger they
# had before the split, so a log filter or a test that follows it still sees every one.
log = logging.getLogger("pagoda.runtime.models.sources")

HF_ENDPOINT_DEFAULT = "https://huggingface.co"
# huggingface_hub errors (by class name) that say the model is not there or not ours to read.
_HF_REASONS = {
    "RepositoryNotFoundError": "ModelNotFound",
    "RevisionNotFoundError": "ModelNotFound",
    "EntryNotFoundError": "ModelNotFound",
    "GatedRepoError": "ModelAccessDenied",
}


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


def fetch_hf(source: ModelSource, cache_dir: Path, revision: str | None) -> Path:
    """The snapshot folder of an hf:// model at `revision`, downloaded into hf_cache (or, with no network,
    the cached copy), every file checked by hf_damaged and fetched again where it differs. Blocking."""
    import huggingface_hub
    from tqdm.auto import tqdm  # type: ignore[import-untyped,unused-ignore]

    progress = Progress(source.uri)

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
