"""e2e/lab/registry.py's failures say what to do: a push of an image another checkout's `make images` replaced
in the shared buildah storage names the fix, other failures keep their own output."""

from __future__ import annotations

import pytest

from e2e.lab.registry import RegistryError, _run

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
