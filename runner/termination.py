"""The termination message: the runner's last word to the controller.

Kubernetes copies the file at the container's ``terminationMessagePath``
(``/dev/termination-log``; ``TERMINATION_LOG_PATH`` or the node agent's root
override it, see :mod:`runner.paths`) into the pod status, cut at 4096 bytes.
The runner writes:

- on success, compact JSON: ``{"rows": 150, "predictions": 150, "durationSeconds": 1.234}``;
  a streaming run (:mod:`runner.streaming`) adds ``resumedRows`` (rows an earlier
  pod stored, counted in ``rows`` and ``predictions``), ``pages``, ``chunks`` and
  ``duplicates`` (predictions the storage already had);
- on failure, one line: ``<stage>: <reason>``, e.g.
  ``output: storage answered 200 with a non-JSON body: Traceback ...``.

Both are redacted and cut below the limit here, on a UTF-8 boundary, so the
controller never receives half a character or a credential.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from runner.redact import REDACTOR, Redactor

MAX_BYTES = 4095
_ELLIPSIS = "…"


@dataclass(frozen=True)
class RunResult:
    rows: int
    predictions: int
    duration_seconds: float
    # A streaming run's counts (runner/streaming.py); absent otherwise.
    resumed_rows: int | None = None
    pages: int | None = None
    chunks: int | None = None
    duplicates: int | None = None


def success_message(result: RunResult) -> str:
    message: dict[str, Any] = {
        "rows": result.rows,
        "predictions": result.predictions,
        "durationSeconds": round(result.duration_seconds, 3),
    }
    if result.resumed_rows is not None:
        message.update(
            resumedRows=result.resumed_rows,
            pages=result.pages,
            chunks=result.chunks,
            duplicates=result.duplicates,
        )
    return orjson.dumps(message).decode()


def failure_message(stage: str, reason: str, redactor: Redactor = REDACTOR) -> str:
    one_line = " ".join(redactor.redact(reason).split())
    return cut(f"{stage}: {one_line}" if one_line else stage)


def cut(text: str, limit: int = MAX_BYTES) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, marked with an ellipsis when cut."""
    encoded = text.encode()
    if len(encoded) <= limit:
        return text
    room = limit - len(_ELLIPSIS.encode())
    return encoded[:room].decode(errors="ignore") + _ELLIPSIS


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
