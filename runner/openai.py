"""Batch inference over OpenAI-compatible endpoints (``kserve.modelVersion: openai``).

KServe's Hugging Face and vLLM runtimes serve the OpenAI API beside (or instead
of) the Open Inference Protocol. With ``modelVersion: openai`` the runner sends
one request per input row to ``<modelUrl>/<endpoint>``, where ``modelUrl`` is the
API's base (KServe's ``http://<host>/openai/v1``; vLLM's ``http://<host>/v1``; a
URL that already ends with the endpoint is taken as it is) and ``endpoint`` is
``chat/completions``, ``completions`` or ``embeddings``
(:class:`contract.document.OpenAI`, ``kserve.openai`` in the contract).

**Requests** (``format: rows``). Each row's ``inputColumn`` is the prompt: a
string, or for chat completions a list of messages (a string becomes one user
message). The body is the ``request`` template (``max_tokens``, ``temperature``,
``seed``, ...; its ``messages``, if any, go before the row's, e.g. a system
prompt) with the row's ``messages``, ``prompt`` or ``input``, and ``model``: the
template's, else ``kserve.modelName``. A row may also be a bare string (a
provider that answers a list of prompts).

**Answers.** Each output row is an object: the carried columns (the input's
``keyColumn`` and ``passthroughColumns``, :mod:`runner.join`), then the
``outputColumns``: ``text`` (the first choice's message content or text; an
embedding's vector), ``finishReason``, ``usage`` (the answer's ``usage`` object)
and, when row errors are recorded, ``error`` (null for a row that succeeded).
Rows stay in input order, whatever order the answers arrive in.

**Batch files** (``format: batch``). Each input row is one line of an OpenAI
Batch API input file: ``{"custom_id", "method": "POST", "url":
"/v1/chat/completions", "body": {...}}``; ``url`` picks the endpoint per line.
The body is sent as it is, but for ``model``, replaced by ``kserve.modelName``
when that is set (a file written for a hosted model then runs against the KServe
model unchanged), and for the ``request`` template's fields, which fill what the
body does not say. Each output row is the Batch API's output line: ``{"id",
"custom_id", "response": {"status_code", "request_id", "body"}, "error"}``.

**Concurrency and retries.** ``batching.concurrency`` requests are in flight at
once (one row each). Connection errors, timeouts, 5xx, 408 and 429 are retried
(:mod:`runner.retry`); a 429 follows the server's ``Retry-After`` and does not
count against ``batching.maxRetries``: rate limits are ridden out until the run's
deadline (at most :data:`RATE_LIMIT_RETRIES` times for one row).

**Row errors** (``onRowError``). A 4xx other than 408 and 429 is the model
refusing a request. ``fail`` (the default for rows) ends the run at once with the
server's words, exit 7, as for the Open Inference Protocol. ``record`` (the
default for batch files) writes the refusal into the row's ``error`` column (a
batch line's ``response``, with the server's status and body) and goes on;
refusals that say the whole run is wrong (401, 403, 404, 405: a credential, the
model's name or the URL) still end it. So does a row the retries could not get
through (exit 4): the server is down, not the row wrong.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from contract.document import OPENAI_ROW_FIELDS, KServe, OpenAI, OpenAIEndpoint
from contract.exitcodes import ContractError, InputRejected
from runner.batching import map_ordered
from runner.httputil import RETRYABLE_4XX, retry_after_seconds, server_message
from runner.inference import BatchPlan, ModelRefused, model_call_failures, normalise_url
from runner.join import Selection, SelectionError
from runner.retry import Deadline, Transient, call_with_retries
from runner.storage.base import Page, Partition

PROTOCOL = "openai"
ENDPOINTS: tuple[OpenAIEndpoint, ...] = ("chat/completions", "completions", "embeddings")
# A row's 429s retried at most this many times (the deadline usually comes first).
RATE_LIMIT_RETRIES = 1000
# Refusals that say the run is wrong, not the row: never recorded as a row's error.
RUN_REFUSALS = frozenset({401, 403, 404, 405})
BATCH_METHOD = "POST"
BATCH_FIELDS = ("custom_id", "method", "url", "body")


def is_openai(kserve: KServe) -> bool:
    return (kserve.model_version or "").strip().lower() == PROTOCOL


@dataclass(frozen=True)
class OpenAITarget:
    """Where the requests go, and how rows become them (from the contract)."""

    base_url: str
    model: str | None
    settings: OpenAI

    def url(self, endpoint: OpenAIEndpoint) -> str:
        return f"{self.base_url}/{endpoint}"


def target_from_contract(kserve: KServe) -> OpenAITarget:
    """The API's base URL and settings; :class:`ContractError` when they make no sense."""
    if not kserve.model_url or not kserve.model_url.strip():
        raise ContractError("kserve.modelUrl is required (the OpenAI API's base URL)")
    url = normalise_url(kserve.model_url).rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ContractError(f"kserve.modelUrl must be an http(s) URL with a host, got {url!r}")
    if parts.query or parts.fragment:
        raise ContractError(f"kserve.modelUrl must not have a query or fragment, got {url!r}")
    settings = kserve.openai or OpenAI()
    # A URL given down to the endpoint ("/v1/chat/completions") is taken as its base.
    for endpoint in sorted(ENDPOINTS, key=len, reverse=True):
        if url.endswith(f"/{endpoint}"):
            url = url[: -len(endpoint) - 1]
            break
    model = (kserve.model_name or "").strip() or None
    if settings.format == "rows" and model is None and not settings.request.get("model"):
        raise ContractError(
            "an OpenAI request names its model: set kserve.modelName or kserve.openai.request.model"
        )
    return OpenAITarget(base_url=url, model=model, settings=settings)


