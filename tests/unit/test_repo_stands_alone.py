"""The repository stands alone: no file cites a document that lives outside it (the team lead's design and
style notes, a sibling checkout). A reader who clones it must be able to follow every reference."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.repo import REPO

# Names of documents that exist only outside the repository.
OUTSIDE = re.compile(r"\.\./shared|\bDESIGN\.md\b|\bSTYLE\.md\b|\bnotes/(realnode|addons)\.md\b")


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
    ).stdout.decode()
    files = []
    for name in filter(None, listed.split("\0")):
        path = REPO / name
        if path.is_file() and path.suffix not in {".png", ".tgz", ".gz"}:
            files.append(path)
    return files


def test_no_file_cites_a_document_outside_the_repository() -> None:
    this = Path(__file__).resolve()
    found = []
    for path in tracked_text_files():
        if path == this:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:120]}")
    assert not found, "cite the repository's own docs instead:\n" + "\n".join(found)


def test_the_pattern_catches_what_it_is_meant_to() -> None:
    assert OUTSIDE.search("see DESIGN.md for why")
    assert OUTSIDE.search("(STYLE.md 11)")
    assert OUTSIDE.search("../shared/notes/realnode.md")
    assert not OUTSIDE.search("docs/design/2026-11-29-package-layout.md")
