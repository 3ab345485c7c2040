"""Why an object cannot be used, as the ``(reason, message)`` of a condition.

A failed check is a ``pydantic.ValidationError`` (the models of
``controller.api``) or an :class:`InvalidObject` (a problem found between
objects, e.g. a run and its config); :func:`describe_invalid` turns either
into the reason and message a condition shows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from controller.api import MAX_MESSAGE_LENGTH, REASON_INVALID_SPEC


class InvalidObject(ValueError):
    """A problem found outside pydantic (e.g. between a run and its config)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


_REASON_RE = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_MAX_ERRORS_SHOWN = 5


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _echo(error: Mapping[str, Any], where: str) -> str:
    # Echo a short scalar input so the message says what was wrong, except
    # under storage, whose values are never repeated (they may be secrets).
    value = error.get("input")
    kind = error["type"]
    # Our own errors already quote what matters.
    if kind == "missing" or kind[:1].isupper() or "storage" in where.split(".")[:2]:
        return ""
    if isinstance(value, bool | int | float) or (isinstance(value, str) and len(value) <= 64):
        return f" (got {value!r})"
    return ""


def describe_invalid(exc: ValidationError | InvalidObject) -> tuple[str, str]:
    """``(reason, message)`` for a condition saying why an object cannot be used.

    The reason is the first error's own (``InvalidSchedule``, ``MissingModelUrl``,
    …) or ``InvalidSpec``; the message names each field, e.g.
    ``spec.timeoutSeconds: Input should be greater than or equal to 0 (got -1)``.
    """
    if isinstance(exc, InvalidObject):
        return exc.reason, exc.message[:MAX_MESSAGE_LENGTH]
    errors = exc.errors(include_url=False)
    if not errors:
        return REASON_INVALID_SPEC, str(exc)[:MAX_MESSAGE_LENGTH]
    first = errors[0]["type"]
    reason = first if first[:1].isupper() and _REASON_RE.match(first) else REASON_INVALID_SPEC
    parts = []
    for error in errors[:_MAX_ERRORS_SHOWN]:
        where = _loc(tuple(error["loc"])) or exc.title
        parts.append(f"{where}: {error['msg']}{_echo(error, where)}")
    if len(errors) > _MAX_ERRORS_SHOWN:
        parts.append(f"and {len(errors) - _MAX_ERRORS_SHOWN} more")
    return reason, "; ".join(parts)[:MAX_MESSAGE_LENGTH]
