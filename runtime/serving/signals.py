"""SIGTERM and SIGINT before the runtime's event loop takes them over.

In its container the runtime is PID 1, and the kernel drops a signal PID 1 has no handler for. Importing
torch and vLLM takes tens of seconds on a busy node: a pod deleted then (a scale-down of a replica still
starting) would never see its SIGTERM, wait out its whole grace period and be SIGKILLed (exit 137). So
`serve` records these signals from its first line, and the runtime stops at once when it starts, without
loading the engine (lifecycle.Runtime.run).
"""

from __future__ import annotations

import signal
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_received: list[str] = []


def _record(signum: int, _frame: FrameType | None) -> None:
    _received.append(signal.Signals(signum).name)


def record_early() -> None:
    """From now until the event loop installs its own handlers, a stop signal is remembered."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _record)


def received_early() -> str | None:
    """The name of the first stop signal recorded, if any came."""
    return _received[0] if _received else None
