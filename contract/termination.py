"""The termination message: the runner's last word to the controller.

Kubernetes copies the file at the container's ``terminationMessagePath``
(``/dev/termination-log``; ``TERMINATION_LOG_PATH`` or the node agent's root
override it, see :mod:`contract.paths`) into the pod status, cut at 4096 bytes.
The runner writes:

- on success, compact JSON: ``{"rows": 150, "predictions": 150, "durationSeconds": 1.234}``;
  a streaming run (:mod:`runner.streaming`) adds ``resumedRows`` (rows an earlier
  pod stored, counted in ``rows`` and ``predictions``), ``pages``, ``chunks`` and
  ``duplicates`` (predictions the storage already had);
- on failure, one line: ``<stage>: <reason>``, e.g.
  ``output: storage answered 200 with a non-JSON body: Traceback ...``.

Both are redacted and cut below the limit (:func:`cut`, on a UTF-8 boundary)
by the runner (:mod:`runner.termination`), so the controller never receives
half a character or a credential.

:class:`RunResult` is the one definition of the success message: its keys,
:func:`success_message` that writes it, :func:`parse_success` that the
controller reads it with, and :func:`total` that adds up the shards of an
Indexed Job. The controller also uses it as the schema of an InferenceRun's
``status.result`` (``controller.api``), which carries the same keys.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

import orjson
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel
from pydantic.dataclasses import dataclass

MAX_BYTES = 4095
_ELLIPSIS = "…"


Count = Annotated[int, Field(ge=0)]


# A pydantic dataclass: positional construction for the runner, validation and
# camelCase keys (rows, durationSeconds, resumedRows) for the wire and the status.
# Keys it does not know are ignored (the dataclass default), so a newer runner's
# message still parses; dumps pass by_alias.
@dataclass(frozen=True, config=ConfigDict(alias_generator=to_camel, validate_by_name=True))
class RunResult:
    rows: Count
    predictions: Count
    duration_seconds: Annotated[float, Field(ge=0)]
    # A streaming run's counts (runner/streaming.py); absent otherwise.
    resumed_rows: Count | None = None
    pages: Count | None = None
    chunks: Count | None = None
    duplicates: Count | None = None


_RESULT = TypeAdapter(RunResult)


def success_message(result: RunResult) -> str:
    message: dict[str, Any] = _RESULT.dump_python(result, by_alias=True, exclude_none=True)
    message["durationSeconds"] = round(result.duration_seconds, 3)
    return orjson.dumps(message).decode()


def parse_success(message: str) -> RunResult | None:
    """The :class:`RunResult` a success message holds, or None if it holds none."""
    try:
        return _RESULT.validate_json(message)
    except ValidationError:
        return None


def total(parts: Iterable[RunResult]) -> RunResult | None:
    """The result of a run whose shards reported ``parts``: counts added, the longest duration.

    A streaming count (``resumedRows``...) is the sum of the shards that report
    it, absent if none does. None when there are no parts.
    """
    parts = list(parts)
    if not parts:
        return None
    # Counts add up; the duration does not: shards run side by side, so the run
    # takes as long as its slowest shard.
    return RunResult(
        rows=sum(part.rows for part in parts),
        predictions=sum(part.predictions for part in parts),
        duration_seconds=max(part.duration_seconds for part in parts),
        resumed_rows=_sum_reported(part.resumed_rows for part in parts),
        pages=_sum_reported(part.pages for part in parts),
        chunks=_sum_reported(part.chunks for part in parts),
        duplicates=_sum_reported(part.duplicates for part in parts),
    )


def _sum_reported(counts: Iterable[int | None]) -> int | None:
    reported = [count for count in counts if count is not None]
    return sum(reported) if reported else None


def cut(text: str, limit: int = MAX_BYTES) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, marked with an ellipsis when cut."""
    encoded = text.encode()
    if len(encoded) <= limit:
        return text
    room = limit - len(_ELLIPSIS.encode())
    return encoded[:room].decode(errors="ignore") + _ELLIPSIS
