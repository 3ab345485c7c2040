"""``http``: any JSON-over-HTTP service, with its address and credentials in a Secret.

Contract entry (the same for ``input`` and ``output``; keys marked *input* or
*output* apply to that side only)::

    http:
      secretRef: {name: my-store, namespace: data}   # namespace defaults to the pod's
      method: POST            # default POST
      path: /rows/query       # joined to the Secret's url; default ""
      headers: ["X-Tenant: a"]   # or a mapping {"X-Tenant": "a"}
      rowsField: result       # input: where the rows are, dotted ("data.rows"); "" = the body
      predictionsAs: array    # output: "array" (default) or "string" (JSON-encoded, like krateo)
      chunkSize: 50000        # output: predictions per request; default all in one
      paging: {pageSize: 10000, totalField: total, pagesInFlight: 2}   # input (below)
      resumePath: /tables/out/progress   # output: where a restarted pod asks (below)
      resumeMethod: GET       # output: default GET

**Secret** keys: ``url`` (required, http or https); ``token`` (Bearer) or
``username``/``password`` (Basic); ``ca`` (PEM bundle to trust); ``insecure``
(skip TLS verification: ``true``/``false``).

**Requests.** The run's parameters (all strings) are the JSON body of a POST,
PUT or PATCH, and the query string of a GET or DELETE. The output body is
``{"job_uid", "pod_uid", "predictions", ...parameters}`` (parameters may not reuse
those names) plus ``predictions_offset`` when chunked.

**Answers.** Any non-2xx fails. The input must be JSON with a list of rows at
``rowsField``. An output answer must be empty or JSON: a 2xx carrying an error
text is a failure, never a success. A 4xx other than 408/429 and a 2xx that is
not what it should be are rejections (exit 6 for the input, 8 for the output:
the Job is not retried); the rest exit 3 or 5.

**Paging** (input ``paging``). Without it the input is one request. With
``paging: {pageSize: N}`` the runner asks for one page at a time, adding to the
parameters ``offset``, ``limit`` (N), ``shard_index`` and ``shard_count`` (strings;
in the query string of a GET, in the JSON body otherwise). The answer has the
page's rows at ``rowsField`` and may give the number of rows in the shard at
``totalField`` (dotted; default ``total``) for progress; a page shorter than N is
the last. ``offset`` counts the shard's rows: shard ``s`` of ``c`` is the input
positions ``p`` with ``p % c == s``, so a sharded pod reads only its own rows.
A paged input makes the run stream (:mod:`runner.streaming`): each page's
predictions are one keyed write (``chunkSize`` may split it) whose body adds
``predictions_offset``, ``shard_index``, ``shard_count`` and ``idempotency_key``;
prediction ``i`` is keyed ``(job_uid, shard_index, s + c*(predictions_offset+i))``,
and the service must store a key once. Keyed writes are retried like reads. The
answer may be ``{"stored": n, "duplicates": m}``.

**Resume** (output ``resumePath``). ``resumeMethod`` on ``resumePath`` with the
parameters, ``job_uid``, ``shard_index`` and ``shard_count`` answers ``{"stored": n,
"next": k}``: a restarted pod of a streaming run continues at the shard's row ``k``.

``hack/storage_service.py`` serves all of it: ``GET /tables/{t}/rows``, ``POST
/tables/{t}/predictions``, ``GET /tables/{t}/progress``.

**Probe** (``python -m runner --check``, :meth:`HttpProvider.probe`): ``HEAD`` of the
Secret's ``url`` (the base, not ``path``) with the credentials and the contract's
headers: a HEAD reads and writes nothing, and the base is not the data endpoint.
A 401/403 is a rejection (exit 6/8); no connection, a timeout, TLS, a 5xx, 408
or 429 exit 3/5; any other answer (a 404 or 405 included: the base need not be
a resource) proves the server reachable, though only a server that checks
credentials before routing proves them accepted.

Adding another backend is one more module like this one: see :mod:`runner.storage`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from runner.secrets import SecretError
from runner.storage.base import (
    PAGING_KEYS,
    Endpoint,
    Page,
    Paging,
    Partition,
    Role,
    StorageContext,
    StorageError,
    Stored,
    build_endpoint,
    check_parameters,
    check_stored,
    chunks,
    explain,
    keyed_arguments,
    next_from,
    output_body,
    page_from,
    paging_arguments,
    parse_bool,
    parse_header_lines,
    probe_request,
    rows_from,
    send,
    stored_from,
)

KEY = "http"
OFFSET_KEY = "predictions_offset"
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_QUERY_METHODS = ("GET", "DELETE")


class _Settings(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class SecretRef(_Settings):
    name: str = Field(min_length=1)
    namespace: str | None = None


class Settings(_Settings):
    secret_ref: SecretRef
    method: str = "POST"
    path: str = ""
    headers: list[str] | dict[str, str] = Field(default_factory=list)
    rows_field: str = "result"
    predictions_as: Literal["array", "string"] = "array"
    chunk_size: int | None = Field(default=None, ge=1)
    paging: Paging | None = None
    resume_path: str | None = Field(default=None, min_length=1)
    resume_method: str = "GET"

    @field_validator("method", "resume_method")
    @classmethod
    def _method(cls, method: str) -> str:
        method = method.strip().upper()
        if method not in _METHODS:
            raise ValueError(f"method must be one of {', '.join(_METHODS)}")
        return method

    @field_validator("headers")
    @classmethod
    def _headers(cls, headers: list[str] | dict[str, str]) -> list[str] | dict[str, str]:
        parse_header_lines(headers)
        return headers


class HttpProvider:
    key = KEY

    def __init__(self, settings: Settings, role: Role) -> None:
        self.settings = settings
        self.role = role
        self.headers = parse_header_lines(settings.headers)
        self._endpoint: Endpoint | None = None
        self.paging = settings.paging if role == "input" else None

    async def prepare(self, ctx: StorageContext) -> None:
        ref = self.settings.secret_ref
        namespace = ref.namespace or ctx.namespace
        source = f"Secret {namespace}/{ref.name}"
        try:
            data = await ctx.secrets.read(namespace, ref.name)
        except SecretError as error:
            raise StorageError(str(error)) from None
        url = (data.get("url") or "").strip()
        if not url:
            raise StorageError(f"{source} has no url")
        self._endpoint = build_endpoint(
            url=url,
            token=data.get("token") or None,
            username=data.get("username"),
            password=data.get("password") or None,
            ca_data=data.get("ca") or None,
            insecure=parse_bool(data.get("insecure", "").strip(), "insecure"),
            proxy_url=None,
            source=source,
        )

    async def probe(self, ctx: StorageContext) -> str:
        """A HEAD of the base URL: reachable, credentials not refused (see "Probe" above)."""
        if self._endpoint is None:
            raise RuntimeError("prepare() was not called")
        answer = await probe_request(
            ctx, self._endpoint, method="HEAD", path="", headers=self.headers
        )
        return f"{answer.what} answered {answer.status}"

    def _request(self, body: Mapping[str, Any], method: str | None = None) -> dict[str, Any]:
        if (method or self.settings.method) in _QUERY_METHODS:
            return {"body": None, "params": {k: str(v) for k, v in body.items()}}
        return {"body": orjson.dumps(body), "params": None}

    async def load_rows(self, ctx: StorageContext) -> list[Any]:
        if self._endpoint is None:
            raise RuntimeError("prepare() was not called")
        answer = await send(
            ctx,
            self._endpoint,
            method=self.settings.method,
            path=self.settings.path,
            headers=self.headers,
            retry="all",
            **self._request(dict(ctx.parameters)),
        )
        return rows_from(answer, self.settings.rows_field)

    @property
    def endpoint(self) -> Endpoint:
        if self._endpoint is None:
            raise RuntimeError("prepare() was not called")
        return self._endpoint

    async def read_page(
        self, ctx: StorageContext, offset: int, limit: int, part: Partition
    ) -> Page:
        if self.paging is None:
            raise RuntimeError("the input entry has no paging")
        answer = await send(
            ctx,
            self.endpoint,
            method=self.settings.method,
            path=self.settings.path,
            headers=self.headers,
            retry="all",
            **self._request({**ctx.parameters, **paging_arguments(offset, limit, part)}),
        )
        return page_from(answer, self.settings.rows_field, self.paging, offset)

    async def store_keyed(
        self, ctx: StorageContext, offset: int, predictions: list[Any], part: Partition
    ) -> Stored:
        """One page's predictions, keyed: a write repeated is stored once, so it is retried."""
        stored = duplicates = 0
        counted = True
        for start, piece in chunks(predictions, self.settings.chunk_size):
            value: Any = piece
            if self.settings.predictions_as == "string":
                value = orjson.dumps(piece).decode()
            extra = keyed_arguments(ctx, offset + start, part)
            answer = await send(
                ctx,
                self.endpoint,
                method=self.settings.method,
                path=self.settings.path,
                headers=self.headers,
                body=orjson.dumps(output_body(ctx, value, extra)),
                retry="all",
            )
            check_stored(answer)
            done = stored_from(answer)
            if done.stored is None or done.duplicates is None:
                counted = False
            else:
                stored += done.stored
                duplicates += done.duplicates
        return Stored(stored, duplicates) if counted else Stored()

    async def stored_next(self, ctx: StorageContext, part: Partition) -> int | None:
        if self.settings.resume_path is None:
            return None
        query = {
            **ctx.parameters,
            "job_uid": ctx.job_id,
            "shard_index": str(part.index),
            "shard_count": str(part.count),
        }
        answer = await send(
            ctx,
            self.endpoint,
            method=self.settings.resume_method,
            path=self.settings.resume_path,
            headers=self.headers,
            retry="all",
            **self._request(query, self.settings.resume_method),
        )
        return next_from(answer)

    async def store(self, ctx: StorageContext, predictions: list[Any]) -> None:
        if self._endpoint is None:
            raise RuntimeError("prepare() was not called")
        if self.settings.method in _QUERY_METHODS:
            raise StorageError(f"cannot send predictions with {self.settings.method}")
        pieces = chunks(predictions, self.settings.chunk_size)
        for number, (offset, piece) in enumerate(pieces, start=1):
            value: Any = piece
            if self.settings.predictions_as == "string":
                value = orjson.dumps(piece).decode()
            extra = {OFFSET_KEY: str(offset)} if self.settings.chunk_size else None
            try:
                answer = await send(
                    ctx,
                    self._endpoint,
                    method=self.settings.method,
                    path=self.settings.path,
                    headers=self.headers,
                    body=orjson.dumps(output_body(ctx, value, extra)),
                    retry="unsent",
                )
                check_stored(answer)
            except StorageError as error:
                if len(pieces) > 1:
                    # Same class: a refused chunk is as permanent as a refused write.
                    raise type(error)(
                        f"chunk {number} of {len(pieces)} (predictions from {offset}) failed, "
                        f"{number - 1} chunk(s) stored: {error.message}"
                    ) from None
                raise


def from_settings(
    settings: Mapping[str, Any], role: Role, parameters: Mapping[str, str]
) -> HttpProvider:
    try:
        parsed = Settings.model_validate(settings)
    except ValidationError as error:
        raise ValueError(explain(error)) from None
    if role == "output":
        if parsed.method in _QUERY_METHODS:
            raise ValueError(f"method {parsed.method} cannot carry predictions; use POST or PUT")
        check_parameters(parameters, (OFFSET_KEY,) if parsed.chunk_size else ())
    elif parsed.paging is not None:
        check_parameters(parameters, PAGING_KEYS)
    return HttpProvider(parsed, role)
