"""How a storage request goes: one HTTP call, its retries, and what its answer means.

The transport side of the HTTP providers (their configuration is
:mod:`runner.storage.endpoint`). :func:`send` makes a run's requests and
:func:`probe_request` a check's; both quote a failure the same way
(:func:`runner.httputil.unanswered`, :func:`runner.httputil.server_message`).
:func:`rows_from`, :func:`page_from`, :func:`check_stored`, :func:`stored_from`
and :func:`next_from` read an answer, and tell a transient failure
(:class:`~runner.storage.base.StorageError`) from a permanent one
(:class:`~runner.storage.base.StorageRejected`) as :mod:`runner.storage.base` says.

Retries (:func:`send`): reading the input is retried on connection errors,
timeouts, 5xx, 429 and 408 (a read has no side effect). Writing the output is
retried only when the connection could not be opened, since nothing reached the
server; a write that may have arrived is never repeated, so it is never stored
twice. An error answer is quoted by its own words, without the request's data
(:func:`runner.httputil.server_message`).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import orjson

from runner import decoding
from runner.httputil import (
    RETRYABLE_4XX,
    retry_after_seconds,
    server_message,
    strip_data,
    trim,
    unanswered,
)
from runner.retry import GaveUp, RetryPolicy, Transient, call_with_retries, log_retries
from runner.storage.base import Page, Paging, StorageContext, StorageError, StorageRejected, Stored
from runner.storage.endpoint import Endpoint

DEFAULT_TIMEOUT_SECONDS = 300.0
PROBE_TIMEOUT_SECONDS = 10.0
STORAGE_RETRY = RetryPolicy(max_retries=3, initial_backoff=0.2, max_backoff=5.0)
BODY_IN_MESSAGE = 500
# Which requests are retried on a transient failure: all, or only those never sent.
Retry = Literal["all", "unsent"]


@dataclass(frozen=True)
class Answer:
    method: str
    url: str
    status: int
    content_type: str
    body: bytes

    @property
    def what(self) -> str:
        return f"{self.method} {self.url}"

    def text(self, limit: int = BODY_IN_MESSAGE) -> str:
        return trim(strip_data(self.body.decode(errors="replace")), limit) or "(empty body)"

    def json(self) -> Any:
        # Pages of rows: decoded without setting off the collector (runner.decoding).
        return decoding.loads(self.body)


class _Unsent(Transient):
    """The connection could not be opened: nothing reached the server."""


def _request_headers(
    endpoint: Endpoint, defaults: Mapping[str, str], headers: Mapping[str, str]
) -> dict[str, str]:
    """``defaults``, a fresh trace id, the contract's ``headers``, then the credentials."""
    merged = {**defaults, "X-Krateo-TraceId": uuid.uuid4().hex[:10], **headers}
    if endpoint.authorization:
        merged["Authorization"] = endpoint.authorization
    return merged


async def _exchange(
    ctx: StorageContext,
    endpoint: Endpoint,
    method: str,
    url: str,
    headers: Mapping[str, str],
    time_limit: float,
    *,
    body: bytes | None = None,
    params: Mapping[str, str] | None = None,
    allow_redirects: bool = True,
) -> tuple[Answer, str | None]:
    """One HTTP request and its whole answer, with the answer's ``Retry-After``.

    Raises what aiohttp raises; the callers say what a failure means to them.
    """
    async with ctx.session.request(
        method,
        url,
        data=body,
        params=params,
        headers=headers,
        ssl=endpoint.ssl,
        proxy=endpoint.proxy,
        allow_redirects=allow_redirects,
        timeout=aiohttp.ClientTimeout(total=time_limit),
    ) as response:
        answer = Answer(
            method=method,
            url=url,
            status=response.status,
            content_type=response.headers.get("Content-Type", ""),
            body=await response.read(),
        )
        return answer, response.headers.get("Retry-After")


async def send(
    ctx: StorageContext,
    endpoint: Endpoint,
    *,
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes | None,
    params: Mapping[str, str] | None = None,
    time_limit: float = DEFAULT_TIMEOUT_SECONDS,
    retry: Retry,
) -> Answer:
    """One storage request (retried as the module docstring says); any non-2xx is an error."""
    url = endpoint.url_for(path)
    what = f"{method} {url}"
    request_headers = _request_headers(
        endpoint, {"Content-Type": "application/json", "Accept": "application/json"}, headers
    )

    async def attempt(attempt_timeout: float) -> Answer:
        # The headers include Authorization: the log's redaction hides it by key.
        ctx.log.debug("storage request", method=method, url=url, headers=request_headers)
        try:
            answer, retry_after = await _exchange(
                ctx,
                endpoint,
                method,
                url,
                request_headers,
                attempt_timeout,
                body=body,
                params=params,
            )
        except aiohttp.ClientSSLError as error:
            # A certificate problem does not go away by asking again.
            raise StorageError(_unanswered(what, error, attempt_timeout)) from None
        except aiohttp.ClientConnectorError as error:
            raise _Unsent(_unanswered(what, error, attempt_timeout)) from None
        except (aiohttp.ClientError, ConnectionError, TimeoutError) as error:
            raise _transient_or_final(_unanswered(what, error, attempt_timeout), retry) from None
        ctx.log.debug(
            "storage answered",
            url=url,
            status=answer.status,
            contentType=answer.content_type,
            bytes=len(answer.body),
        )
        if 200 <= answer.status < 300:
            return answer
        failure = f"{what} answered {answer.status}: {server_message(answer.body)}"
        if answer.status >= 500 or answer.status in RETRYABLE_4XX:
            hint = retry_after_seconds(retry_after)
            raise _transient_or_final(failure, retry, hint)
        if 400 <= answer.status < 500:
            raise StorageRejected(failure)
        raise StorageError(failure)

    try:
        return await call_with_retries(
            attempt,
            policy=STORAGE_RETRY,
            deadline=ctx.deadline,
            request_timeout=time_limit,
            on_retry=log_retries(ctx.log, "storage request failed, retrying"),
        )
    except GaveUp as error:
        raise StorageError(error.message) from None


