"""The local OCI registry: CNCF distribution (built from its Go module by e2e/lab/tools/build.sh) on loopback,
holding Pagoda's images and its Helm chart, where the real node (e2e/lab/realnode.py) pulls from and `helm
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

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from e2e.lab.processes import REPO_ROOT, free_port

STORAGE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pagoda" / "registry"
CHART_DIR = REPO_ROOT / "charts" / "pagoda"
RELEASES_FILE = REPO_ROOT / "RELEASES.md"  # each release's version and commit
INSTALL_DOC = REPO_ROOT / "docs" / "install.md"  # with each release's upgrade notes
CHART_REPOSITORY = "charts"
IMAGES_INDEX = REPO_ROOT / ".pagoda-dev" / "images" / "index.json"
BUILDAH_ROOT = Path.home() / ".cache" / "pagoda" / "buildah"
# The registry listens here when the port is free (else on any free port, which only costs time): buildah's
# blob-info cache (/var/lib/containers/cache) records where it pushed each layer by host:port, and reuses a
# layer the registry already holds, under any repository, only at a host:port it knows. A port that changes
# with every cluster made `make release`'s test upload the runtime image's 7 GB again each run (~110 s).
PORT = 5600
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


def choose_port() -> int:
    """PORT when nothing listens there, else a free loopback port."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        try:
            sock.bind(("127.0.0.1", PORT))
        except OSError:
            return free_port()
    return PORT


def args(workdir: Path, port: int) -> list[str]:
    return ["serve", str(config(workdir, port))]


def repository_of(reference: str) -> str:
    """`ghcr.io/pagoda-dev/pagoda-operator:0.1.0` -> `pagoda-dev/pagoda-operator:0.1.0` (and
    `python:3.11` -> `library/python:3.11`): the path a mirror asks the local registry for."""
    first, _, rest = reference.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return rest
    return reference if rest else f"library/{reference}"


