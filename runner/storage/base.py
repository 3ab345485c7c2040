"""What every storage provider shares: the provider protocol, endpoints, HTTP calls.

A provider is a module of this package exposing
``from_settings(settings, role, parameters) -> StorageProvider`` (see
:mod:`runner.storage`). It turns its contract entry into a provider object,
or raises :class:`ValueError` (the contract is wrong: exit 2). At run time it
raises :class:`StorageError` when another attempt may succeed (exit 3 for the
input, 5 for the output), and :class:`StorageRejected` when none can (exit 6 for
the input, 8 for the output; the Job is not retried): the storage answered a
4xx other than 408/429, or a 2xx that is not what it should be (not rows, an
error text instead of storing). :func:`send`, :func:`rows_from` and
:func:`check_stored` make that distinction for every provider.

Both HTTP providers send the same output body: ``job_uid``, ``pod_uid``,
``predictions`` and the run's parameters (:func:`output_body`); no parameter may
reuse those names (:func:`check_parameters`, enforced before any I/O).

Retries (:func:`send`): reading the input is retried on connection errors,
timeouts, 5xx, 429 and 408 (a read has no side effect). Writing the output is
retried only when the connection could not be opened, since nothing reached the
server; a write that may have arrived is never repeated, so it is never stored
twice. An error answer is quoted by its own words, without the request's data
(:func:`runner.httputil.server_message`).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import ssl
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import unquote, urlsplit, urlunsplit

import aiohttp
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from runner.batching import Deadline, GaveUp, RetryPolicy, Transient, call_with_retries
from runner.httputil import RETRYABLE_4XX, retry_after_seconds, server_message, strip_data, trim
from runner.secrets import SecretReader

Role = Literal["input", "output"]
RESERVED_OUTPUT_KEYS = ("job_uid", "pod_uid", "predictions")
DEFAULT_TIMEOUT_SECONDS = 300.0
STORAGE_RETRY = RetryPolicy(max_retries=3, initial_backoff=0.2, max_backoff=5.0)
BODY_IN_MESSAGE = 500


class StorageError(Exception):
    """A storage failure that another attempt (another pod) may not meet."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class StorageRejected(StorageError):
    """The storage refused the request, or answered what it should not: permanent."""


@dataclass
class StorageContext:
    """What a provider may use at run time; built by the runner, never by the contract."""

    session: aiohttp.ClientSession
    secrets: SecretReader
    namespace: str
    job_id: str
    pod_uid: str
    parameters: Mapping[str, str]
    deadline: Deadline
    log: Any


class StorageProvider(Protocol):
    key: str

    async def prepare(self, ctx: StorageContext) -> None:
        """Resolve credentials and endpoints; called before any data moves."""
        ...

    async def load_rows(self, ctx: StorageContext) -> list[Any]: ...

    async def store(self, ctx: StorageContext, predictions: list[Any]) -> None: ...


# -- paging, keyed writes and resume (the streaming path, runner/streaming.py) ---------

PAGING_KEYS = ("offset", "limit", "shard_index", "shard_count")
KEYED_OUTPUT_KEYS = (
    "predictions_offset",
    "shard_index",
    "shard_count",
    "idempotency_key",
    "progress",
)


class Paging(BaseModel):
    """An input entry's ``paging``: read the input ``pageSize`` rows at a time."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    page_size: int = Field(ge=1, le=1_000_000)
    # Pages between "first batch sent" and "stored" (runner/streaming.py): more keeps
    # the model busier while chunks are written, and costs more rows redone after a kill.
    pages_in_flight: int = Field(default=2, ge=1, le=16)
    # Where a page answer may say how many rows the (shard's) input has.
    total_field: str = "total"


@dataclass(frozen=True)
class Partition:
    """Shard ``index`` of ``count``: the input positions ``p`` with ``p % count == index``."""

    index: int = 0
    count: int = 1

    def position(self, offset: int) -> int:
        """The input position of the shard's row number ``offset``."""
        return self.index + self.count * offset


@dataclass(frozen=True)
class Page:
    offset: int  # the shard's row number of rows[0]
    rows: list[Any]
    total: int | None  # rows in the shard, when the storage says


@dataclass(frozen=True)
class Stored:
    """What a keyed write stored; ``None`` where the storage did not say."""

    stored: int | None = None
    duplicates: int | None = None


