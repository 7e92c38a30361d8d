"""Why vLLM's engine failed to start, carried from its process to the runtime's.

vLLM builds the engine in child processes (EngineCore, and a worker per GPU when tensor-parallel). When one
of them fails to start (the KV cache cannot hold maxModelLen, the weights do not fit, ...) it logs the
exception with "EngineCore failed to start." / "WorkerProc failed to start." and exits; the runtime's
process only gets "Engine core initialization failed. See root cause above." To name the root cause in the
termination message, Pagoda registers `register` as a vLLM general plugin (entry point group
`vllm.general_plugins`, loaded by vLLM in every one of its processes): when the runtime has set
`PAGODA_ENGINE_FAILURE_PATH`, a logging handler writes the first start-up exception there as JSON, and the
runtime reads it back after the engine failed. No vLLM code is patched; without the plugin (e.g. VLLM_PLUGINS
excludes it) the runtime still exits with a generic reason.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPORT_ENV = "PAGODA_ENGINE_FAILURE_PATH"
# The messages vLLM logs (with the exception) when a process of the engine fails before it is ready.
START_FAILURE_MESSAGES = frozenset({"EngineCore failed to start.", "WorkerProc failed to start."})
MAX_MESSAGE_CHARS = 8192


@dataclass(frozen=True)
class EngineFailure:
    """The exception a process of the engine failed to start with: its class name and its text."""

    type: str
    message: str


class FileReport(logging.Handler):
    """A handler of vLLM's logger that reports to the runtime through the file `path` (the handlers Pagoda's
    vLLM plugins add; `LEVEL`: the records it sees)."""

    LEVEL = logging.INFO

    def __init__(self, path: str) -> None:
        super().__init__(level=self.LEVEL)
        self.path = path


class StartFailureReporter(FileReport):
    """Writes the first start-up failure that vLLM logs to `path` (exclusive create: the root cause, the
    process that failed first, wins over the ones that fail because of it)."""

    LEVEL = logging.ERROR

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg not in START_FAILURE_MESSAGES or not record.exc_info or record.exc_info[1] is None:
            return
        write_report(self.path, record.exc_info[1])


def register() -> None:
    """The vLLM plugin entry point: runs in each vLLM process, possibly more than once."""
    add_vllm_handler(REPORT_ENV, StartFailureReporter)


def add_vllm_handler(env: str, handler: type[FileReport]) -> None:
    """What Pagoda's vLLM plugins do in each vLLM process: when the runtime named a file in `env`, add a
    `handler` of it to vLLM's logger, once (vLLM may load its plugins more than once in a process)."""
    path = os.environ.get(env)
    if not path:
        return
    logger = logging.getLogger("vllm")
    if not any(isinstance(existing, handler) for existing in logger.handlers):
        logger.addHandler(handler(path))


def write_report(path: str, exc: BaseException) -> None:
    report = {"type": type(exc).__name__, "message": str(exc)[:MAX_MESSAGE_CHARS]}
    try:
        with open(path, "x", encoding="utf-8") as out:
            json.dump(report, out)
    except OSError:
        pass  # an earlier failure was reported already, or nowhere to write: the log still has it


def prepare_report() -> str:
    """A fresh report path for this runtime process, exported to the engine processes it will start."""
    return prepare_file(REPORT_ENV, "pagoda-engine-failure", ".json")


def prepare_file(env: str, stem: str, suffix: str) -> str:
    """A fresh file path for this runtime process's reports (`stem-<pid><suffix>` in the temporary folder,
    removed if a former process of the same pid left it), exported in `env` to the engine processes it
    will start."""
    path = str(Path(tempfile.gettempdir()) / f"{stem}-{os.getpid()}{suffix}")
    Path(path).unlink(missing_ok=True)
    os.environ[env] = path
    return path


def read_report(path: str) -> EngineFailure | None:
    """The reported failure, if an engine process wrote one; the file is removed."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        Path(path).unlink(missing_ok=True)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return EngineFailure(str(data.get("type") or "Exception"), str(data.get("message") or ""))
