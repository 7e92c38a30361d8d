"""The shared model cache (runtime/models/modelcache.py): one download per cache folder however many runtimes
start at once, eviction of the least recently used models nobody serves, and the report the operator reads.

Runtimes are separate processes here, as they are separate containers on a node: the locks are the kernel's
flock(2) locks, which is what makes them hold between pods."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from pagoda.runtime.models.modelcache import ModelCache, model_folder, stored_bytes
from pagoda.runtime.models.modeluri import parse_model_uri

URI = "s3://models/llama/tiny"


def _write_model(folder: Path, size: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    part = folder / "model.safetensors"
    temporary = folder / ".model.safetensors.part"
    temporary.write_bytes(b"x" * size)
    temporary.replace(part)  # as the S3 client does: whole files only
    return folder


def _slow_download(root: str, uri: str, downloads: str, started: str) -> Path:
    """A download that takes a while and counts itself in the file `downloads`."""
    folder = model_folder(parse_model_uri(uri), Path(root))
    Path(started).touch()
    if not (folder / "model.safetensors").is_file():
        with open(downloads, "a") as out:
            out.write(f"{os.getpid()}\n")
        time.sleep(0.5)
        _write_model(folder, 1000)
    return folder


def _start(root: str, uri: str, downloads: str, started: str, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    cache = ModelCache(Path(root))
    fetched = cache.fetch(parse_model_uri(uri), None, lambda: _slow_download(root, uri, downloads, started))
    results.put((str(fetched.path), fetched.bytes_moved))


def _serve(root: str, uri: str, holding: str, stop: str) -> None:
    """A runtime serving `uri` until the file `stop` appears."""
    cache = ModelCache(Path(root))
    cache.fetch(
        parse_model_uri(uri), None, lambda: _write_model(model_folder(parse_model_uri(uri), Path(root)), 1000)
    )
    Path(holding).touch()
    while not Path(stop).exists():
        time.sleep(0.02)


def _wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)


def test_runtimes_starting_together_download_once(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    downloads, root = tmp_path / "downloads", tmp_path / "cache"
    procs = [
        context.Process(
            target=_start, args=(str(root), URI, str(downloads), str(tmp_path / f"s{i}"), results)
        )
        for i in range(3)
    ]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=30) for _ in procs]
    for proc in procs:
        proc.join(timeout=10)
        assert proc.exitcode == 0
    assert len(downloads.read_text().split()) == 1
    folder = str(model_folder(parse_model_uri(URI), root))
    assert sorted(outcomes) == [(folder, 0), (folder, 0), (folder, 1000)]


def test_a_second_start_moves_nothing_and_records_the_model(tmp_path: Path) -> None:
    source = parse_model_uri(URI)
    first = ModelCache(tmp_path).fetch(
        source, None, lambda: _write_model(model_folder(source, tmp_path), 700)
    )
    second = ModelCache(tmp_path).fetch(source, None, lambda: model_folder(source, tmp_path))
    assert (first.bytes_moved, second.bytes_moved) == (700, 0)
    [record] = ModelCache(tmp_path).records().values()
    folder = model_folder(source, tmp_path).relative_to(tmp_path).as_posix()
    assert record["uri"] == URI and record["bytes"] == 700 and record["folder"] == folder


def test_a_file_written_again_with_the_same_size_is_no_hit(tmp_path: Path) -> None:
    """A download that replaced a damaged file with a whole one of the same size moved bytes: the start is
    reported as a fetch (status.startup's fetchedBytes), not as a hit."""
    source = parse_model_uri(URI)
    ModelCache(tmp_path).fetch(source, None, lambda: _write_model(model_folder(source, tmp_path), 700))
    again = ModelCache(tmp_path).fetch(
        source, None, lambda: _write_model(model_folder(source, tmp_path), 700)
    )
    assert again.bytes_moved == 700


def _fill(cache: ModelCache, uri: str, size: int) -> None:
    source = parse_model_uri(uri)
    cache.fetch(source, None, lambda: _write_model(model_folder(source, cache.root), size))


def test_eviction_deletes_the_least_recently_used_models_nobody_serves(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    holding, stop = tmp_path / "holding", tmp_path / "stop"
    root = tmp_path / "cache"
    # The oldest model is served by another runtime, which keeps it whatever its age.
    server = context.Process(target=_serve, args=(str(root), "s3://mm3/served", str(holding), str(stop)))
    server.start()
    try:
        _wait_for(holding)
        idle = ModelCache(root)
        _fill(idle, "s3://mm3/old", 1000)
        idle.release()  # this runtime stopped serving it
        newest = ModelCache(root, max_bytes=2500)
        _fill(newest, "s3://mm3/new", 1000)  # 3000 bytes in all: one model has to go
        remaining = sorted(r["uri"] for r in newest.records().values())
        assert remaining == ["s3://mm3/new", "s3://mm3/served"]
        assert not model_folder(parse_model_uri("s3://mm3/old"), root).exists()
        report = newest.report()
        assert report["bytes"] == 2000 and report["maxBytes"] == 2500
        assert {m["uri"]: m["inUse"] for m in report["models"]} == {
            "s3://mm3/new": True,
            "s3://mm3/served": True,
        }
        # Past the bound with everything in use: kept (a warning), never a model that a runtime serves.
        assert ModelCache(root, max_bytes=1).evict() == 0
        assert len(newest.records()) == 2
    finally:
        stop.touch()
        server.join(timeout=10)
    assert server.exitcode == 0
    # The server is gone: its model is unused now, and the next eviction may take it.
    assert ModelCache(root, max_bytes=1500).evict() == 1000
    assert [r["uri"] for r in newest.records().values()] == ["s3://mm3/new"]


def test_report_lists_models_biggest_first_and_skips_what_is_gone(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path)
    _fill(cache, "s3://mm3/small", 10)
    _fill(cache, "hf://org/big", 30)
    cache.release()
    report = ModelCache(tmp_path).report()
    assert [(m["uri"], m["bytes"], m["inUse"]) for m in report["models"]] == [
        ("hf://org/big", 30, False),
        ("s3://mm3/small", 10, False),
    ]
    assert "maxBytes" not in report
    records = tmp_path / ".pagoda" / "models"
    (records / "broken.json").write_text("{")
    (records / "elsewhere.json").write_text(
        json.dumps({"uri": "x", "folder": "../..", "bytes": 1, "lastUsed": 1})
    )
    small = model_folder(parse_model_uri("s3://mm3/small"), tmp_path)
    for path in small.iterdir():
        path.unlink()
    small.rmdir()
    assert [m["uri"] for m in ModelCache(tmp_path).report()["models"]] == ["hf://org/big"]


def test_one_hf_name_on_two_hubs_is_two_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hf://org/m of huggingface.co and of a mirror (HF_ENDPOINT): two folders, so two records and two locks,
    and the mirror's start reuses nothing of the other's copy; huggingface.co's stays where it always was."""
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    source, cache = parse_model_uri("hf://org/m"), ModelCache(tmp_path)
    _fill(cache, "hf://org/m", 10)
    default = model_folder(source, tmp_path)
    assert default == tmp_path / "hf" / "models--org--m"
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example")
    mirror = model_folder(source, tmp_path)
    assert mirror.parent.parent == tmp_path / "hf-hubs" and mirror.name == "models--org--m"
    fetched = cache.fetch(source, None, lambda: mirror if mirror.is_dir() else _write_model(mirror, 20))
    assert fetched.bytes_moved == 20
    folders = {r["folder"]: r["bytes"] for r in cache.records().values()}
    assert folders == {"hf/models--org--m": 10, mirror.relative_to(tmp_path).as_posix(): 20}


def test_hub_snapshots_are_counted_once(tmp_path: Path) -> None:
    blob = tmp_path / "blobs" / "abc"
    blob.parent.mkdir()
    blob.write_bytes(b"y" * 50)
    snapshot = tmp_path / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to(blob)
    assert stored_bytes(tmp_path) == 50


def test_local_models_pass_through_and_bad_bounds_are_refused(tmp_path: Path) -> None:
    fetched = ModelCache(tmp_path).fetch(parse_model_uri("file:///models/tiny"), None)
    assert (str(fetched.path), fetched.bytes_moved) == ("/models/tiny", 0)
    assert not (tmp_path / ".pagoda").exists()
    with pytest.raises(ValueError, match="cache max bytes must be positive"):
        ModelCache(tmp_path, max_bytes=0)