class PagedInput(Protocol):
    """An input provider that can page; ``paging`` is None when its entry asks for none."""

    paging: Paging | None

    async def read_page(
        self, ctx: StorageContext, offset: int, limit: int, part: Partition
    ) -> Page: ...


class KeyedOutput(Protocol):
    """An output provider that stores keyed (idempotent) chunks and says what is stored."""

    async def store_keyed(
        self, ctx: StorageContext, offset: int, predictions: list[Any], part: Partition
    ) -> Stored: ...

    async def stored_next(self, ctx: StorageContext, part: Partition) -> int | None:
        """The shard's first row number not stored yet; None when no resume is configured."""
        ...


def paging_arguments(offset: int, limit: int, part: Partition) -> dict[str, str]:
    return {
        "offset": str(offset),
        "limit": str(limit),
        "shard_index": str(part.index),
        "shard_count": str(part.count),
    }


def keyed_arguments(ctx: StorageContext, offset: int, part: Partition) -> dict[str, str]:
    """The fields that make a chunk's predictions keyed: see runner/streaming.py."""
    return {
        "predictions_offset": str(offset),
        "shard_index": str(part.index),
        "shard_count": str(part.count),
        "idempotency_key": f"{ctx.job_id}/{part.index}/{part.position(offset)}",
    }


def _field(value: Any, path: str) -> Any:
    for part in path.split(".") if path else ():
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def page_from(answer: Answer, rows_field: str, paging: Paging, offset: int) -> Page:
    rows = rows_from(answer, rows_field)
    total = _field(answer.json(), paging.total_field)
    if not isinstance(total, int) or isinstance(total, bool) or total < 0:
        total = None
    return Page(offset=offset, rows=rows, total=total)


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
    try:
        value = answer.json()
    except orjson.JSONDecodeError:
        raise StorageRejected(
            f"{answer.what} answered {answer.status} with a body that is not JSON: {answer.text()}"
        ) from None
    following = value.get("next") if isinstance(value, dict) else None
    if not isinstance(following, int) or isinstance(following, bool) or following < 0:
        raise StorageRejected(
            f"{answer.what} answered {answer.status} without a 'next' row number: {answer.text()}"
        )
    return following


def check_parameters(parameters: Mapping[str, str] | None, extra: Sequence[str] = ()) -> None:
    """Parameters travel in the output body beside fields they may not overwrite."""
    clash = sorted(set(parameters or {}) & {*RESERVED_OUTPUT_KEYS, *extra})
    if clash:
        raise ValueError(
            f"parameters {clash} would overwrite fields of the output body "
            f"({', '.join(RESERVED_OUTPUT_KEYS)}): rename them"
        )


def output_body(
    ctx: StorageContext, predictions: Any, extra: Mapping[str, str] | None = None
) -> dict[str, Any]:
    # Parameters first, then the runner's fields: check_parameters already refused
    # clashes, and this order makes a clash harmless even if that check is skipped.
    return {
        **ctx.parameters,
        **(extra or {}),
        "job_uid": ctx.job_id,
        "pod_uid": ctx.pod_uid,
        "predictions": predictions,
    }


def parse_header_lines(lines: Sequence[str] | Mapping[str, str]) -> dict[str, str]:
    """``["K: V", ...]`` (upstream's form) or a mapping, as headers; bad lines are errors."""
    if isinstance(lines, Mapping):
        pairs = list(lines.items())
    else:
        pairs = []
        for line in lines:
            if not isinstance(line, str) or ":" not in line:
                raise ValueError(f"header {line!r} is not of the form 'Name: value'")
            name, _, value = line.partition(":")
            pairs.append((name, value))
    headers: dict[str, str] = {}
    for name, value in pairs:
        name = name.strip()
        if not name or any(c.isspace() or c in '()<>@,;:\\"/[]?={}' for c in name):
            raise ValueError(f"header name {name!r} is not a valid HTTP header name")
        headers[name] = str(value).strip()
    return headers


def parse_bool(value: str, key: str) -> bool:
    """Go's ``strconv.ParseBool``, which upstream uses for ``insecure``."""
    if value in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if value in ("0", "f", "F", "FALSE", "false", "False", ""):
        return False
    raise StorageError(f"Secret key {key!r} must be a boolean (true or false)")


