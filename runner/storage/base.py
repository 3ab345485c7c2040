"""What every storage provider shares: the provider protocol, errors, settings, paging, bodies.

A provider is a module of this package exposing
``from_settings(settings, role, parameters) -> StorageProvider`` (see
:mod:`runner.storage`). It turns its contract entry into a provider object,
or raises :class:`ValueError` (the contract is wrong: exit 2). At run time it
raises :class:`StorageError` when another attempt may succeed (exit 3 for the
input, 5 for the output), and :class:`StorageRejected` when none can (exit 6 for
the input, 8 for the output; the Job is not retried): the storage answered a
4xx other than 408/429, or a 2xx that is not what it should be (not rows, an
error text instead of storing). :mod:`runner.storage.transport` makes that
distinction for every HTTP provider.

Both HTTP providers send the same output body: ``job_uid``, ``pod_uid``,
``predictions`` and the run's parameters (:func:`output_body`); no parameter may
reuse those names (:func:`check_parameters`, enforced before any I/O).

The HTTP providers' common parts live beside this module, one topic each:
:mod:`runner.storage.endpoint` (where a storage is: URL, credentials, TLS, from a
Secret), :mod:`runner.storage.transport` (a request, its retries, what its answer
means) and :mod:`runner.storage.jsonhttp` (the provider both are dialects of).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from runner.retry import Deadline
from runner.secrets import SecretError, SecretReader

Role = Literal["input", "output"]
RESERVED_OUTPUT_KEYS = ("job_uid", "pod_uid", "predictions")


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
    # The pod's shard: where a provider that keys its rows puts an unpaged run's output.
    part: Partition = field(default_factory=lambda: Partition())


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


class EntrySettings(BaseModel):
    """A provider's settings from its contract entry: camelCase keys, none unknown, frozen."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class SecretReference(BaseModel):
    """A contract's reference to a Secret: ``namespace`` defaults to the pod's.

    A provider's model subclasses it with the provider's model config.
    """

    name: str = Field(min_length=1)
    namespace: str | None = None


class SecretRef(SecretReference, EntrySettings):
    """An entry's ``secretRef``, as strict as the entry."""


async def read_secret(ctx: StorageContext, ref: SecretReference) -> tuple[Mapping[str, str], str]:
    """The referenced Secret's data, and ``Secret <namespace>/<name>`` to name it in messages.

    A reference without a namespace names the pod's. A Secret that cannot be read
    (not there yet, no access) is a :class:`StorageError`: another attempt may read it.
    """
    namespace = ref.namespace or ctx.namespace
    try:
        data = await ctx.secrets.read(namespace, ref.name)
    except SecretError as error:
        raise StorageError(str(error)) from None
    return data, f"Secret {namespace}/{ref.name}"


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
    """An output provider that stores keyed (idempotent) chunks and says what is stored.

    It may also define ``async finish_keyed(ctx, part, rows)``, called once when the
    shard's ``rows`` rows are all stored (an ``s3`` output writes its manifest then),
    and set ``streams_only = True`` when it cannot store a run that does not stream.
    """

    async def store_keyed(
        self,
        ctx: StorageContext,
        offset: int,
        predictions: list[Any],
        part: Partition,
        row_count: int | None = None,
    ) -> Stored:
        """The predictions of the shard's rows ``[offset, offset + row_count)``."""
        ...

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