def _run(argv: list[str], what: str, timeout: float = 900, hint: tuple[str, str] | None = None) -> str:
    """Runs `argv`; a failure raises RegistryError with its output, and `hint`'s advice (second) when the
    output holds its marker (first)."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        output = proc.stderr.strip() or proc.stdout.strip()
        advice = f"\n{hint[1]}" if hint is not None and hint[0] in output else ""
        raise RegistryError(f"{what} failed ({proc.returncode}): {output}{advice}")
    return proc.stdout


def images(index: Path = IMAGES_INDEX) -> list[dict[str, object]]:
    """The images `make images` built (.pagoda-dev/images/index.json; or an earlier release's, e2e/lab/
    releases.py)."""
    if not index.is_file():
        raise RegistryError(f"{index} is missing: run `make images`.")
    return list(json.loads(index.read_text())["images"])


def manifest_digest(registry: str, repository: str) -> str | None:
    """The digest the registry serves for `repository` (`path:tag`), or None when it has none."""
    path, _, tag = repository.rpartition(":")
    request = urllib.request.Request(f"http://{registry}/v2/{path}/manifests/{tag}", method="HEAD")
    request.add_header("Accept", ", ".join(MANIFEST_TYPES))
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.headers.get("Docker-Content-Digest")
    except urllib.error.HTTPError:
        return None


def push_images(
    registry: str, names: tuple[str, ...] | None = None, index: Path = IMAGES_INDEX
) -> dict[str, str]:
    """Pushes each built image but the stand-in base (or those named) under every tag it has, keeping the
    path and dropping the registry host (`repository_of`); returns reference -> digest. `index`: whose
    images (`images`).
    An image the registry already serves under that tag with the digest recorded when this image id was
    pushed is not pushed again (buildah would read and hash every layer to find that out: 80 s for the
    runtime image)."""
    record_file = STORAGE / "pushed.json"
    record: dict[str, str] = json.loads(record_file.read_text()) if record_file.is_file() else {}
    pushed = {}
    for image in images(index):
        if (names is not None and image["name"] not in names) or (names is None and image.get("stand_in")):
            continue
        for reference in image["references"]:  # type: ignore[attr-defined]
            repository = repository_of(str(reference))
            key = f"{repository}@{image['id']}"
            digest = record.get(key)
            if digest is None or manifest_digest(registry, repository) != digest:
                # zstd, which decompresses faster than gzip: the runtime image's 3.4 GB of compressed layers
                # are pulled and unpacked once per cluster (the gain on that pull is not measured yet).
                digest = _push(image, str(reference), f"{registry}/{repository}", compression="zstd")
                record[key] = digest
                record_file.write_text(json.dumps(record, indent=2) + "\n")
            pushed[str(reference)] = digest
    return pushed


def _push(
    image: dict[str, object], reference: str, target: str, tls: bool = False, compression: str = "gzip"
) -> str:
    """buildah push; gzip (what every registry and runtime reads) unless told otherwise."""
    with tempfile.NamedTemporaryFile() as digest_file:
        _run(
            [
                "buildah",
                f"--root={image.get('buildah_root', BUILDAH_ROOT / 'root')}",
                f"--runroot={image.get('buildah_runroot', BUILDAH_ROOT / 'runroot')}",
                "push",
                f"--tls-verify={str(tls).lower()}",
                f"--compression-format={compression}",
                f"--digestfile={digest_file.name}",
                str(image["id"]),
                f"docker://{target}",
            ],
            f"Pushing {reference} to {target}",
            hint=(
                "image not known",
                f"{reference} ({image['id']}) is no longer in buildah's storage, which every checkout on"
                " this machine shares: another checkout's `make images` replaced it. Run `make images` here.",
            ),
        )
        return Path(digest_file.name).read_text().strip()


def record_pushed(workdir: Path, pushed: dict[str, str]) -> None:
    (workdir / "registry-images.json").write_text(json.dumps(pushed, indent=2) + "\n")


def pushed(workdir: Path) -> dict[str, str]:
    """reference -> digest of what the cluster in `workdir` pushed when it started."""
    found: dict[str, str] = json.loads((workdir / "registry-images.json").read_text())
    return found


def push_chart(
    registry: str, helm: Path, workdir: Path, plain_http: bool = True, chart_dir: Path = CHART_DIR
) -> str:
    """Packages `chart_dir` (charts/pagoda; or an earlier release's) and pushes it to `registry`
    (host[:port][/path]); returns the chart's oci:// reference (without version)."""
    workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chart-", dir=workdir) as out:
        _run([str(helm), "package", str(chart_dir), "--destination", out], "helm package")
        (package,) = Path(out).glob("pagoda-*.tgz")
        argv = [str(helm), "push", str(package), f"oci://{registry}/{CHART_REPOSITORY}"]
        _run(argv + (["--plain-http"] if plain_http else []), f"helm push {package.name}")
    return f"oci://{registry}/{CHART_REPOSITORY}/pagoda"


# What a release publishes: the operator and the CPU runtime, as `make images` built them. The GPU runtime
# (runtime/Dockerfile, FROM vllm/vllm-openai) is built where that base can be pulled (docs/install.md).
RELEASED_IMAGES = ("operator", "runtime-cpu")


def release_commits(releases: Path = RELEASES_FILE) -> dict[str, str]:
    """RELEASES.md's table: version -> the commit it was cut from (as written there), oldest first."""
    rows = [
        [cell.strip() for cell in line.split("|")[1:3]]
        for line in releases.read_text().splitlines()
        if line.startswith("| ")
    ]
    return {row[0]: row[1] for row in rows if len(row) == 2 and row[0][:1].isdigit()}


def released_versions(releases: Path = RELEASES_FILE) -> list[str]:
    """The versions in RELEASES.md's table, oldest first."""
    return list(release_commits(releases))


def missing_upgrade_notes(
    version: str, releases: Path = RELEASES_FILE, notes: Path = INSTALL_DOC
) -> str | None:
    """Why `version` may not be released yet for want of upgrade notes, or None: every release after the
    first has a section `### Upgrading from <the release before it> to <version>` in docs/install.md. A
    pre-release (`0.2.0-dev`, main between releases) needs the notes of the release it leads to (0.2.0)."""
    versions = released_versions(releases)
    earlier = versions[: versions.index(version)] if version in versions else versions
    if not earlier:
        return None  # the first release: nothing to upgrade from
    heading = f"### Upgrading from {earlier[-1]} to {version.split('-', 1)[0]}"
    if heading in notes.read_text().splitlines():
        return None
    return (
        f"{notes.relative_to(REPO_ROOT) if notes.is_relative_to(REPO_ROOT) else notes} has no section "
        f"'{heading}': write what the upgrade changes for running services, what rolls and when, the "
        "permissions, how to roll back and the CRD's compatibility first."
    )


def release(prefix: str, version: str, helm: Path, workdir: Path, plain_http: bool = False) -> dict[str, str]:
    """Pushes the released images as PREFIX/<name>:<tag> and the chart as oci://PREFIX/charts/pagoda, where
    the chart's version and appVersion must equal `version` (its default image tag is the appVersion, so
    the chart installs what this release pushed), and docs/install.md must have its upgrade notes
    (`missing_upgrade_notes`). Returns target -> digest."""
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    for key in ("version", "appVersion"):
        if str(chart[key]) != version:
            raise RegistryError(
                f"VERSION={version} but charts/pagoda/Chart.yaml has {key}: {chart[key]}; set both to the "
                "release's version first (the chart's default image tag is its appVersion)."
            )
    missing_notes = missing_upgrade_notes(version)
    if missing_notes is not None:
        raise RegistryError(missing_notes)
    missing = set(RELEASED_IMAGES) - {str(i["name"]) for i in images()}
    if missing:
        raise RegistryError(f"Not built: {sorted(missing)}; run `make images`.")
    published = {}
    for image in images():
        if image["name"] not in RELEASED_IMAGES:
            continue
        reference = str(image["references"][0])  # type: ignore[index]
        name_and_tag = reference.rsplit("/", 1)[1]  # pagoda-operator:0.1.0
        if not name_and_tag.split(":", 1)[1].startswith(version):
            raise RegistryError(f"{reference} was built for another version: run `make images` again.")
        target = f"{prefix}/{name_and_tag}"
        published[target] = _push(image, reference, target, tls=not plain_http)
    published[push_chart(prefix, helm, workdir, plain_http)] = version
    return published


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.lab.registry", description="Publishes a release.")
    sub = parser.add_subparsers(dest="command", required=True)
    rel = sub.add_parser("release", help="push the images and the chart (make release)")
    rel.add_argument("--registry", required=True, help="host[:port]/path the images and chart go under")
    rel.add_argument("--version", required=True, help="the chart's version and appVersion")
    rel.add_argument("--plain-http", action="store_true", help="a registry without TLS (a local one)")
    args = parser.parse_args(argv)
    helm = Path(os.environ.get("PAGODA_BIN", REPO_ROOT / ".pagoda-dev" / "bin")) / "helm"
    try:
        with tempfile.TemporaryDirectory() as workdir:
            published = release(args.registry, args.version, helm, Path(workdir), args.plain_http)
    except RegistryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for target, digest in published.items():
        print(f"Pushed {target} {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def chart_version() -> str:
    return str(yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["version"])
