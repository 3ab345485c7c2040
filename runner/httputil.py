"""Small HTTP helpers shared by the model client and the storage providers.

**What another server said.** Its words end up in the termination message, so in
the run's status, its Events and ``kubectl get -o wide``. They are quoted
redacted (:mod:`runner.redact`), on one line, short, and without the request's
data: model servers' 422 answers (KServe's and MLServer's FastAPI validation
errors) echo the whole request, every row of the batch included.
:func:`server_message` keeps the server's own words:

1. a JSON error body is reduced to its ``error``, ``detail`` or ``message``
   field; a FastAPI/pydantic validation error list to ``loc: msg`` pairs (its
   ``input`` and ``ctx`` echo the request and are dropped);
2. a Python traceback is reduced to its last line, the exception itself;
3. echoed data is cut out (:func:`strip_data`): a bracketed structure longer than
   :data:`STRUCTURE_LIMIT` characters becomes ``[…]``/``{…}`` (one left open, as
   a truncated echo is, ends the text), pydantic's ``input_value=...`` goes, and
   so does a run of :data:`NUMBER_RUN` or more numbers;
4. what is left is one line of at most :data:`SERVER_MESSAGE_LIMIT` characters.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
import orjson

from runner.redact import REDACTOR

MESSAGE_LIMIT = 500
# The 4xx answers that another attempt may not get: Request Timeout, Too Many Requests.
RETRYABLE_4XX = frozenset({408, 429})
SERVER_MESSAGE_LIMIT = 300
# A bracketed structure longer than this, inside an error text, is data, not words.
STRUCTURE_LIMIT = 64
# This many numbers in a row, bracketed or not, are data too.
NUMBER_RUN = 12
# Only the start of a huge body that is not JSON is looked at: its words come first.
SCAN_LIMIT = 1 << 20
# Validation errors quoted at most (FastAPI reports one per field, per union member).
MAX_ERRORS = 4

_MESSAGE_KEYS = ("error", "detail", "message")
_NESTED_MESSAGE_KEYS = ("message", "error", "detail", "reason", "description")
_INPUT_VALUE = re.compile(r",?[ \t]*\binput_value=.*?(?=,[ \t]*input_type=|$)", re.MULTILINE)
# Atomic groups: a number or a separator, once matched, is never split to retry.
_NUMBER = r"(?>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"
_NUMBERS = re.compile(rf"(?<![\w.])(?:{_NUMBER}(?>[\s,;]+)){{{NUMBER_RUN - 1},}}{_NUMBER}(?![\w.])")
_OPENING = re.compile(r"[\[{]")
_CLOSE = {"[": "]", "{": "}"}


def trim(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` redacted, on one line, at most ``limit`` characters.

    A Python traceback (what finops-database-handler returns when a notebook
    fails, and some model servers on a 500) is reduced to its last line, the
    exception itself: its first lines would only show file names. Redaction
    comes first, so that a cut cannot leave half a credential unrecognised.
    """
    one_line = " ".join(last_exception(REDACTOR.redact(text)).split())
    return one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"


def last_exception(text: str) -> str:
    """The last line of a Python traceback; any other text unchanged."""
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and any(line.startswith("Traceback (most recent call last)") for line in lines):
        return lines[-1]
    return text


def unanswered(what: str, error: BaseException, limit: float) -> str:
    """Why the request ``what`` got no answer: TLS, a transport ``error``, or ``limit`` passed.

    ``error`` is what ``aiohttp`` raised: a ``ClientError``, a ``ConnectionError``
    or a ``TimeoutError``. aiohttp's own timeouts are also ``ClientError``s, and
    say so by their name.
    """
    if isinstance(error, aiohttp.ClientSSLError):
        return f"{what}: TLS failed: {trim(str(error))}"
    if isinstance(error, aiohttp.ClientError | ConnectionError):
        return f"{what} failed: {type(error).__name__}: {trim(str(error))}"
    return f"{what} timed out after {limit:.1f}s"


def server_message(body: bytes, limit: int = SERVER_MESSAGE_LIMIT) -> str:
    """What a server said in an error answer, without the request's data (see above)."""
    text = body[:SCAN_LIMIT].decode(errors="replace")
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        for key in _MESSAGE_KEYS:
            if parsed.get(key) not in (None, "", [], {}):
                text = _words(parsed[key])
                break
    text = last_exception(REDACTOR.redact(text))
    return trim(strip_data(text), limit) or "(empty body)"


def _words(value: Any, depth: int = 0) -> str:
    """An error field as text: strings as they are, validation errors as ``loc: msg``."""
    if isinstance(value, str):
        return value
    if depth > 4:
        return "…"
    if isinstance(value, list):
        parts = [_words(item, depth + 1) for item in value[:MAX_ERRORS]]
        if len(value) > MAX_ERRORS:
            parts.append(f"{len(value) - MAX_ERRORS} more")
        return "; ".join(part for part in parts if part)
    if isinstance(value, dict):
        if "msg" in value:
            # FastAPI/pydantic: {"type", "loc", "msg", "input", "ctx"}; input is the request.
            loc = value.get("loc")
            where = ".".join(str(part) for part in loc) if isinstance(loc, list) else ""
            what = _words(value["msg"], depth + 1)
            return f"{where}: {what}" if where else what
        for key in _NESTED_MESSAGE_KEYS:
            if value.get(key) not in (None, "", [], {}):
                return _words(value[key], depth + 1)
    return orjson.dumps(value).decode()


def strip_data(text: str) -> str:
    """``text`` without what looks like echoed request data (see the module docstring)."""
    text = _INPUT_VALUE.sub("", text)
    text = _collapse_structures(text)
    return _NUMBERS.sub("…", text)


def _collapse_structures(text: str) -> str:
    out: list[str] = []
    position = 0
    while True:
        start = _next_opening(text, position)
        if start < 0:
            out.append(text[position:])
            break
        out.append(text[position:start])
        end = _matching_close(text, start)
        if end < 0:
            # Never closed: a structure cut off by the server (or by SCAN_LIMIT).
            rest = text[start:]
            out.append(rest if len(rest) <= STRUCTURE_LIMIT else f"{text[start]}…")
            break
        if end + 1 - start > STRUCTURE_LIMIT:
            out.append(f"{text[start]}…{_CLOSE[text[start]]}")
        else:
            out.append(text[start : end + 1])
        position = end + 1
    return "".join(out)


def _next_opening(text: str, position: int) -> int:
    found = _OPENING.search(text, position)
    return found.start() if found else -1


def _matching_close(text: str, start: int) -> int:
    """Index of the bracket closing the one at ``start`` (any kind nests), or -1."""
    depth = 0
    for index in range(start, len(text)):
        char = text[index]
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth == 0:
                return index
    return -1


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
