"""Small HTTP helpers shared by the model client and the storage providers."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

MESSAGE_LIMIT = 500


def trim(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` on one line, at most ``limit`` characters.

    A Python traceback (what finops-database-handler returns when a notebook
    fails, and some model servers on a 500) is reduced to its last line, the
    exception itself: its first lines would only show file names.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and any(line.startswith("Traceback (most recent call last)") for line in lines):
        text = lines[-1]
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds: delta-seconds or an HTTP date; None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
