"""``krateo``: Krateo's finops-database-handler (or anything speaking its API).

Contract entry (upstream's shape, accepted unchanged)::

    krateo:
      api:
        endpointRef: {name: finops-database-handler-endpoint, namespace: krateo-system}
        path: /compute/sklearninput      # joined to the Secret's server-url
        verb: POST                       # default GET, as upstream
        headers: ["Accept: application/json"]
        payload: ...                     # ignored, as upstream: the body is the parameters
      chunkSize: 20000                   # output only, optional (see below)
      paging: {pageSize: 10000, pagesInFlight: 2}   # input only, optional (see below)
      resumePath: /compute/sklearnoutput    # output only, optional: resume (see below)

**Secret** (``endpointRef``; its namespace defaults to the pod's): ``server-url``
(required); ``username``/``password`` (Basic) or ``token`` (Bearer);
``certificate-authority-data`` (PEM, or base64 of PEM as in a kubeconfig);
``client-certificate-data``/``client-key-data``; ``insecure`` (Go ParseBool);
``proxy-url`` (http/https).

**Request.** ``<server-url>/<path>`` with ``verb``, the contract's headers (an
``Accept: application/json`` is added when they set none: the handler answers
JSON only to exactly that) and the run's parameters as the JSON body. The handler
passes body values to its notebook as ``key=value`` arguments, so they are all
strings (the contract guarantees it).

**Answers.** The handler answers 200 even when its notebook fails, with the error
text as the body. So a 2xx is a success only if it is what it should be:

- input: a JSON content type and ``{"result": [[...], ...]}``;
- output: a JSON content type and an empty (what the output notebooks print) or
  JSON body. Anything else fails the run with the handler's text, as a
  rejection (exit 6 for the input, 8 for the output: the same request gets the
  same answer, so the Job is not retried). So does a 4xx other than 408/429
  (401 for a wrong password, 404 for an unknown notebook); connection errors,
  timeouts, 5xx, 429 and 408 exit 3 or 5, and the Job may retry.

**Output body.** ``job_uid`` (the contract's ``jobId``), ``pod_uid`` (env
``pod_uid``), ``predictions`` (the predictions as a JSON-encoded string, as
upstream) and the parameters, which may not reuse those names.

**chunkSize.** Without it the output is one request, as upstream. The handler
passes ``predictions`` as one process argument, which Linux limits to 128 KiB
(about 40k single-digit predictions); with ``chunkSize: N`` the runner writes N
predictions per request, adding ``predictions_offset`` (the position of the
chunk's first prediction) so that a notebook can keep its counter global
(``hack/storage_service.py``'s does; upstream's notebooks ignore it and restart
their counter at 0 for every chunk). Chunks go one after the other and the first
failure stops the run: the chunks already stored carry the run's ``job_uid`` and
this pod's ``pod_uid``, so they can be told apart from a retry's.

**paging** (input). Without it the input is one request, as upstream. With
``paging: {pageSize: N}`` the runner reads pages: the notebook gets the run's
parameters plus ``offset``, ``limit`` (N), ``shard_index`` and ``shard_count`` (all
strings, as every handler argument) and answers ``{"result": [...rows], "total":
<rows in the shard, optional>}``; a page shorter than N is the last. ``offset``
counts the shard's rows (shard ``s`` of ``c`` is the input positions ``p`` with
``p % c == s``), so a sharded pod reads only its own rows. The notebook must honour
those arguments (``hack/storage_service.py``'s ``sklearninput`` does; upstream's
ignores them and would answer the whole table to every page: do not page with
it). A paged input makes the run stream (:mod:`runner.streaming`): each page's
predictions are one keyed write, carrying ``predictions_offset``,
``shard_index``, ``shard_count`` and ``idempotency_key``, answered with ``{"stored":
n, "duplicates": m}`` or nothing; ``chunkSize`` still splits a page's write.

**resumePath** (output). The notebook asked, with the verb and headers of
``api``, the parameters, ``job_uid``, ``shard_index``, ``shard_count`` and
``progress=true``, what this run's shard already stored: ``{"stored": n, "next":
k}``; a restarted pod of a streaming run continues at the shard's row ``k``
(``hack/storage_service.py``'s output notebooks answer it).

**Probe** (``python -m runner --check``, :meth:`KrateoProvider.probe`): ``GET
<server-url>/compute/list`` with the Secret's credentials and the contract's
headers, when ``path`` names a notebook (``[prefix/]compute/<notebook>``).
finops-database-handler answers it with the names of its notebooks, read from its
notebook table: no notebook runs, no data table is read or written. The probe
then requires the configured notebook among them, and ``Accept:
application/json`` in the headers a run will send. A 401/403 (no or refused
credentials) is a rejection (exit 6/8), as is any other 4xx (``server-url`` does
not lead to the handler's ``/compute`` API), a non-JSON answer, a notebook the
handler does not have, or another ``Accept``; no connection, a timeout, a 5xx
(the handler's database refused its query, a wrong password among other causes),
408 and 429 exit 3/5. A ``path`` that names no notebook is probed with a ``GET``
of ``server-url`` itself, where any answer but 401/403 and 5xx proves the server
reachable (the handler answers its homepage there, without checking credentials).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from runner.secrets import SecretError
from runner.storage.base import (
    PAGING_KEYS,
    Answer,
    Endpoint,
    Page,
    Paging,
    Partition,
    Role,
    StorageContext,
    StorageError,
    StorageRejected,
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

KEY = "krateo"
ARGUMENT_LIMIT = 128 * 1024
OFFSET_KEY = "predictions_offset"
_VERBS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# Notebook names quoted at most when the configured one is missing.
NAMES_IN_MESSAGE = 20


class _Settings(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class EndpointRef(_Settings):
    name: str = Field(min_length=1)
    namespace: str | None = None


class Api(_Settings):
    endpoint_ref: EndpointRef
    path: str = ""
    verb: str = "GET"
    headers: list[str] = Field(default_factory=list)
    payload: Any = None

    @field_validator("verb")
    @classmethod
    def _verb(cls, verb: str) -> str:
        verb = verb.strip().upper() or "GET"
        if verb not in _VERBS:
            raise ValueError(f"verb must be one of {', '.join(_VERBS)}")
        return verb

    @field_validator("headers")
    @classmethod
    def _headers(cls, headers: list[str]) -> list[str]:
        parse_header_lines(headers)
        return headers


class Settings(_Settings):
    api: Api
    chunk_size: int | None = Field(default=None, ge=1)
    paging: Paging | None = None
    resume_path: str | None = Field(default=None, min_length=1)


class KrateoProvider:
    key = KEY

    def __init__(self, settings: Settings, role: Role) -> None:
        self.settings = settings
        self.role = role
        self.headers = parse_header_lines(settings.api.headers)
        if not any(name.lower() == "accept" for name in self.headers):
            self.headers["Accept"] = "application/json"
        self._endpoint: Endpoint | None = None
        self.paging = settings.paging if role == "input" else None

    async def prepare(self, ctx: StorageContext) -> None:
        if self.settings.api.payload is not None:
            ctx.log.warning(
                "api.payload is ignored, as upstream: the body is the run's parameters",
                role=self.role,
            )
        ref = self.settings.api.endpoint_ref
        namespace = ref.namespace or ctx.namespace
        source = f"Secret {namespace}/{ref.name}"
        try:
            data = await ctx.secrets.read(namespace, ref.name)
        except SecretError as error:
            raise StorageError(str(error)) from None
        self._endpoint = endpoint_from_secret(data, source)

    @property
    def endpoint(self) -> Endpoint:
        if self._endpoint is None:
            raise RuntimeError("prepare() was not called")
        return self._endpoint

    async def _call(
        self, ctx: StorageContext, body: Mapping[str, Any], retry: Any, path: str | None = None
    ) -> Answer:
        answer = await send(
            ctx,
            self.endpoint,
            method=self.settings.api.verb,
            path=self.settings.api.path if path is None else path,
            headers=self.headers,
            body=orjson.dumps(body),
            retry=retry,
        )
        if "json" not in answer.content_type.lower():
            raise StorageRejected(
                f"{answer.what} answered {answer.status} with content type "
                f"{answer.content_type or '(none)'}, not JSON (finops-database-handler answers "
                f"JSON only to 'Accept: application/json', exactly): {answer.text()}"
            )
        return answer

    async def load_rows(self, ctx: StorageContext) -> list[Any]:
        answer = await self._call(ctx, dict(ctx.parameters), retry="all")
        return rows_from(answer, "result")

    async def store(self, ctx: StorageContext, predictions: list[Any]) -> None:
        pieces = chunks(predictions, self.settings.chunk_size)
        for number, (offset, piece) in enumerate(pieces, start=1):
            encoded = orjson.dumps(piece).decode()
            if self.settings.chunk_size is None and len(encoded) >= ARGUMENT_LIMIT:
                ctx.log.warning(
                    "the predictions argument exceeds what finops-database-handler can pass "
                    "to a notebook; set chunkSize in the output's krateo entry",
                    bytes=len(encoded),
                    limitBytes=ARGUMENT_LIMIT,
                )
            extra = {OFFSET_KEY: str(offset)} if self.settings.chunk_size else None
            try:
                answer = await self._call(ctx, output_body(ctx, encoded, extra), retry="unsent")
                check_stored(answer)
            except StorageError as error:
                if len(pieces) > 1:
                    # Same class: a refused chunk is as permanent as a refused write.
                    raise type(error)(
                        f"chunk {number} of {len(pieces)} (predictions from {offset}) failed, "
                        f"{number - 1} chunk(s) stored: {error.message}"
                    ) from None
                raise
            if len(pieces) > 1:
                ctx.log.info("predictions chunk stored", chunk=number, chunks=len(pieces))

    async def read_page(
        self, ctx: StorageContext, offset: int, limit: int, part: Partition
    ) -> Page:
        if self.paging is None:
            raise RuntimeError("the input entry has no paging")
        body = {**ctx.parameters, **paging_arguments(offset, limit, part)}
        answer = await self._call(ctx, body, retry="all")
        return page_from(answer, "result", self.paging, offset)

    async def store_keyed(
        self, ctx: StorageContext, offset: int, predictions: list[Any], part: Partition
    ) -> Stored:
        """One page's predictions, keyed: a write repeated is stored once, so it is retried."""
        stored = duplicates = 0
        counted = True
        for start, piece in chunks(predictions, self.settings.chunk_size):
            extra = keyed_arguments(ctx, offset + start, part)
            body = output_body(ctx, orjson.dumps(piece).decode(), extra)
            answer = await self._call(ctx, body, retry="all")
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
        body = {
            **ctx.parameters,
            "job_uid": ctx.job_id,
            "shard_index": str(part.index),
            "shard_count": str(part.count),
            "progress": "true",
        }
        answer = await self._call(ctx, body, retry="all", path=self.settings.resume_path)
        return next_from(answer)

    async def probe(self, ctx: StorageContext) -> str:
        """Reachable, credentials accepted, notebook present: see "Probe" above. No data moves."""
        path, notebook = probe_target(self.settings.api.path)
        answer = await probe_request(
            ctx, self.endpoint, method="GET", path=path, headers=self.headers
        )
        if notebook is None:
            return f"{answer.what} answered {answer.status}"
        if not 200 <= answer.status < 300:
            raise StorageRejected(
                f"{answer.what} answered {answer.status}: {answer.text()} (server-url does not "
                "lead to finops-database-handler's /compute API)"
            )
        try:
            names = notebook_names(answer.json())
        except orjson.JSONDecodeError:
            raise StorageRejected(
                f"{answer.what} answered {answer.status} with something that is not JSON: "
                f"{answer.text()}"
            ) from None
        if notebook not in names:
            shown = ", ".join(sorted(names)[:NAMES_IN_MESSAGE]) or "none"
            if len(names) > NAMES_IN_MESSAGE:
                shown += f", and {len(names) - NAMES_IN_MESSAGE} more"
            raise StorageRejected(
                f"finops-database-handler at {self.endpoint.base_url} has no notebook "
                f"{notebook!r} (it has: {shown})"
            )
        accept = next((v for k, v in self.headers.items() if k.lower() == "accept"), "")
        if accept != "application/json":
            raise StorageRejected(
                f"api.headers set 'Accept: {accept}': finops-database-handler answers notebook "
                "calls as JSON only to 'Accept: application/json', exactly"
            )
        return f"{answer.what} lists notebook {notebook}"


