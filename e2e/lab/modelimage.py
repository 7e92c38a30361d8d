"""A model folder as an OCI image, for `spec.model.uri: oci://...` (the kubelet mounts it as an image volume).

    make package-model MODEL=DIR IMAGE=registry/repository:tag [TLS_VERIFY=false]
    # = .venv/bin/python -m e2e.lab.modelimage DIR registry/repository:tag [--tls-verify=false]

The image has no base and no command: one layer with the folder's files at its top (config.json at /),
readable by every user (the runtime runs as 65532), and the label dev.pagoda.model-bytes. buildah builds and
pushes it without a daemon, in the same storage as `make images` (~/.cache/pagoda/buildah). The equivalent
with Docker is a Dockerfile in the model folder of `FROM scratch` and `COPY --chmod=0644 . /` (for a folder
without subfolders), then `docker build` and `docker push`. A node's container runtime then pulls the model
once and keeps it with its images: the image store is the node cache (docs/operator.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from e2e.lab.registry import BUILDAH_ROOT
from pagoda.runtime.serving.startup import folder_bytes

BUILDAH = ["buildah", f"--root={BUILDAH_ROOT / 'root'}", f"--runroot={BUILDAH_ROOT / 'runroot'}"]


def _buildah(*args: str) -> str:
    result = subprocess.run([*BUILDAH, *args], text=True, capture_output=True)
    if result.returncode != 0:
        raise RuntimeError(f"buildah {args[0]} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    return result.stdout.strip()


def package(folder: Path, reference: str, tls_verify: bool = True) -> str:
    """Builds the image `reference` from `folder` and pushes it there; returns the pushed manifest's digest
    (pin it: oci://registry/repository@sha256:...)."""
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} has no config.json: not a model folder")
    size = folder_bytes(folder)
    container = _buildah("from", "scratch")
    try:
        _buildah("copy", container, f"{folder}/.", "/")
        # Readable by the runtime's user (65532): the files keep their modes, and a writer such as
        # safetensors' leaves weights 0600, which the pod could not read.
        root = _buildah("mount", container)
        subprocess.run(["chmod", "-R", "a+rX,go-w", root], check=True)
        _buildah("umount", container)
        _buildah("config", "--label", f"dev.pagoda.model-bytes={size}", container)
        _buildah("commit", "--quiet", container, reference)
    finally:
        subprocess.run([*BUILDAH, "rm", container], capture_output=True, check=False)
    with tempfile.NamedTemporaryFile() as digest:
        _buildah(
            "push",
            f"--tls-verify={str(tls_verify).lower()}",
            f"--digestfile={digest.name}",
            reference,
            f"docker://{reference}",
        )
        return Path(digest.name).read_text().strip()


def without_tag(reference: str) -> str:
    """registry[:port]/repository of a reference with a tag and/or digest."""
    name = reference.split("@", 1)[0]
    head, _, tail = name.rpartition(":")
    return head if head and "/" not in tail else name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="the model folder (config.json, weights, tokenizer)")
    parser.add_argument("image", help="where to push it: registry/repository:tag")
    parser.add_argument("--tls-verify", default="true", choices=["true", "false"])
    opts = parser.parse_args(argv)
    try:
        pushed = package(opts.model, opts.image, opts.tls_verify == "true")
    except (ValueError, RuntimeError) as exc:
        print(f"package-model: {exc}", file=sys.stderr)
        return 1
    print(f"pushed {opts.image} ({pushed}); use spec.model.uri: oci://{without_tag(opts.image)}@{pushed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
