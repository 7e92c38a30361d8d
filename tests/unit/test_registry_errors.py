"""e2e/lab/registry.py's failures say what to do: a push of an image another checkout's `make images` replaced
in the shared buildah storage names the fix, other failures keep their own output; a release after the first
is refused without its upgrade notes in docs/install.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.lab.registry import RegistryError, _run, chart_version, missing_upgrade_notes, released_versions

HINT = ("image not known", "Run `make images` here.")


def test_a_failure_with_the_marker_gets_the_advice() -> None:
    argv = ["sh", "-c", "echo 'pushing abc: image not known' >&2; exit 125"]
    with pytest.raises(RegistryError) as caught:
        _run(argv, "Pushing x", hint=HINT)
    expected = "Pushing x failed (125): pushing abc: image not known\nRun `make images` here."
    assert str(caught.value) == expected


def test_another_failure_keeps_its_own_output() -> None:
    with pytest.raises(RegistryError) as caught:
        _run(["sh", "-c", "echo 'connection refused' >&2; exit 1"], "Pushing x", hint=HINT)
    assert str(caught.value) == "Pushing x failed (1): connection refused"


def test_success_returns_the_output() -> None:
    assert _run(["sh", "-c", "echo ok"], "echo", hint=HINT) == "ok\n"


RELEASES = """| version | commit | date |
|---|---|---|
| 0.1.0 | abc1234 | 2026-12-06 |
| 0.2.0 | def5678 | 2026-12-20 |
"""


@pytest.mark.parametrize(
    ("version", "notes", "missing"),
    [
        ("0.1.0", "", False),  # the first release: nothing to upgrade from
        ("0.2.0", "## Upgrade\n### Upgrading from 0.1.0 to 0.2.0\ntext\n", False),
        ("0.2.0", "## Upgrade\n### Upgrading: something\n", True),
        ("0.3.0", "### Upgrading from 0.1.0 to 0.2.0\n", True),  # the notes must name the release before
        ("0.3.0", "### Upgrading from 0.2.0 to 0.3.0\n", False),
        ("0.3.0-dev", "### Upgrading from 0.2.0 to 0.3.0\n", False),  # main heading for 0.3.0: its notes
        ("0.3.0-dev", "### Upgrading from 0.2.0 to 0.3.0-dev\n", True),
    ],
)
def test_a_release_after_the_first_needs_its_upgrade_notes(
    tmp_path: Path, version: str, notes: str, missing: bool
) -> None:
    (tmp_path / "RELEASES.md").write_text(RELEASES)
    (tmp_path / "install.md").write_text(notes)
    found = missing_upgrade_notes(version, tmp_path / "RELEASES.md", tmp_path / "install.md")
    assert (found is not None) == missing, found
    if missing:
        assert found is not None and f" to {version.split('-')[0]}'" in found, found


def test_this_repositorys_releases_have_their_notes() -> None:
    """Every release after the first in RELEASES.md has its section in docs/install.md."""
    versions = released_versions()
    assert versions and versions[0] == "0.1.0"
    assert [v for v in versions if missing_upgrade_notes(v) is not None] == []
    # main between releases (a pre-release version) has the notes of the release it leads to
    assert missing_upgrade_notes(chart_version()) is None
