"""structlog set-up: JSON lines on stdout, redacted before they are rendered."""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import orjson
import structlog

from runner.redact import REDACTOR, Redactor


def _render(_logger: Any, _method: str, event_dict: Any) -> str:
    return orjson.dumps(event_dict, default=str).decode()


def configure(
    level: str = "info", stream: TextIO | None = None, redactor: Redactor = REDACTOR
) -> None:
    """Configure structlog for the runner process (idempotent; last call wins)."""
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}")
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            # Last before rendering, so nothing added above escapes it.
            redactor,
            _render,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        # Resolve the stream at each write, so a test capturing stdout sees the lines.
        logger_factory=structlog.PrintLoggerFactory(stream) if stream else _StdoutFactory(),
        cache_logger_on_first_use=False,
    )


class _StdoutFactory:
    def __call__(self, *_args: Any) -> structlog.PrintLogger:
        return structlog.PrintLogger(sys.stdout)


def get_logger(**context: Any) -> Any:
    return structlog.get_logger("runner").bind(**context)