def output_names(settings: OpenAI) -> list[str]:
    """The output columns each row gets, in order (``error`` only when errors are recorded)."""
    cols = settings.output_columns
    names = [cols.text, cols.finish_reason, cols.usage]
    if settings.row_errors == "record":
        names.append(cols.error)
    return [name for name in names if name]


def check_selection(settings: OpenAI, selection: Selection | None) -> None:
    """The join keys fit an OpenAI run; ValueError (exit 2) otherwise."""
    if selection is None:
        return
    if selection.columns is not None:
        raise ValueError(
            "input columns: an OpenAI run reads its prompt from kserve.openai.inputColumn; "
            "leave columns out"
        )
    if settings.format == "batch" and selection.carried:
        raise ValueError(
            "a batch file's lines carry their own custom_id: keyColumn and passthroughColumns "
            "do not apply to kserve.openai.format batch"
        )
    clash = sorted(set(selection.carried) & set(output_names(settings)))
    if clash:
        raise ValueError(
            f"the carried column(s) {clash} are also kserve.openai.outputColumns: rename one"
        )


# -- rows in --------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchLine:
    """One request of a batch file."""

    custom_id: str
    endpoint: OpenAIEndpoint
    body: dict[str, Any]


RowInput = str | list[Any] | BatchLine


def batch_line(row: Any, where: str) -> BatchLine:
    """A batch file's input line as a request; SelectionError (the input's fault) otherwise."""
    if not isinstance(row, Mapping):
        raise SelectionError(f"{where} is not a batch request object ({', '.join(BATCH_FIELDS)})")
    missing = [name for name in BATCH_FIELDS if name not in row]
    if missing:
        raise SelectionError(f"{where} has no {', '.join(missing)} (a batch line has all of them)")
    custom_id, method, url, body = (row[name] for name in BATCH_FIELDS)
    if not isinstance(custom_id, str) or not custom_id:
        raise SelectionError(f"{where}: custom_id must be a non-empty string")
    if not isinstance(method, str) or method.upper() != BATCH_METHOD:
        raise SelectionError(f"{where} ({custom_id}): method must be POST, got {method!r}")
    if not isinstance(body, Mapping):
        raise SelectionError(f"{where} ({custom_id}): body must be an object")
    path = urlsplit(url).path.rstrip("/") if isinstance(url, str) else ""
    endpoint = next((e for e in ENDPOINTS if path in (f"/v1/{e}", f"/{e}", e)), None)
    if endpoint is None:
        raise SelectionError(
            f"{where} ({custom_id}): url {url!r} is not one of "
            + ", ".join(f"/v1/{e}" for e in ENDPOINTS)
        )
    return BatchLine(custom_id, endpoint, dict(body))


def _prompt(value: Any, settings: OpenAI, where: str) -> str | list[Any]:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        if settings.endpoint == "chat/completions" and not all(
            isinstance(m, Mapping) for m in value
        ):
            raise SelectionError(f"{where}: messages must be a list of objects (role, content)")
        return value
    raise SelectionError(
        f"{where}: {settings.input_column!r} must be a string"
        + (" or a list of messages" if settings.endpoint == "chat/completions" else "")
        + f", got {'an empty list' if value == [] else type(value).__name__}"
    )