@dataclass(frozen=True)
class Endpoint:
    """A base URL with its credentials and TLS settings, built from a Secret."""

    base_url: str
    authorization: str | None = None
    ssl: ssl.SSLContext | bool = True
    proxy: str | None = None

    def url_for(self, path: str) -> str:
        if not path:
            return self.base_url
        return self.base_url.rstrip("/") + "/" + path.lstrip("/")


def build_endpoint(
    *,
    url: str,
    token: str | None,
    username: str | None,
    password: str | None,
    ca_data: str | None,
    insecure: bool,
    proxy_url: str | None,
    client_cert: str | None = None,
    client_key: str | None = None,
    source: str,
) -> Endpoint:
    """One endpoint; ``source`` names the Secret in error messages.

    Credentials written into the URL (``https://user:pw@host``) are taken out of it
    and used for Basic auth when the Secret has no other, as Go's client does.
    """
    url, url_user, url_password = split_userinfo(url.strip())
    if not url.startswith(("http://", "https://")):
        raise StorageError(f"{source}: the URL must start with http:// or https://")
    if url_password is not None and not (token or password):
        username, password = url_user, url_password
    if token and password:
        raise StorageError(f"{source}: has both a token and a password; keep one")
    authorization = None
    if token:
        authorization = f"Bearer {token.strip()}"
    elif password:
        pair = f"{username or ''}:{password}".encode()
        authorization = f"Basic {base64.b64encode(pair).decode()}"
    if proxy_url and not proxy_url.startswith(("http://", "https://")):
        raise StorageError(f"{source}: only http(s) proxies are supported")
    tls: ssl.SSLContext | bool = True
    if url.startswith("https://") and (insecure or ca_data or client_cert):
        tls = _tls_context(ca_data, insecure, client_cert, client_key, source)
    return Endpoint(base_url=url, authorization=authorization, ssl=tls, proxy=proxy_url or None)


