"""The one JSON-over-HTTP storage provider that ``http`` and ``krateo`` are dialects of.

Both providers read rows with one request (or one per page), write predictions
with one request per chunk, write keyed chunks when streaming, ask where to
resume, and read their endpoint from a Secret: :class:`JsonHttpProvider` does all
of that once. A dialect (:mod:`runner.storage.http`, :mod:`runner.storage.krateo`)
is its contract entry's model and what differs, as class attributes and small
hooks:

- its Secret's key names (:attr:`JsonHttpProvider.secret_keys`);
- how a request carries its fields (:meth:`JsonHttpProvider.encode`: always a
  JSON body, or the query string of a GET);
- what a 2xx answer must also be (:meth:`JsonHttpProvider.check_answer`);
- how predictions travel (:meth:`JsonHttpProvider.predictions_value`: a list, or
  a JSON-encoded string);
- what a resume question adds (:attr:`JsonHttpProvider.resume_extra`);
- what it says while storing (:meth:`JsonHttpProvider.before_write`,
  :meth:`JsonHttpProvider.chunk_stored`);
- and its probe.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, TypeVar

import orjson
from pydantic import AfterValidator, BaseModel, ValidationError

from runner.storage.base import (
    PAGING_KEYS,
    Page,
    Paging,
    Partition,
    Role,
    SecretReference,
    StorageContext,
    StorageError,
    Stored,
    check_parameters,
    chunks,
    explain,
    keyed_arguments,
    output_body,
    paging_arguments,
    read_secret,
)
from runner.storage.endpoint import Endpoint, SecretKeys, endpoint_from_secret, parse_header_lines
from runner.storage.transport import (
    Answer,
    Retry,
    check_stored,
    next_from,
    page_from,
    rows_from,
    send,
    stored_from,
)

# Where a chunk of a chunked (not keyed) output starts, in the output body.
OFFSET_KEY = "predictions_offset"
# The methods a contract entry may name.
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")

Settings = TypeVar("Settings", bound=BaseModel)
HeaderLines = TypeVar("HeaderLines", list[str], dict[str, str], list[str] | dict[str, str])


@dataclass(frozen=True)
class Route:
    """Where a request goes: its method and its path below the endpoint's URL."""

    method: str
    path: str


