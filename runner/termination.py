"""Writing the termination message (:mod:`contract.termination`): redacted, cut, never fatal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contract.termination import cut
from runner.redact import REDACTOR, Redactor


def failure_message(stage: str, reason: str, redactor: Redactor = REDACTOR) -> str:
    one_line = " ".join(redactor.redact(reason).split())
    return cut(f"{stage}: {one_line}" if one_line else stage)


def write(path: Path, message: str) -> None:
    path.write_text(cut(message), encoding="utf-8")


def report(log: Any, path: Path, message: str) -> None:
    """Write ``message`` (redacted) to the termination log; a write failure is only logged."""
    try:
        write(path, REDACTOR.redact(message))
    except OSError as error:
        log.warning("cannot write the termination message", path=str(path), error=error.strerror)


def report_failure(log: Any, path: Path, what: str, stage: str, reason: str, code: int) -> int:
    """Log and write a ``<stage>: <reason>`` failure of a run or a check; its exit code."""
    message = failure_message(stage, reason, REDACTOR)
    log.error(f"{what} failed", stage=stage, exitCode=int(code), reason=message)
    report(log, path, message)
    return int(code)