@dataclass
class RowReader:
    """Splits input rows into requests and carried values; keeps the carried per page."""

    settings: OpenAI
    selection: Selection | None
    part: Partition = field(default_factory=Partition)
    carried: dict[int, list[tuple[Any, ...]]] = field(default_factory=dict)

    def read(
        self, rows: Sequence[Any], first: int = 0, name: str = "row"
    ) -> tuple[list[RowInput], list[tuple[Any, ...]]]:
        """``(inputs, carried)``; SelectionError naming the first row that cannot be read."""
        settings = self.settings
        names = self.selection.carried if self.selection else []
        inputs: list[RowInput] = []
        kept: list[tuple[Any, ...]] = []
        for number, row in enumerate(rows, start=first):
            where = f"{name} {number}"
            if settings.format == "batch":
                inputs.append(batch_line(row, where))
                continue
            if isinstance(row, str) and not names:
                inputs.append(row)
                continue
            if not isinstance(row, Mapping):
                raise SelectionError(
                    f"{where} is not an object with named columns: the prompt is read from "
                    f"its {settings.input_column!r} column"
                )
            if settings.input_column not in row:
                raise SelectionError(
                    f"{where} has no column {settings.input_column!r} (kserve.openai.inputColumn)"
                )
            inputs.append(_prompt(row[settings.input_column], settings, where))
            if names:
                try:
                    values = tuple(row[column] for column in names)
                except KeyError as missing:
                    raise SelectionError(
                        f"{where} has no column {missing.args[0]!r} (keyColumn or "
                        "passthroughColumns)"
                    ) from None
                if self.selection and self.selection.key_column and values[0] is None:
                    raise SelectionError(f"{where}: its keyColumn {names[0]!r} is null")
                kept.append(values)
        return inputs, kept

    def split(self, page: Page) -> Page:
        """A streaming run's page with requests as rows; its carried values kept aside.

        InputRejected (exit 6) naming the first row that cannot be read.
        """
        name = f"shard {self.part.index}/{self.part.count} row" if self.part.count > 1 else "row"
        try:
            inputs, kept = self.read(page.rows, page.offset, name)
        except SelectionError as error:
            raise InputRejected(str(error)) from None
        self.carried[page.offset] = kept
        return Page(page.offset, list(inputs), page.total)

    def output(self, page: Page, outputs: list[Any]) -> list[Any]:
        return join(self.settings, self.selection, self.carried.pop(page.offset, []), outputs)


def join(
    settings: OpenAI,
    selection: Selection | None,
    carried: Sequence[tuple[Any, ...]],
    outputs: list[Any],
) -> list[Any]:
    """Output rows: the carried columns, then each row's output columns."""
    names = selection.carried if selection else []
    if not names or settings.format == "batch":
        return outputs
    return [
        {**dict(zip(names, kept, strict=True)), **output}
        for kept, output in zip(carried, outputs, strict=True)
    ]


# -- requests -------------------------------------------------------------------------


def build_request(settings: OpenAI, model: str | None, prompt: str | list[Any]) -> dict[str, Any]:
    """The body for one row (module docstring, "Requests")."""
    body = dict(settings.request)
    if model and not body.get("model"):
        body["model"] = model
    field_name = OPENAI_ROW_FIELDS[settings.endpoint]
    if settings.endpoint == "chat/completions":
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        body["messages"] = [*(settings.request.get("messages") or []), *messages]
    else:
        body[field_name] = prompt
    return body


def build_batch_request(settings: OpenAI, model: str | None, line: BatchLine) -> dict[str, Any]:
    """A batch line's body: the template fills what it lacks; ``model`` is the KServe one."""
    body = {**settings.request, **line.body}
    if model:
        body["model"] = model
    return body


# -- answers --------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    text: Any
    finish_reason: str | None
    usage: dict[str, Any] | None


def _not_answer(why: str, body: bytes) -> ModelRefused:
    return ModelRefused(f"the model's answer {why}: {server_message(body)}", status=200)


