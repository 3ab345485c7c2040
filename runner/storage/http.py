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
from pydantic import Field, field_validator

from runner.storage.base import EntrySettings, Paging, Role, SecretRef, StorageContext, StorageError
from runner.storage.endpoint import SecretKeys, parse_header_lines
from runner.storage.jsonhttp import (
    Headers,
    JsonHttpProvider,
    Route,
    check_entry_parameters,
    checked_method,
    validated,
)
from runner.storage.transport import probe_request

KEY = "http"
_QUERY_METHODS = ("GET", "DELETE")


class Settings(EntrySettings):
    secret_ref: SecretRef
    method: str = "POST"
    path: str = ""
    headers: Headers = Field(default_factory=list)
    rows_field: str = "result"
    predictions_as: Literal["array", "string"] = "array"
    chunk_size: int | None = Field(default=None, ge=1)
    paging: Paging | None = None
    resume_path: str | None = Field(default=None, min_length=1)
    resume_method: str = "GET"

    @field_validator("method", "resume_method")
    @classmethod
    def _method(cls, method: str) -> str:
        return checked_method(method, "method")


class HttpProvider(JsonHttpProvider):
    """The ``http`` dialect: the contract's method and path, fields in a GET's query."""

    key = KEY
    secret_keys = SecretKeys(url="url", ca="ca")

    def __init__(self, settings: Settings, role: Role) -> None:
        resume = None
        if settings.resume_path is not None:
            resume = Route(settings.resume_method, settings.resume_path)
        super().__init__(
            role=role,
            secret=settings.secret_ref,
            headers=parse_header_lines(settings.headers),
            data=Route(settings.method, settings.path),
            resume=resume,
            rows_field=settings.rows_field,
            chunk_size=settings.chunk_size,
            paging=settings.paging,
        )
        self.settings = settings

    def encode(self, method: str, fields: Mapping[str, Any]) -> dict[str, Any]:
        if method in _QUERY_METHODS:
            return {"body": None, "params": {k: str(v) for k, v in fields.items()}}
        return super().encode(method, fields)

    def predictions_value(self, piece: list[Any]) -> Any:
        if self.settings.predictions_as == "string":
            return orjson.dumps(piece).decode()
        return piece

    async def probe(self, ctx: StorageContext) -> str:
        """A HEAD of the base URL: reachable, credentials not refused (see "Probe" above)."""
        answer = await probe_request(
            ctx, self.endpoint, method="HEAD", path="", headers=self.headers
        )
        return f"{answer.what} answered {answer.status}"

    async def store(self, ctx: StorageContext, predictions: list[Any]) -> None:
        # from_settings refuses such an output entry; this guards a provider built directly.
        if self.settings.method in _QUERY_METHODS:
            raise StorageError(f"cannot send predictions with {self.settings.method}")
        await super().store(ctx, predictions)


def from_settings(
    settings: Mapping[str, Any], role: Role, parameters: Mapping[str, str]
) -> HttpProvider:
    parsed = validated(Settings, settings)
    if role == "output" and parsed.method in _QUERY_METHODS:
        raise ValueError(f"method {parsed.method} cannot carry predictions; use POST or PUT")
    check_entry_parameters(role, parameters, parsed.chunk_size, parsed.paging)
    return HttpProvider(parsed, role)