def probe_target(path: str) -> tuple[str, str | None]:
    """What the probe GETs for an ``api.path``, and the notebook it must find there."""
    parts = [part for part in path.strip().split("/") if part]
    if len(parts) >= 2 and parts[-2] == "compute" and parts[-1] != "list":
        return "/".join([*parts[:-1], "list"]), parts[-1]
    return "", None


def notebook_names(listing: Any) -> set[str]:
    """The names in finops-database-handler's ``/compute/list`` answer (rows of ``[name]``)."""
    names: set[str] = set()
    for entry in listing if isinstance(listing, list) else []:
        if isinstance(entry, str):
            names.add(entry)
        elif isinstance(entry, list) and entry and isinstance(entry[0], str):
            names.add(entry[0])
        elif isinstance(entry, dict):
            names.update(value for value in entry.values() if isinstance(value, str))
    return names


def endpoint_from_secret(data: Mapping[str, str], source: str) -> Endpoint:
    server_url = (data.get("server-url") or "").strip()
    if not server_url:
        raise StorageError(f"{source} has no server-url")
    return build_endpoint(
        url=server_url,
        token=data.get("token") or None,
        username=data.get("username"),
        password=data.get("password") or None,
        ca_data=data.get("certificate-authority-data") or None,
        insecure=parse_bool(data.get("insecure", "").strip(), "insecure"),
        proxy_url=(data.get("proxy-url") or "").strip() or None,
        client_cert=data.get("client-certificate-data") or None,
        client_key=data.get("client-key-data") or None,
        source=source,
    )


def from_settings(
    settings: Mapping[str, Any], role: Role, parameters: Mapping[str, str]
) -> KrateoProvider:
    try:
        parsed = Settings.model_validate(settings)
    except ValidationError as error:
        raise ValueError(explain(error)) from None
    if role == "output":
        check_parameters(parameters, (OFFSET_KEY,) if parsed.chunk_size else ())
    elif parsed.paging is not None:
        check_parameters(parameters, PAGING_KEYS)
    return KrateoProvider(parsed, role)