def parse_answer(endpoint: OpenAIEndpoint, body: bytes) -> Answer:
    """The text (or vector), finish reason and usage of an answer; ModelRefused if none."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise _not_answer("is not JSON", body) from None
    if not isinstance(answer, dict):
        raise _not_answer("is not a JSON object", body)
    usage = answer.get("usage")
    usage = usage if isinstance(usage, dict) else None
    if endpoint == "embeddings":
        data = answer.get("data")
        if not isinstance(data, list) or not data:
            raise _not_answer("has no data", body)
        vectors = [
            item.get("embedding")
            for item in sorted(
                (d for d in data if isinstance(d, dict)), key=lambda d: d.get("index") or 0
            )
        ]
        if not vectors or any(not isinstance(v, list | str) for v in vectors):
            raise _not_answer("has no embedding", body)
        return Answer(vectors[0] if len(vectors) == 1 else vectors, None, usage)
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _not_answer("has no choices", body)
    choice = choices[0]
    if endpoint == "chat/completions":
        message = choice.get("message")
        if not isinstance(message, dict):
            raise _not_answer("has no message in its first choice", body)
        text = message.get("content")
    else:
        text = choice.get("text")
    reason = choice.get("finish_reason")
    return Answer(text, reason if isinstance(reason, str) else None, usage)


def output_columns(settings: OpenAI, answer: Answer | None, error: str | None) -> dict[str, Any]:
    """One row's output columns (``outputColumns``; ``error`` when errors are recorded)."""
    cols = settings.output_columns
    row: dict[str, Any] = {}
    if cols.text:
        row[cols.text] = answer.text if answer else None
    if cols.finish_reason:
        row[cols.finish_reason] = answer.finish_reason if answer else None
    if cols.usage:
        row[cols.usage] = answer.usage if answer else None
    if cols.error and settings.row_errors == "record":
        row[cols.error] = error
    return row


def batch_request_id(job_id: str, custom_id: str) -> str:
    """A batch output line's ``id``: the same for the same run and line, so rewrites match."""
    digest = hashlib.sha256(f"{job_id}\0{custom_id}".encode()).hexdigest()[:24]
    return f"batch_req_{digest}"


def batch_output(
    job_id: str,
    line: BatchLine,
    status: int | None,
    body: bytes | None,
    request_id: str | None,
    error: str | None = None,
) -> dict[str, Any]:
    """The Batch API's output line for ``line``: the answer (any status), or an error."""
    response = None
    if status is not None and body is not None:
        try:
            parsed: Any = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = {"error": {"message": server_message(body)}}
        response = {"status_code": status, "request_id": request_id or "", "body": parsed}
    return {
        "id": batch_request_id(job_id, line.custom_id),
        "custom_id": line.custom_id,
        "response": response,
        "error": None if error is None else {"code": "request_failed", "message": error},
    }


# -- the client -----------------------------------------------------------------------


class RowRefused(ModelRefused):
    """A refusal of one request, with the server's status and body (for a batch line)."""

    def __init__(self, message: str, status: int, body: bytes, request_id: str | None) -> None:
        super().__init__(message, status=status)
        self.body = body
        self.request_id = request_id

    @property
    def recordable(self) -> bool:
        """Whether the refusal is the row's (kept as its error), not the run's."""
        return self.status is not None and self.status not in RUN_REFUSALS


def classify(
    status: int, body: bytes, retry_after: str | None, request_id: str | None
) -> Exception:
    """The error for a non-2xx answer: transient (5xx, 408, 429) or a refusal."""
    message = f"model answered {status}: {server_message(body)}"
    if status >= 500 or status in RETRYABLE_4XX:
        return Transient(
            message, retry_after=retry_after_seconds(retry_after), rate_limited=status == 429
        )
    return RowRefused(message, status, body, request_id)


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    request_id: str | None


_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}


class OpenAIClient:
    """POSTs to one OpenAI-compatible API over one aiohttp session."""

    def __init__(self, session: aiohttp.ClientSession, target: OpenAITarget) -> None:
        self._session = session
        self.target = target
        self._urls = {endpoint: target.url(endpoint) for endpoint in ENDPOINTS}
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    def _timeout(self, limit: float) -> aiohttp.ClientTimeout:
        # The limit is the request timeout until the run's deadline comes near.
        timeout = self._timeouts.get(limit)
        if timeout is None:
            timeout = aiohttp.ClientTimeout(total=limit)
            if len(self._timeouts) < 4:
                self._timeouts[limit] = timeout
        return timeout

    async def post(self, endpoint: OpenAIEndpoint, body: dict[str, Any], limit: float) -> Reply:
        with model_call_failures(limit):
            async with self._session.post(
                self._urls[endpoint],
                data=orjson.dumps(body),
                headers=_HEADERS,
                timeout=self._timeout(limit),
            ) as response:
                answer = await response.read()
                request_id = response.headers.get("X-Request-Id")
                if not 200 <= response.status < 300:
                    raise classify(
                        response.status, answer, response.headers.get("Retry-After"), request_id
                    )
                return Reply(response.status, answer, request_id)


