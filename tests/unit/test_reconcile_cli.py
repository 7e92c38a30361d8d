"""`pagoda-operator` flags: bad input is refused with the flag named."""

from __future__ import annotations

import pytest

from pagoda.operator.main import parse_args
from pagoda.operator.resources import DEFAULT_RUNTIME_IMAGE


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--metrics-port", "0"], "--metrics-port"),
        (["--metrics-port", "70000"], "--metrics-port"),
        (["--workers", "0"], "--workers"),
        (["--resync-seconds", "-1"], "--resync-seconds"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "--kubeconfig"),
        (["--runtime-image", ""], "--runtime-image"),
        (["--runtime-image", "two words"], "--runtime-image"),
        (["--picker-cluster-role", ""], "--picker-cluster-role"),
        (["--picker-cluster-role", "a/b"], "--picker-cluster-role"),
    ],
)
def test_bad_flags_name_the_flag(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    assert flag in capsys.readouterr().err


def test_defaults() -> None:
    args = parse_args([])
    assert (args.namespace, args.metrics_port, args.workers, args.resync_seconds) == (None, 8080, 8, 300.0)
    assert args.runtime_image == DEFAULT_RUNTIME_IMAGE
    assert args.picker_cluster_role is None  # each endpoint picker gets a Role of its own
