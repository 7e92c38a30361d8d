"""An earlier release of Pagoda, for the e2e tier to upgrade from (e2e/test_upgrade.py): built from a git
worktree of the commit RELEASES.md records for it, and pushed to the local cluster's registry beside this
checkout's images and chart.

    earlier = releases.publish(cluster, "0.1.0")
    helm install pagoda oci://<registry>/charts/pagoda --version 0.1.0 \\
        --set operator.runtimeImage=<earlier.runtime_image>

- The worktree: .pagoda-dev/releases/<version>, `git worktree add --detach <commit>`, made once per checkout.
  Git tags do not travel with a submission, RELEASES.md's commits do.
- Its images: built by the release's own builder (its e2e/lab/images.py, run in the worktree with this
  checkout's Python and Go-built tools), so they are what that commit's `make images` built, tagged with its
  appVersion: the operator and the CPU runtime. Built once: while the ids its index records are in buildah's
  storage (shared by every checkout) nothing is built. A first build costs the layers after the lock files'
  (the same locks as this checkout's: buildah's layer cache serves the rest); docs/testing.md has the times.
  Each builder untags the other's inputs-hash tags (`forget_older`: same repositories), never its version
  tags, so the images stay; the next build on either side re-tags from the layer cache in seconds.
- The registry: its images pushed by id (registry.push_images, whose record skips what the registry already
  holds), its chart packaged from the worktree and pushed as the same repository's version <version>.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from e2e.lab import images, registry
from e2e.lab.cluster import Cluster
from e2e.lab.processes import REPO_ROOT

RELEASES_DIR = REPO_ROOT / ".pagoda-dev" / "releases"
BUILD_TIMEOUT = 1800.0  # a first build of the CPU runtime's code layers, on a machine whose cache is cold


class ReleaseError(RuntimeError):
    """An earlier release could not be checked out, built or pushed."""


@dataclass(frozen=True)
class Release:
    version: str
    commit: str
    chart: str  # oci://<registry>/charts/pagoda (install it with --version <version>)
    operator_image: str
    runtime_image: str  # the CPU runtime: the chart's operator.runtimeImage on the local cluster
    built_seconds: float  # 0 when it was built before


def commit_of(version: str, releases: Path = registry.RELEASES_FILE) -> str:
    """The commit RELEASES.md records for `version` (as written there: a short hash)."""
    commits = registry.release_commits(releases)
    if version not in commits:
        raise ReleaseError(f"{releases.name} has no release {version}: {list(commits)}")
    return commits[version]


def _git(*args: str, cwd: Path = REPO_ROOT) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout.strip()


def worktree(version: str) -> tuple[Path, str]:
    """The release's worktree (made when missing or at another commit) and its full commit."""
    commit = _git("rev-parse", "--verify", f"{commit_of(version)}^{{commit}}")
    tree = RELEASES_DIR / version
    if tree.is_dir():
        try:
            if _git("rev-parse", "HEAD", cwd=tree) == commit and not _git("status", "--porcelain", cwd=tree):
                return tree, commit
        except ReleaseError:
            pass  # not a worktree any more (its .git link is stale): made again
        shutil.rmtree(tree)
    _git("worktree", "prune")
    RELEASES_DIR.mkdir(parents=True, exist_ok=True)
    _git("worktree", "add", "--detach", str(tree), commit)
    return tree, commit


def index_of(tree: Path) -> Path:
    return tree / ".pagoda-dev" / "images" / "index.json"


def built(tree: Path) -> bool:
    """Whether the worktree's index lists the released images and buildah still stores each of them."""
    index = index_of(tree)
    if not index.is_file():
        return False
    entries = {str(i["name"]): str(i["id"]) for i in json.loads(index.read_text())["images"]}
    return all(
        name in entries and images.image_id(entries[name]) == entries[name]
        for name in registry.RELEASED_IMAGES
    )


def build(version: str) -> tuple[Path, str, float]:
    """The release's worktree, commit, and the seconds its images took to build (0: built before)."""
    tree, commit = worktree(version)
    if built(tree):
        return tree, commit, 0.0
    started = time.monotonic()
    env = {**os.environ, "PAGODA_BIN": str(images.BIN)}
    argv = [sys.executable, "-m", "e2e.lab.images", *registry.RELEASED_IMAGES]
    result = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    if result.returncode != 0 or not built(tree):
        raise ReleaseError(
            f"Building release {version}'s images in {tree} failed ({result.returncode}):\n"
            f"{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    return tree, commit, time.monotonic() - started


def publish(cluster: Cluster, version: str) -> Release:
    """Builds release `version` (`build`) and pushes its images and chart to `cluster`'s registry."""
    tree, commit, seconds = build(version)
    address = cluster.urls["registry"]
    pushed = registry.push_images(address, registry.RELEASED_IMAGES, index=index_of(tree))
    chart = registry.push_chart(
        address, cluster.bin_dir / "helm", cluster.workdir, chart_dir=tree / "charts/pagoda"
    )
    entries = {str(i["name"]): str(i["references"][0]) for i in registry.images(index_of(tree))}  # type: ignore[index]
    for name in registry.RELEASED_IMAGES:
        if entries[name] not in pushed:
            raise ReleaseError(f"{entries[name]} was not pushed: {sorted(pushed)}")
    return Release(version, commit, chart, entries["operator"], entries["runtime-cpu"], seconds)
