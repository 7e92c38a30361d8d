"""Tier 1: serve copies vLLM's seeded model-registry answers (runtime/models/modelinfo.py) into its own cache;
the runtime images make the seed at build time and name it."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from pagoda.runtime.models import modelinfo
from tests.repo import REPO


def test_only_the_answers_the_cache_lacks_are_copied_with_their_mtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed, cache = tmp_path / "seed" / "modelinfos", tmp_path / "cache"
    seed.mkdir(parents=True)
    (seed / "a.json").write_text('{"hash": "seeded-a"}')
    (seed / "b.json").write_text('{"hash": "seeded-b"}')
    os.utime(seed / "a.json", ns=(1_000_000_000, 1_000_000_000))
    (cache / "modelinfos").mkdir(parents=True)
    (cache / "modelinfos" / "b.json").write_text('{"hash": "vllm-wrote-b"}')
    monkeypatch.setenv(modelinfo.SEED_ENV, str(tmp_path / "seed"))
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(cache))

    assert modelinfo.install() == 1
    assert (cache / "modelinfos" / "a.json").read_text() == '{"hash": "seeded-a"}'
    assert (cache / "modelinfos" / "a.json").stat().st_mtime_ns == 1_000_000_000
    assert (cache / "modelinfos" / "b.json").read_text() == '{"hash": "vllm-wrote-b"}'  # vLLM's own wins
    assert modelinfo.install() == 0


def test_no_seed_is_nothing_to_do_and_a_missing_one_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    monkeypatch.delenv(modelinfo.SEED_ENV, raising=False)
    assert modelinfo.install() == 0
    monkeypatch.setenv(modelinfo.SEED_ENV, str(tmp_path / "nowhere"))
    with caplog.at_level(logging.WARNING, logger="pagoda.runtime.models.modelinfo"):
        assert modelinfo.install() == 0
    assert f"No model-info seed PAGODA_VLLM_SEED_DIR={tmp_path / 'nowhere'}" in caplog.text
    assert not (tmp_path / "cache").exists()


def test_a_cache_that_cannot_be_written_is_logged_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "seed" / "modelinfos").mkdir(parents=True)
    (tmp_path / "seed" / "modelinfos" / "a.json").write_text("{}")
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv(modelinfo.SEED_ENV, str(tmp_path / "seed"))
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "not-a-folder" / "vllm"))
    with caplog.at_level(logging.WARNING, logger="pagoda.runtime.models.modelinfo"):
        assert modelinfo.install() == 0
    assert "Could not seed vLLM's model-info cache" in caplog.text


@pytest.mark.parametrize("dockerfile", ["runtime/Dockerfile", "runtime/Dockerfile.cpu"])
def test_the_runtime_images_seed_at_build_time_and_name_the_seed(dockerfile: str) -> None:
    text = (REPO / dockerfile).read_text()
    assert "python3 runtime/models/modelinfo.py /opt/pagoda/vllm-seed" in text
    assert f"{modelinfo.SEED_ENV}=/opt/pagoda/vllm-seed" in text
