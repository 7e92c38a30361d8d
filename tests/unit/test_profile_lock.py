"""Tier 1: GuideLLM's install for `pagoda-runtime profile`: runtime/requirements-profile.lock holds GuideLLM
and only what the CPU lock lacks or pins at another version, every package hashed; the CPU image installs it
in a layer of its own between the engine's and Pagoda's code, and says where it is."""

from __future__ import annotations

import re

from e2e.lab import images
from tests.repo import REPO


def test_the_profile_lock_pins_guidellm_and_only_what_the_cpu_lock_does_not_with_hashes() -> None:
    profile = images.lock_blocks(images.PROFILE_LOCK.read_text())
    cpu = images.lock_blocks(images.CPU_LOCK.read_text())
    name, version = images.GUIDELLM.split("==")
    assert profile[name][0] == version
    shared = sorted(
        package for package, (pinned, _) in profile.items() if cpu.get(package, ("",))[0] == pinned
    )
    assert shared == [], f"{shared}: the CPU lock pins these at the same version (make lock)"
    for package, (_, block) in profile.items():
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", block), f"{package} has no hash"
    # What GuideLLM needs lower than the runtime: the reason it has an environment of its own.
    assert {"click", "multidict"} <= {package for package in profile if package in cpu}
    assert "torch" not in profile and "transformers" not in profile


def test_the_cpu_image_installs_guidellm_after_the_engine_and_before_pagodas_code() -> None:
    dockerfile = REPO / "runtime/Dockerfile.cpu"
    steps = images.instructions(dockerfile)

    def index(name: str, needle: str) -> int:
        return next(i for i, (kind, args) in enumerate(steps) if kind == name and needle in args)

    engine = index("RUN", "requirements-cpu.lock")
    seed = index("RUN", "modelinfo.py")
    guidellm = index("RUN", "requirements-profile.lock")
    code = index("COPY", "pyproject.toml")
    assert engine < seed < guidellm < code
    assert "--no-deps --require-hashes" in steps[guidellm][1] and "/opt/guidellm" in steps[guidellm][1]
    assert "PAGODA_GUIDELLM=/opt/guidellm/bin/guidellm" in " ".join(
        args for kind, args in steps if kind == "ENV"
    )
    assert "runtime/requirements-profile.lock" in images.copy_sources(dockerfile)
    assert images.IMAGES["runtime-cpu"].locks == (images.CPU_LOCK, images.PROFILE_LOCK)


def test_the_gpu_image_has_guidellm_where_the_cpu_image_has_it() -> None:
    steps = images.instructions(REPO / "runtime/Dockerfile")
    version = images.GUIDELLM.split("==")[1]
    assert f"ARG GUIDELLM_VERSION={version}" in [f"{kind} {args}" for kind, args in steps]
    env = " ".join(args for kind, args in steps if kind == "ENV")
    assert "PAGODA_GUIDELLM=/opt/guidellm/bin/guidellm" in env