def openai_plan(plan: BatchPlan) -> BatchPlan:
    """One row per request; 429s ride out rate limits (module docstring)."""
    retry = replace(plan.retry, rate_limit_retries=RATE_LIMIT_RETRIES)
    return replace(plan, batch_size=1, retry=retry)


@dataclass
class OpenAIPredictor:
    """Rows in, output rows out: requests, retries, row errors (module docstring)."""

    client: OpenAIClient
    plan: BatchPlan
    deadline: Deadline
    job_id: str
    on_retry: Callable[[int, Transient, float], None] | None = None
    sleep: Callable[[float], Any] = asyncio.sleep
    # Rows whose refusal was recorded as their error.
    row_errors: int = 0

    @property
    def settings(self) -> OpenAI:
        return self.client.target.settings

    def started(self, log: Any, **fields: Any) -> None:
        settings = self.settings
        log.info(
            "inference started",
            url=self.client.target.base_url,
            protocol=PROTOCOL,
            endpoint=settings.endpoint,
            format=settings.format,
            model=self.client.target.model or settings.request.get("model"),
            concurrency=self.plan.concurrency,
            onRowError=settings.row_errors,
            **fields,
        )

    async def _call(self, endpoint: OpenAIEndpoint, body: dict[str, Any]) -> Reply:
        """The answer to ``body``, retried as :mod:`runner.retry` says.

        The first attempt is made here, outside the retry machinery (tenacity's
        set-up costs about as much CPU as the request itself, and most requests
        succeed at once); a transient failure of it is handed to
        :func:`~runner.retry.call_with_retries` as its own first attempt, so
        the waits, the counts and the messages are the same.
        """
        limit = self.deadline.cap(self.plan.request_timeout)
        failed: list[Transient] = []
        if limit > 0:
            try:
                return await self.client.post(endpoint, body, limit)
            except Transient as error:
                failed.append(error)

        async def attempt(limit: float) -> Reply:
            if failed:
                raise failed.pop()
            return await self.client.post(endpoint, body, limit)

        return await call_with_retries(
            attempt,
            policy=self.plan.retry,
            deadline=self.deadline,
            request_timeout=self.plan.request_timeout,
            sleep=self.sleep,
            on_retry=self.on_retry,
        )

    async def one(self, item: RowInput) -> dict[str, Any]:
        """One row's output; raises what fails the run (refusals too, unless recorded)."""
        settings, model = self.settings, self.client.target.model
        record = settings.row_errors == "record"
        if isinstance(item, BatchLine):
            body = build_batch_request(settings, model, item)
            try:
                reply = await self._call(item.endpoint, body)
            except RowRefused as refused:
                if not (record and refused.recordable):
                    raise
                self.row_errors += 1
                return batch_output(
                    self.job_id, item, refused.status, refused.body, refused.request_id
                )
            return batch_output(self.job_id, item, reply.status, reply.body, reply.request_id)
        body = build_request(settings, model, item)
        try:
            reply = await self._call(settings.endpoint, body)
            answer = parse_answer(settings.endpoint, reply.body)
        except ModelRefused as refused:
            recordable = (
                refused.recordable if isinstance(refused, RowRefused) else refused.permanent
            )
            if not (record and recordable):
                raise
            self.row_errors += 1
            return output_columns(settings, None, refused.message)
        return output_columns(settings, answer, None)

    async def infer_batch(self, rows: Sequence[RowInput]) -> list[dict[str, Any]]:
        return [await self.one(row) for row in rows]

    async def predict(
        self,
        rows: Sequence[RowInput],
        on_row_done: Callable[[int], None] = lambda _rows: None,
    ) -> list[dict[str, Any]]:
        """Every row's output, in input order, ``concurrency`` requests in flight."""

        async def one(item: RowInput) -> dict[str, Any]:
            output = await self.one(item)
            on_row_done(1)
            return output

        return await map_ordered(list(rows), one, self.plan.concurrency)