def split_userinfo(url: str) -> tuple[str, str, str | None]:
    """``url`` without ``user:password@``, the user, and the password (None if absent)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, "", None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, has_password, password = userinfo.partition(":")
    cleaned = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return cleaned, unquote(user), unquote(password) if has_password else None


def pem(value: str) -> str:
    """PEM text, whether given as PEM or (kubeconfig style) base64 of PEM."""
    if "-----BEGIN" in value:
        return value
    try:
        return base64.b64decode(value, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise ValueError("neither PEM nor base64 of PEM") from None


def _tls_context(
    ca_data: str | None,
    insecure: bool,
    client_cert: str | None,
    client_key: str | None,
    source: str,
) -> ssl.SSLContext:
    context = ssl.create_default_context()
    try:
        if ca_data:
            context.load_verify_locations(cadata=pem(ca_data))
        if client_cert and client_key:
            _load_client_pair(context, pem(client_cert), pem(client_key))
    except (ValueError, ssl.SSLError) as error:
        raise StorageError(f"{source}: unusable TLS material: {type(error).__name__}") from None
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _load_client_pair(context: ssl.SSLContext, cert: str, key: str) -> None:
    # ssl only loads key pairs from files: write them privately, load, delete.
    with tempfile.TemporaryDirectory(prefix="runner-tls-") as directory:
        cert_path = os.path.join(directory, "tls.crt")
        key_path = os.path.join(directory, "tls.key")
        for path, text in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
        context.load_cert_chain(cert_path, key_path)


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
        return orjson.loads(self.body)


class _Unsent(Transient):
    """The connection could not be opened: nothing reached the server."""


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
    retry: Literal["all", "unsent"],
) -> Answer:
    """One storage request (retried as the module docstring says); any non-2xx is an error."""
    url = endpoint.url_for(path)
    what = f"{method} {url}"
    request_headers = {
        "Content-Type": "application/json",
        "Accept": "application/json",
        "X-Krateo-TraceId": uuid.uuid4().hex[:10],
        **headers,
    }
    if endpoint.authorization:
        request_headers["Authorization"] = endpoint.authorization

    async def attempt(attempt_timeout: float) -> Answer:
        # The headers include Authorization: the log's redaction hides it by key.
        ctx.log.debug("storage request", method=method, url=url, headers=request_headers)
        try:
            async with ctx.session.request(
                method,
                url,
                data=body,
                params=params,
                headers=request_headers,
                ssl=endpoint.ssl,
                proxy=endpoint.proxy,
                timeout=aiohttp.ClientTimeout(total=attempt_timeout),
            ) as response:
                answer = Answer(
                    method=method,
                    url=url,
                    status=response.status,
                    content_type=response.headers.get("Content-Type", ""),
                    body=await response.read(),
                )
                retry_after = response.headers.get("Retry-After")
        except aiohttp.ClientSSLError as error:
            # A certificate problem does not go away by asking again.
            raise StorageError(f"{what}: TLS failed: {trim(str(error))}") from None
        except aiohttp.ClientConnectorError as error:
            raise _Unsent(f"{what}: cannot connect: {error.os_error or error}") from None
        except (aiohttp.ClientError, ConnectionError) as error:
            failure = f"{what} failed: {type(error).__name__}: {trim(str(error))}"
            raise _transient_or_final(failure, retry) from None
        except TimeoutError:
            failure = f"{what} timed out after {attempt_timeout:.1f}s"
            raise _transient_or_final(failure, retry) from None
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
            on_retry=lambda n, error, wait: ctx.log.warning(
                "storage request failed, retrying",
                attempt=n,
                error=error.message,
                retryInSeconds=round(wait, 2),
            ),
        )
    except GaveUp as error:
        raise StorageError(error.message) from None


PROBE_TIMEOUT_SECONDS = 10.0


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
    request_headers = {"Accept": "application/json", "X-Krateo-TraceId": uuid.uuid4().hex[:10]}
    request_headers.update(headers)
    if endpoint.authorization:
        request_headers["Authorization"] = endpoint.authorization
    limit = max(ctx.deadline.cap(time_limit), 0.001)
    try:
        async with ctx.session.request(
            method,
            url,
            headers=request_headers,
            ssl=endpoint.ssl,
            proxy=endpoint.proxy,
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=limit),
        ) as response:
            answer = Answer(
                method=method,
                url=url,
                status=response.status,
                content_type=response.headers.get("Content-Type", ""),
                body=await response.read(),
            )
    except aiohttp.ClientSSLError as error:
        raise StorageError(f"{what}: TLS failed: {trim(str(error))}") from None
    except aiohttp.ClientConnectorError as error:
        raise StorageError(f"{what}: cannot connect: {error.os_error or error}") from None
    except (aiohttp.ClientError, ConnectionError) as error:
        raise StorageError(f"{what} failed: {type(error).__name__}: {trim(str(error))}") from None
    except TimeoutError:
        raise StorageError(f"{what} timed out after {limit:.1f}s") from None
    if answer.status in (401, 403):
        raise StorageRejected(
            f"{what} answered {answer.status}: {server_message(answer.body)} "
            "(the credentials are refused)"
        )
    if answer.status >= 500 or answer.status in RETRYABLE_4XX:
        raise StorageError(f"{what} answered {answer.status}: {server_message(answer.body)}")
    return answer


def _transient_or_final(
    message: str, retry: Literal["all", "unsent"], hint: float | None = None
) -> Exception:
    return Transient(message, retry_after=hint) if retry == "all" else StorageError(message)


def rows_from(answer: Answer, field: str) -> list[Any]:
    """The rows list at ``field`` (dotted path; empty = the body itself) of a JSON answer.

    Anything else is :class:`StorageRejected`: asking again gets the same answer
    (finops-database-handler's error text for a missing table, say).
    """
    try:
        value = answer.json()
    except orjson.JSONDecodeError:
        raise StorageRejected(
            f"{answer.what} answered {answer.status} with a body that is not JSON: {answer.text()}"
        ) from None
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


def chunks(values: list[Any], size: int | None) -> list[tuple[int, list[Any]]]:
    """``(offset, values)`` pieces of at most ``size``; one piece (even empty) without a size."""
    if not size or len(values) <= size:
        return [(0, values)]
    return [(start, values[start : start + size]) for start in range(0, len(values), size)]


def explain(error: ValidationError) -> str:
    """A pydantic error as one line: ``field.path: problem; ...``."""
    return "; ".join(
        f"{'.'.join(str(p) for p in issue['loc']) or '(entry)'}: {issue['msg']}"
        for issue in error.errors()
    )
