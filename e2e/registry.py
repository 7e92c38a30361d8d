"""The local OCI registry: CNCF distribution (built from its Go module by e2e/tools/build.sh) on loopback,
holding Pagoda's images and its Helm chart, where the real node (e2e/realnode.py) pulls from and `helm
install oci://...` installs from, as a user's cluster does from theirs.

    registry = "127.0.0.1:PORT"
    push_images(registry)            # `make images`' images, each under its own name without the host
    chart = push_chart(registry)     # oci://127.0.0.1:PORT/charts/pagoda, version = Chart.yaml's

Its storage outlives clusters (STORAGE, like the tools and image caches): a blob already there is not sent
again, so a warm run pushes only what changed. Image names keep their path and drop their registry host:
`ghcr.io/pagoda-dev/pagoda-operator:0.1.0` is stored as `pagoda-dev/pagoda-operator:0.1.0`, which is what
containerd asks for when its catch-all mirror sends ghcr.io to this registry.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from e2e import _procs

STORAGE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pagoda" / "registry"
CHART_DIR = _procs.REPO_ROOT / "charts" / "pagoda"
CHART_REPOSITORY = "charts"
IMAGES_INDEX = _procs.REPO_ROOT / ".pagoda-dev" / "images" / "index.json"
BUILDAH_ROOT = Path.home() / ".cache" / "pagoda" / "buildah"
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)


class RegistryError(RuntimeError):
    """A push to the local registry failed."""


def config(workdir: Path, port: int) -> Path:
    """The registry's configuration file: loopback only, storage in STORAGE, deletes allowed."""
    STORAGE.mkdir(parents=True, exist_ok=True)
    path = workdir / "registry.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "log": {"level": "warn", "accesslog": {"disabled": True}},
                "storage": {"filesystem": {"rootdirectory": str(STORAGE)}, "delete": {"enabled": True}},
                "http": {"addr": f"127.0.0.1:{port}"},
                "health": {"storagedriver": {"enabled": False}},
            }
        )
    )
    return path


def args(workdir: Path, port: int) -> list[str]:
    return ["serve", str(config(workdir, port))]


def repository_of(reference: str) -> str:
    """`ghcr.io/pagoda-dev/pagoda-operator:0.1.0` -> `pagoda-dev/pagoda-operator:0.1.0` (and
    `python:3.11` -> `library/python:3.11`): the path a mirror asks the local registry for."""
    first, _, rest = reference.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return rest
    return reference if rest else f"library/{reference}"


def _run(argv: list[str], what: str, timeout: float = 900) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RegistryError(
            f"{what} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc.stdout


def images() -> list[dict[str, object]]:
    """The images `make images` built (.pagoda-dev/images/index.json)."""
    if not IMAGES_INDEX.is_file():
        raise RegistryError(f"{IMAGES_INDEX} is missing: run `make images`.")
    return list(json.loads(IMAGES_INDEX.read_text())["images"])


def _manifest_digest(registry: str, repository: str) -> str | None:
    """The digest the registry serves for `repository` (`path:tag`), or None when it has none."""
    path, _, tag = repository.rpartition(":")
    request = urllib.request.Request(f"http://{registry}/v2/{path}/manifests/{tag}", method="HEAD")
    request.add_header("Accept", ", ".join(MANIFEST_TYPES))
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.headers.get("Docker-Content-Digest")
    except urllib.error.HTTPError:
        return None


def push_images(registry: str, names: tuple[str, ...] | None = None) -> dict[str, str]:
    """Pushes each built image (or those named) under every tag it has; returns reference -> digest.
    An image the registry already serves under that tag with the digest recorded when this image id was
    pushed is not pushed again (buildah would read and hash every layer to find that out: 80 s for the
    runtime image)."""
    record_file = STORAGE / "pushed.json"
    record: dict[str, str] = json.loads(record_file.read_text()) if record_file.is_file() else {}
    pushed = {}
    for image in images():
        if names is not None and image["name"] not in names:
            continue
        for reference in image["references"]:  # type: ignore[attr-defined]
            repository = repository_of(str(reference))
            key = f"{repository}@{image['id']}"
            digest = record.get(key)
            if digest is None or _manifest_digest(registry, repository) != digest:
                digest = _push(image, str(reference), f"{registry}/{repository}")
                record[key] = digest
                record_file.write_text(json.dumps(record, indent=2) + "\n")
            pushed[str(reference)] = digest
    return pushed


def _push(image: dict[str, object], reference: str, target: str) -> str:
    with tempfile.NamedTemporaryFile() as digest_file:
        _run(
            [
                "buildah",
                f"--root={image.get('buildah_root', BUILDAH_ROOT / 'root')}",
                f"--runroot={image.get('buildah_runroot', BUILDAH_ROOT / 'runroot')}",
                "push",
                "--tls-verify=false",
                f"--digestfile={digest_file.name}",
                str(image["id"]),
                f"docker://{target}",
            ],
            f"Pushing {reference} to {target}",
        )
        return Path(digest_file.name).read_text().strip()


def record_pushed(workdir: Path, pushed: dict[str, str]) -> None:
    (workdir / "registry-images.json").write_text(json.dumps(pushed, indent=2) + "\n")


def pushed(workdir: Path) -> dict[str, str]:
    """reference -> digest of what the cluster in `workdir` pushed when it started."""
    found: dict[str, str] = json.loads((workdir / "registry-images.json").read_text())
    return found


def push_chart(registry: str, helm: Path, workdir: Path) -> str:
    """Packages charts/pagoda and pushes it; returns the chart's oci:// reference (without version)."""
    out = workdir / "chart"
    out.mkdir(parents=True, exist_ok=True)
    _run([str(helm), "package", str(CHART_DIR), "--destination", str(out)], "helm package")
    (package,) = out.glob("pagoda-*.tgz")
    _run(
        [str(helm), "push", str(package), f"oci://{registry}/{CHART_REPOSITORY}", "--plain-http"],
        f"helm push {package.name}",
    )
    return f"oci://{registry}/{CHART_REPOSITORY}/pagoda"


def chart_version() -> str:
    return str(yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["version"])