# eq=False: a provider is one object with its own endpoint, compared by identity.
@dataclass(eq=False, kw_only=True)
class JsonHttpProvider:
    """A storage provider speaking JSON over HTTP; a dialect subclasses it (module docstring).

    A dialect's ``__init__`` takes its parsed contract entry and passes these fields.
    """

    key: ClassVar[str]
    secret_keys: ClassVar[SecretKeys]
    # Fields a resume question adds to the parameters, job_uid and the shard.
    resume_extra: ClassVar[Mapping[str, str]] = {}

    role: Role
    secret: SecretReference
    headers: dict[str, str]
    data: Route  # where rows are read and predictions written
    resume: Route | None  # where a restarted pod asks what is stored
    rows_field: str
    chunk_size: int | None
    paging: Paging | None  # only an input pages
    _endpoint: Endpoint | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.role != "input":
            self.paging = None

    # -- the dialect's hooks ------------------------------------------------------------

    def encode(self, method: str, fields: Mapping[str, Any]) -> dict[str, Any]:
        """``send``'s ``body`` and ``params`` for a request carrying ``fields``."""
        return {"body": orjson.dumps(fields), "params": None}

    def check_answer(self, answer: Answer) -> None:
        """Refuse a 2xx answer that is not what the storage answers to a success."""

    def predictions_value(self, piece: list[Any]) -> Any:
        """The ``predictions`` field of a write carrying ``piece``."""
        return piece

    def before_write(self, ctx: StorageContext, value: Any) -> None:
        """Called before each (not keyed) write of ``value`` as the predictions."""

    def chunk_stored(self, ctx: StorageContext, number: int, count: int) -> None:
        """Called when chunk ``number`` of ``count`` (not keyed) is stored."""

    # -- what every dialect does the same way -------------------------------------------

    async def prepare(self, ctx: StorageContext) -> None:
        data, source = await read_secret(ctx, self.secret)
        self._endpoint = endpoint_from_secret(data, source, self.secret_keys)

    @property
    def endpoint(self) -> Endpoint:
        if self._endpoint is None:
            raise RuntimeError("prepare() was not called")
        return self._endpoint

    async def call(
        self,
        ctx: StorageContext,
        fields: Mapping[str, Any],
        *,
        retry: Retry,
        route: Route | None = None,
    ) -> Answer:
        """One request carrying ``fields`` to ``route`` (the data route by default)."""
        route = route or self.data
        answer = await send(
            ctx,
            self.endpoint,
            method=route.method,
            path=route.path,
            headers=self.headers,
            retry=retry,
            **self.encode(route.method, fields),
        )
        self.check_answer(answer)
        return answer

    async def load_rows(self, ctx: StorageContext) -> list[Any]:
        answer = await self.call(ctx, dict(ctx.parameters), retry="all")
        return rows_from(answer, self.rows_field)

    async def read_page(
        self, ctx: StorageContext, offset: int, limit: int, part: Partition
    ) -> Page:
        if self.paging is None:
            raise RuntimeError("the input entry has no paging")
        fields = {**ctx.parameters, **paging_arguments(offset, limit, part)}
        answer = await self.call(ctx, fields, retry="all")
        return page_from(answer, self.rows_field, self.paging, offset)

    async def store(self, ctx: StorageContext, predictions: list[Any]) -> None:
        """The predictions, ``chunkSize`` at a time; a write is never repeated (module
        :mod:`runner.storage.transport`), and the first failure stops the run."""
        pieces = chunks(predictions, self.chunk_size)
        for number, (offset, piece) in enumerate(pieces, start=1):
            value = self.predictions_value(piece)
            self.before_write(ctx, value)
            extra = {OFFSET_KEY: str(offset)} if self.chunk_size else None
            try:
                answer = await self.call(ctx, output_body(ctx, value, extra), retry="unsent")
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
                self.chunk_stored(ctx, number, len(pieces))

    async def store_keyed(
        self,
        ctx: StorageContext,
        offset: int,
        predictions: list[Any],
        part: Partition,
        row_count: int | None = None,
    ) -> Stored:
        """One page's predictions, keyed: a write repeated is stored once, so it is retried."""
        stored = duplicates = 0
        counted = True
        for start, piece in chunks(predictions, self.chunk_size):
            extra = keyed_arguments(ctx, offset + start, part)
            body = output_body(ctx, self.predictions_value(piece), extra)
            answer = await self.call(ctx, body, retry="all")
            check_stored(answer)
            done = stored_from(answer)
            if done.stored is None or done.duplicates is None:
                counted = False
            else:
                stored += done.stored
                duplicates += done.duplicates
        return Stored(stored, duplicates) if counted else Stored()

    async def stored_next(self, ctx: StorageContext, part: Partition) -> int | None:
        if self.resume is None:
            return None
        fields = {
            **ctx.parameters,
            "job_uid": ctx.job_id,
            "shard_index": str(part.index),
            "shard_count": str(part.count),
            **self.resume_extra,
        }
        answer = await self.call(ctx, fields, retry="all", route=self.resume)
        return next_from(answer)


def checked_method(method: str, what: str) -> str:
    """``method`` upper-cased, if it is one of :data:`METHODS`; ``what`` names the field."""
    method = method.strip().upper()
    if method not in METHODS:
        raise ValueError(f"{what} must be one of {', '.join(METHODS)}")
    return method


def _header_lines(headers: HeaderLines) -> HeaderLines:
    parse_header_lines(headers)
    return headers


# A contract's ``headers``: ``["Name: value", ...]`` or a mapping, checked when parsed.
Headers = Annotated[list[str] | dict[str, str], AfterValidator(_header_lines)]
HeaderList = Annotated[list[str], AfterValidator(_header_lines)]


def validated(model: type[Settings], settings: Mapping[str, Any]) -> Settings:
    """A contract entry as its dialect's model; ValueError (exit 2) when it does not fit."""
    try:
        return model.model_validate(settings)
    except ValidationError as error:
        raise ValueError(explain(error)) from None


def check_entry_parameters(
    role: Role, parameters: Mapping[str, str], chunk_size: int | None, paging: Paging | None
) -> None:
    """The parameters may not reuse a field the runner adds to this entry's requests."""
    if role == "output":
        check_parameters(parameters, (OFFSET_KEY,) if chunk_size else ())
    elif paging is not None:
        check_parameters(parameters, PAGING_KEYS)
