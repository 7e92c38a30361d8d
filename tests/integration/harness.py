"""The operator as a subprocess (as in production) for integration tests, on e2e.lab.processes."""

from __future__ import annotations

from pathlib import Path

from e2e.lab import processes
from e2e.lab.processes import wait_until
from tests.repo import REPO

__all__ = ["MANAGEMENT_KEY_SECRET", "RESYNC_SECONDS", "OperatorProcess", "wait_until"]

RESYNC_SECONDS = 5
# Where the operator keeps its management key, as the chart has it in the release's namespace: every start
# of the operator signs with the same key (operator/kube/management.py).
MANAGEMENT_KEY_SECRET = ("default", "pagoda-management-key")


class OperatorProcess(processes.OperatorProcess):
    """`pagoda-operator` run from the repository root; each start (tests restart it) logs to its own
    operator-N.log in `workdir`."""

    def __init__(
        self,
        kubeconfig: Path,
        workdir: Path,
        resync_seconds: float = RESYNC_SECONDS,
        workers: int = 4,
        leader_elect: str | None = None,
    ) -> None:
        super().__init__(
            kubeconfig,
            workdir / "operator-0.log",
            resync_seconds=resync_seconds,
            workers=workers,
            cwd=REPO,
            management_key_secret="/".join(MANAGEMENT_KEY_SECRET),
            leader_elect=leader_elect,
        )
        self.workdir = workdir
        self.starts = 0

    def start(self) -> OperatorProcess:
        self.log_path = self.workdir / f"operator-{self.starts}.log"
        self.starts += 1
        return super().start()

    def writes(self) -> float:
        return self.total("pagoda_operator_api_writes_total")

    def resyncs(self) -> int:
        return self.log().count("Queued resync")
