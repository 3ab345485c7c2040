"""The runner's live progress lines: their format, and their parser for the controller.

**Format.** While it predicts, the runner prints one JSON object per line on
stdout, at most every :data:`INTERVAL_SECONDS` and once more at the end of the
inference stage::

    {"event": "progress", "rowsDone": 2048, "rowsTotal": 100000, ...}

Other keys (``timestamp``, ``level``, ``shardIndex``; a streaming run's
``rowsResumed``, ``pages``, ``chunks``) may appear and are ignored by the parser.
``rowsTotal`` is the number of rows this pod handles (its shard, when the run is
sharded); in a streaming run ``rowsDone`` includes the rows an earlier pod
stored, and ``rowsTotal`` is what the storage says the shard holds, or the rows
seen so far when it does not say.

**Reading it.** The controller reads the tail of the runner pod's log
(``pods/log`` with ``tailLines``) while the pod runs and passes it to
:func:`last_progress`, which returns the newest valid progress line. Lines that
are not JSON, or not progress, are skipped, so the log may contain anything else,
and a line prefix such as the RFC 3339 timestamp of ``timestamps=true`` is
tolerated. No extra permission is needed by the runner for this channel; the
final numbers also travel in the termination message.

The runner writes these lines with :class:`runner.progress.ProgressTracker`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

EVENT = "progress"
INTERVAL_SECONDS = 2.0


@dataclass(frozen=True)
class Progress:
    rows_done: int
    rows_total: int

    @property
    def fraction(self) -> float:
        return 1.0 if self.rows_total == 0 else min(1.0, self.rows_done / self.rows_total)

    def fields(self) -> dict[str, Any]:
        """The keys of a progress line, besides ``"event": "progress"``."""
        return {"rowsDone": self.rows_done, "rowsTotal": self.rows_total}


def parse_line(line: str) -> Progress | None:
    start = line.find("{")
    if start < 0:
        return None
    try:
        obj = orjson.loads(line[start:])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or obj.get("event") != EVENT:
        return None
    done, total = _count(obj.get("rowsDone")), _count(obj.get("rowsTotal"))
    if done is None or total is None:
        return None
    return Progress(rows_done=done, rows_total=total)


def _count(value: Any) -> int | None:
    # bool is an int subclass; a row count is never a bool.
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def last_progress(log_text: str) -> Progress | None:
    """The newest progress line in ``log_text`` (a pod log tail), or None."""
    for line in reversed(log_text.splitlines()):
        if EVENT not in line:
            continue
        progress = parse_line(line)
        if progress is not None:
            return progress
    return None