async def probe_request(
    ctx: StorageContext,
    endpoint: Endpoint,
    *,
    method: Literal["GET", "HEAD"],
    path: str,
    headers: Mapping[str, str],
    time_limit: float = PROBE_TIMEOUT_SECONDS,
) -> Answer:
    """One request of ``python -m runner --check``: a read that moves no data, never retried.

    A check is a snapshot: it asks once and says what it saw. No connection, a
    timeout, TLS, a 5xx, 408 or 429 is :class:`StorageError` (exit 3/5); a 401 or
    403 is :class:`StorageRejected` (exit 6/8: the credentials are refused). Any
    other answer is returned, whatever its status: what it proves is the
    provider's to say.
    """
    url = endpoint.url_for(path)
    what = f"{method} {url}"
    request_headers = _request_headers(endpoint, {"Accept": "application/json"}, headers)
    limit = max(ctx.deadline.cap(time_limit), 0.001)
    try:
        answer, _ = await _exchange(
            ctx, endpoint, method, url, request_headers, limit, allow_redirects=False
        )
    except (aiohttp.ClientError, ConnectionError, TimeoutError) as error:
        raise StorageError(_unanswered(what, error, limit)) from None
    if answer.status in (401, 403):
        raise StorageRejected(
            f"{what} answered {answer.status}: {server_message(answer.body)} "
            "(the credentials are refused)"
        )
    if answer.status >= 500 or answer.status in RETRYABLE_4XX:
        raise StorageError(f"{what} answered {answer.status}: {server_message(answer.body)}")
    return answer


def _unanswered(what: str, error: BaseException, limit: float) -> str:
    """:func:`runner.httputil.unanswered`, but a storage says when it could not connect."""
    if isinstance(error, aiohttp.ClientConnectorError) and not isinstance(
        error, aiohttp.ClientSSLError
    ):
        return f"{what}: cannot connect: {error.os_error or error}"
    return unanswered(what, error, limit)


def _transient_or_final(message: str, retry: Retry, hint: float | None = None) -> Exception:
    return Transient(message, retry_after=hint) if retry == "all" else StorageError(message)


def _field(value: Any, path: str) -> Any:
    for part in path.split(".") if path else ():
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _json(answer: Answer) -> Any:
    """The answer's JSON; a body that is not JSON is :class:`StorageRejected`."""
    try:
        return answer.json()
    except orjson.JSONDecodeError:
        raise StorageRejected(
            f"{answer.what} answered {answer.status} with a body that is not JSON: {answer.text()}"
        ) from None


def rows_from(answer: Answer, field: str) -> list[Any]:
    """The rows list at ``field`` (dotted path; empty = the body itself) of a JSON answer.

    Anything else is :class:`StorageRejected`: asking again gets the same answer
    (finops-database-handler's error text for a missing table, say).
    """
    return _rows_in(answer, _json(answer), field)


def _rows_in(answer: Answer, body: Any, field: str) -> list[Any]:
    """:func:`rows_from` on the answer's ``body``, already decoded."""
    value = body
    for part in field.split(".") if field else ():
        if not isinstance(value, dict) or part not in value:
            raise StorageRejected(
                f"{answer.what} answered {answer.status} without a {field!r} field: {answer.text()}"
            )
        value = value[part]
    if value is None:
        return []
    if not isinstance(value, list):
        raise StorageRejected(
            f"{answer.what}: {field or 'the body'} is a {type(value).__name__}, not a list of rows"
        )
    return value


def page_from(answer: Answer, rows_field: str, paging: Paging, offset: int) -> Page:
    """One page: its rows and the shard's total, from one decode of the answer."""
    body = _json(answer)
    rows = _rows_in(answer, body, rows_field)
    total = _field(body, paging.total_field)
    if not isinstance(total, int) or isinstance(total, bool) or total < 0:
        total = None
    return Page(offset=offset, rows=rows, total=total)


def check_stored(answer: Answer) -> None:
    """A store succeeded only if the 2xx body is empty or JSON (never an error text).

    An error text is :class:`StorageRejected`: finops-database-handler answers a
    failed notebook (a bad table name, a missing argument) with 200 and the
    exception, and the same write fails the same way again.
    """
    if not answer.body.strip():
        return
    with contextlib.suppress(orjson.JSONDecodeError):
        answer.json()
        return
    raise StorageRejected(
        f"{answer.what} answered {answer.status} with an error instead of storing: {answer.text()}"
    )


def stored_from(answer: Answer) -> Stored:
    """``{"stored": n, "duplicates": m}`` when the storage answered them (optional)."""
    try:
        value = answer.json() if answer.body.strip() else None
    except orjson.JSONDecodeError:
        return Stored()
    if not isinstance(value, dict):
        return Stored()
    counts = [value.get(k) for k in ("stored", "duplicates")]
    stored, duplicates = (
        c if isinstance(c, int) and not isinstance(c, bool) else None for c in counts
    )
    return Stored(stored=stored, duplicates=duplicates)


def next_from(answer: Answer) -> int:
    """The ``next`` row number of a resume answer ``{"stored": n, "next": k}``."""
    value = _json(answer)
    following = value.get("next") if isinstance(value, dict) else None
    if not isinstance(following, int) or isinstance(following, bool) or following < 0:
        raise StorageRejected(
            f"{answer.what} answered {answer.status} without a 'next' row number: {answer.text()}"
        )
    return following
