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
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from runner.storage.base import Paging, Role, SecretReference, StorageContext, StorageRejected
from runner.storage.endpoint import SecretKeys, parse_header_lines
from runner.storage.jsonhttp import (
    HeaderList,
    JsonHttpProvider,
    Route,
    check_entry_parameters,
    checked_method,
    validated,
)
from runner.storage.transport import Answer, probe_request

KEY = "krateo"
ARGUMENT_LIMIT = 128 * 1024
# Notebook names quoted at most when the configured one is missing.
NAMES_IN_MESSAGE = 20


class _Settings(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class EndpointRef(SecretReference, _Settings):
    pass


class Api(_Settings):
    endpoint_ref: EndpointRef
    path: str = ""
    verb: str = "GET"
    headers: HeaderList = Field(default_factory=list)
    payload: Any = None

    @field_validator("verb")
    @classmethod
    def _verb(cls, verb: str) -> str:
        return checked_method(verb.strip() or "GET", "verb")


class Settings(_Settings):
    api: Api
    chunk_size: int | None = Field(default=None, ge=1)
    paging: Paging | None = None
    resume_path: str | None = Field(default=None, min_length=1)


SECRET_KEYS = SecretKeys(
    url="server-url",
    ca="certificate-authority-data",
    proxy="proxy-url",
    client_cert="client-certificate-data",
    client_key="client-key-data",
)


class KrateoProvider(JsonHttpProvider):
    """The ``krateo`` dialect: ``api``'s verb and path, a JSON body always, JSON answers."""

    key = KEY
    secret_keys = SECRET_KEYS
    resume_extra = {"progress": "true"}

    def __init__(self, settings: Settings, role: Role) -> None:
        api = settings.api
        headers = parse_header_lines(api.headers)
        if not any(name.lower() == "accept" for name in headers):
            headers["Accept"] = "application/json"
        resume = None if settings.resume_path is None else Route(api.verb, settings.resume_path)
        super().__init__(
            role=role,
            secret=api.endpoint_ref,
            headers=headers,
            data=Route(api.verb, api.path),
            resume=resume,
            rows_field="result",
            chunk_size=settings.chunk_size,
            paging=settings.paging,
        )
        self.settings = settings

    async def prepare(self, ctx: StorageContext) -> None:
        if self.settings.api.payload is not None:
            ctx.log.warning(
                "api.payload is ignored, as upstream: the body is the run's parameters",
                role=self.role,
            )
        await super().prepare(ctx)

    def check_answer(self, answer: Answer) -> None:
        if "json" not in answer.content_type.lower():
            raise StorageRejected(
                f"{answer.what} answered {answer.status} with content type "
                f"{answer.content_type or '(none)'}, not JSON (finops-database-handler answers "
                f"JSON only to 'Accept: application/json', exactly): {answer.text()}"
            )

    def predictions_value(self, piece: list[Any]) -> Any:
        # As upstream: the handler passes predictions to the notebook as one string.
        return orjson.dumps(piece).decode()

    def before_write(self, ctx: StorageContext, value: Any) -> None:
        if self.chunk_size is None and len(value) >= ARGUMENT_LIMIT:
            ctx.log.warning(
                "the predictions argument exceeds what finops-database-handler can pass "
                "to a notebook; set chunkSize in the output's krateo entry",
                bytes=len(value),
                limitBytes=ARGUMENT_LIMIT,
            )

    def chunk_stored(self, ctx: StorageContext, number: int, count: int) -> None:
        ctx.log.info("predictions chunk stored", chunk=number, chunks=count)

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


def from_settings(
    settings: Mapping[str, Any], role: Role, parameters: Mapping[str, str]
) -> KrateoProvider:
    parsed = validated(Settings, settings)
    check_entry_parameters(role, parameters, parsed.chunk_size, parsed.paging)
    return KrateoProvider(parsed, role)
