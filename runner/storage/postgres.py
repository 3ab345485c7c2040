"""``postgres``: rows from a ``SELECT``, predictions into a table, exactly once.

Works with PostgreSQL and the databases that speak its protocol (CockroachDB,
which backs finops-database-handler). Contract entry (keys marked *input* or
*output* apply to that side only)::

    postgres:
      host: features-db.data.svc     # required
      port: 5432
      database: features             # required
      user: batch                    # or the Secret's username
      secretRef: {name: features-db, namespace: data}   # password (required), username, ca
      sslmode: verify-full           # libpq's: disable, allow, prefer (default), require,
                                     # verify-ca, verify-full
      connectTimeoutSeconds: 10
      requestTimeoutSeconds: 300     # one query, one page, one chunk's write
      # input
      query: SELECT id, a, b, c FROM samples WHERE day = $day
      paging: {pageSize: 10000, key: id, pagesInFlight: 2}
      # output
      table: predictions             # or schema.table
      createTable: false             # true: create it if it is missing (below)
      resume: true                   # a restarted pod continues after the stored rows

**Secret** keys: ``password`` (required), ``username`` (when ``user`` is not
set), ``ca`` (a PEM bundle to trust, for ``sslmode: verify-ca``/``verify-full``).
The password is never written anywhere (the runner's redaction hides it too).

**Input.** ``query`` is one ``SELECT``. ``$name`` in it (outside strings, quoted
identifiers, comments and dollar quotes) is bound to the run's parameter
``name``: sent as a query parameter, never formatted into the SQL, typed by the
server as a literal would be (``WHERE day = $day`` with ``day: "2024-05-01"``
compares dates). A name the parameters do not give fails the run (exit 2).
Numeric columns become floats. Rows are objects with named columns, so the
input entry's ``columns``, ``keyColumn`` and ``passthroughColumns`` pick the
model's features and the carried columns (without ``columns`` every column is a
feature, but the carried ones).

Without ``paging`` the query is run once and every row read. With
``paging: {pageSize: N, key: k}`` the run streams (:mod:`runner.streaming`): the
query is wrapped as ``SELECT * FROM (query) AS input WHERE input.k > $last ORDER
BY input.k LIMIT ...`` (keyset paging, no ``OFFSET``), so ``k`` must be a unique,
non-null column of the query's result, ideally indexed. A row's *position* is
its place in that order.

**Columnar pages.** A streaming run does not read a page row by row: the server
writes it as CSV (one value per page, ``string_agg`` of each row's columns in
their text form) and Arrow parses it into columns of the query's result types,
so no Python object is made per row; the features go to the model as JSON text
and a page's output goes back into ``COPY ... (FORMAT csv)`` as one buffer
Arrow writes (:mod:`runner.storage._pgcolumnar`, which says which types and
pages take the row path instead; the values are the same either way).

**Shards** split by position: shard ``s`` of ``c`` takes the positions ``p`` with
``p % c == s``, the same rule as every provider, so the same input is split the
same way each time. Each shard's page query walks a window of ``c x pageSize``
rows of the key range and the server keeps every ``c``-th (``row_number()``
over the window), so only the shard's own rows travel and are decoded; the
database still reads the whole range once per shard, and needs no knowledge of
the key's values. A shard that starts (or resumes) past position 0 finds its
first key with one ``OFFSET`` query, once.

**Output.** Each chunk (one page of a streaming run, ``chunkSize`` predictions
otherwise) goes in one transaction: ``COPY`` into a session's temporary staging
table, then ``INSERT INTO table ... SELECT ... FROM staging ON CONFLICT (run_uid,
shard, row_index) DO NOTHING``. A row is keyed by the run (``run_uid``, the Job's
uid), the shard and ``row_index``, its input position, so a chunk written again
(a retry after a lost connection, a pod redoing a page) is stored once, and is
therefore retried like a read. The table must have the columns ``run_uid``,
``shard``, ``row_index`` and ``prediction``, one for each carried column (the
input's ``keyColumn`` and ``passthroughColumns``), and a unique key or primary
key on ``(run_uid, shard, row_index)``; ``pod_uid`` is filled when it has one.
With ``createTable: true`` a missing table is created with those columns (types
from the first chunk's values: ``bigint``, ``double precision``, ``text``,
``boolean``, ``jsonb`` for lists and objects) and that primary key.

**Resume** (``resume``, default true). A pod first reads the highest stored
``row_index`` of its shard for the run and continues after it: chunks are written
in order, one transaction each, so what is stored is a prefix of the shard.

**Errors.** Lost connections, a server starting or shutting down, timeouts,
lack of resources (a full disk) and serialization failures are retried with
backoff (the whole restart of a server is waited for), then exit 3/5. Refusals
are not retried (exit 6/8): a wrong password or user, a database, table or
column that does not exist, a query that does not parse, a table without the
conflict key, values the table's types refuse. Messages quote the server's own
words and name the server (``host:port/database``), never the password.

**Probe** (``python -m runner --check``): connects (the credentials), ``PREPARE``s
the input query as a run sends it (it parses, its tables and columns exist, the
paging key is a column of it) and deallocates it; for the output, the table
exists with the conflict key (or, with ``createTable``, may be created in its
schema). No row is read or written.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any, Literal, TypeVar, cast

import orjson
import psycopg
import pyarrow as pa
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row, tuple_row
from psycopg.types.numeric import FloatLoader
from pydantic import Field, ValidationError, field_validator

from contract.exitcodes import ContractError
from runner.retry import GaveUp, RetryPolicy, Transient, call_with_retries, log_retries
from runner.storage._columnar import ArrowRows
from runner.storage._pgcolumnar import CsvLayout, Records, TextLoader, csv_chunk, csv_ready
from runner.storage.base import (
    EntrySettings,
    Page,
    Paging,
    Partition,
    Role,
    SecretRef,
    StorageContext,
    StorageError,
    StorageRejected,
    Stored,
    chunks,
    explain,
    read_secret,
)

KEY = "postgres"
# The output table's key: the run, the shard, the input row's position.
KEY_COLUMNS = ("run_uid", "shard", "row_index")
PREDICTION = "prediction"
POD_COLUMN = "pod_uid"
RESERVED = (*KEY_COLUMNS, POD_COLUMN)
STAGING = "ksc_staging"
APPLICATION_NAME = "kserve-inference-runner"
# A server restart takes seconds: back off up to 8 s, about 40 s in all.
RETRY = RetryPolicy(max_retries=8, initial_backoff=0.5, max_backoff=8.0)
RETRY_EVENT = "postgres request failed, retrying"
# SQLSTATE classes worth another attempt: connection exception, insufficient
# resources (disk full, too many connections), operator intervention (shutdown,
# starting up), transaction rollback (serialization, deadlock), lock not available.
TRANSIENT_CLASSES = ("08", "53", "57", "40", "55")
# What a failed connection says when the server refused it (no SQLSTATE is given).
_REFUSED_CONNECTION = re.compile(
    r"password authentication failed|no pg_hba\.conf entry|role .* does not exist|"
    r"database .* does not exist|certificate verify failed|server does not support SSL|"
    r"root certificate file .* does not exist|SSL error"
)
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_IDENTIFIER = re.compile(rf"^{_NAME}$")
_DOLLAR_QUOTE = re.compile(rf"\$(?:{_NAME})?\$")
_PARAMETER = re.compile(rf"\$({_NAME})")
_POSITIONAL = re.compile(r"\$\d")

T = TypeVar("T")


# The columns a sharded page's query adds to each row (read_page takes them out).
_NUMBER, _SCANNED, _LAST = "_ksc_row_number", "_ksc_window_rows", "_ksc_window_last_key"


class KeysetPaging(Paging):
    """``paging`` with the column the pages are ordered and cut by."""

    key: str = Field(min_length=1, max_length=63)

    @field_validator("key")
    @classmethod
    def _key(cls, key: str) -> str:
        return identifier(key, "paging.key")


class Settings(EntrySettings):
    host: str = Field(min_length=1)
    port: int = Field(default=5432, ge=1, le=65535)
    database: str = Field(min_length=1)
    user: str | None = Field(default=None, min_length=1)
    secret_ref: SecretRef
    sslmode: Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"] = "prefer"
    connect_timeout_seconds: int = Field(default=10, ge=1, le=600)
    request_timeout_seconds: float = Field(default=300.0, gt=0)
    query: str | None = Field(default=None, min_length=1)
    paging: KeysetPaging | None = None
    table: str | None = Field(default=None, min_length=1)
    create_table: bool = False
    resume: bool = True
    chunk_size: int = Field(default=10_000, ge=1, le=1_000_000)

    @field_validator("table")
    @classmethod
    def _table(cls, table: str) -> str:
        parts = table.split(".")
        if len(parts) > 2:
            raise ValueError(f"table {table!r}: expected name or schema.name")
        for part in parts:
            identifier(part, "table")
        return table


def identifier(name: str, what: str) -> str:
    """``name`` if it is a plain SQL name (it is quoted where used); ValueError otherwise."""
    if not _IDENTIFIER.match(name) or len(name) > 63:
        raise ValueError(f"{what} {name!r}: expected a name of [A-Za-z_][A-Za-z0-9_]*, 63 at most")
    return name


# -- the query's $name parameters --------------------------------------------------------


def bind_names(query: str) -> tuple[str, list[str]]:
    """``query`` with each ``$name`` made ``$k``, and the names in ``k`` order.

    Strings (``'...'``, ``E'...'``), quoted identifiers, comments and dollar-quoted
    bodies are copied as they are. ``$1``-style parameters are refused: the
    run's parameters have names. A trailing ``;`` is dropped (the query is
    wrapped for paging). ValueError when the text cannot be a single query.
    """
    text = query.strip().rstrip(";").rstrip()
    out: list[str] = []
    names: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "'":
            escapes = i > 0 and text[i - 1] in "eE" and (i < 2 or not _word(text[i - 2]))
            end = _string_end(text, i, escapes)
        elif c == '"':
            end = _string_end(text, i, False, quote='"')
        elif text.startswith("--", i):
            newline = text.find("\n", i)
            end = n if newline < 0 else newline
        elif text.startswith("/*", i):
            end = _comment_end(text, i)
        elif c == "$" and not (i > 0 and _word(text[i - 1])):
            quote = _DOLLAR_QUOTE.match(text, i)
            name = _PARAMETER.match(text, i)
            if quote:
                close = text.find(quote.group(), quote.end())
                if close < 0:
                    raise ValueError(f"query: the dollar quote {quote.group()} is not closed")
                end = close + len(quote.group())
            elif name:
                if name.group(1) not in names:
                    names.append(name.group(1))
                out.append(f"${names.index(name.group(1)) + 1}")
                i = name.end()
                continue
            elif _POSITIONAL.match(text, i):
                raise ValueError(
                    "query: use the run's parameters by name ($day), not by number ($1)"
                )
            else:
                end = i + 1
        else:
            end = i + 1
        out.append(text[i:end])
        i = end
    if not text:
        raise ValueError("query is empty")
    return "".join(out), names


def _word(c: str) -> bool:
    return c.isalnum() or c in "_$"


def _string_end(text: str, start: int, escapes: bool, quote: str = "'") -> int:
    i = start + 1
    while i < len(text):
        if escapes and text[i] == "\\":
            i += 2
            continue
        if text[i] == quote:
            if text.startswith(quote * 2, i):
                i += 2
                continue
            return i + 1
        i += 1
    what = "string" if quote == "'" else "quoted identifier"
    raise ValueError(f"query: a {what} is not closed")


def _comment_end(text: str, start: int) -> int:
    depth, i = 0, start
    while i < len(text):
        if text.startswith("/*", i):
            depth += 1
            i += 2
        elif text.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    raise ValueError("query: a /* comment */ is not closed")


# -- values --------------------------------------------------------------------------


def column_type(value: Any) -> str:
    """The type ``createTable`` gives a column whose first value is ``value``."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint"
    if isinstance(value, float | Decimal):
        return "double precision"
    if isinstance(value, list | dict):
        return "jsonb"
    return "text"


def copy_value(value: Any) -> Any:
    """A value as ``COPY`` takes it: lists and objects as JSON text, booleans as words.

    psycopg writes a boolean as ``t``/``f``, which a ``boolean`` column reads
    but a ``text`` column keeps as ``t`` and a ``jsonb`` one refuses; ``true`` and
    ``false`` are what PostgreSQL itself gives for a boolean cast to text, what
    the columnar path writes (Arrow's CSV) and JSON's words: every column type
    that takes a boolean reads them.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return orjson.dumps(value).decode()
    return value


def first_values(predictions: Sequence[Any], carried: Sequence[str]) -> list[Any]:
    """The first row's values as given (lists, objects not yet JSON): createTable types them."""
    first = predictions[0]
    if not isinstance(first, dict):
        return [first]
    return [first.get(name) for name in (*carried, PREDICTION)]


def output_rows(
    predictions: Sequence[Any],
) -> tuple[list[str], list[list[Any]]]:
    """The carried column names and each row's values (carried, then the prediction).

    A prediction is the model's value, or (with ``keyColumn``/``passthroughColumns``,
    :mod:`runner.join`) an object of the carried columns and ``prediction``.
    """
    first = predictions[0] if predictions else None
    if not isinstance(first, dict):
        return [], [[copy_value(value)] for value in predictions]
    carried = checked_carried([name for name in first if name != PREDICTION])
    names = [*carried, PREDICTION]
    return carried, [[copy_value(row.get(name)) for name in names] for row in predictions]


def checked_carried(carried: list[str]) -> list[str]:
    """The carried column names; StorageRejected when one is a column the runner fills."""
    clash = sorted(set(carried) & set(RESERVED))
    if clash:
        raise StorageRejected(
            f"the carried column(s) {clash} would overwrite the output table's own "
            f"({', '.join(RESERVED)}): rename them in the query"
        )
    return carried


# -- errors --------------------------------------------------------------------------


def failure(where: str, what: str, error: BaseException) -> Exception:
    """The error for a failed operation: :class:`Transient`, a refusal, or a failure."""
    if isinstance(error, TimeoutError):
        return Transient(f"{where}: {what} timed out")
    state = getattr(error, "sqlstate", None)
    diag = getattr(error, "diag", None)
    primary = getattr(diag, "message_primary", None) if state else None
    text = primary or " ".join(str(error).split())
    hint = getattr(diag, "message_hint", None) if state else None
    message = f"{where}: {what}: {text}" + (f" ({hint})" if hint else "")
    if state:
        message += f" [SQLSTATE {state}]"
        if state[:2] in TRANSIENT_CLASSES:
            return Transient(message)
        return StorageRejected(message)
    if isinstance(error, psycopg.OperationalError):
        if _REFUSED_CONNECTION.search(str(error)):
            return StorageRejected(message)
        return Transient(message)
    if isinstance(error, psycopg.InterfaceError):
        return Transient(message)
    return StorageError(message)


class PostgresProvider:
    """The ``postgres`` provider (module docstring); one connection, opened on demand."""

    key = KEY
    # Rows are objects with named columns: without join keys every column is a feature.
    named_rows = True
    # store_keyed takes a columnar page's output as one Arrow table (_pgcolumnar).
    columnar_output = True

    def __init__(self, settings: Settings, role: Role) -> None:
        self.settings = settings
        self.role = role
        self.paging: KeysetPaging | None = settings.paging if role == "input" else None
        self.where = f"postgres {settings.host}:{settings.port}/{settings.database}"
        self.query, self.names = bind_names(settings.query) if settings.query else ("", [])
        self._connection: psycopg.AsyncConnection[dict[str, Any]] | None = None
        self._conninfo: str | None = None
        self._ca_file: str | None = None
        self._total: int | None = None
        # Keyset paging: (the next input position, the key of the row before it).
        self._cursor: tuple[int, Any] | None = None
        self._end: int | None = None  # the input's size, once a short read found it
        # How pages travel columnar (_pgcolumnar), once the query's columns are known;
        # None: the row path.
        self._layout: CsvLayout | None = None
        self._records = Records({})
        self._described = False
        self._table_ready = False
        self._carried: list[str] | None = None
        self._has_pod_column = False

    # -- connection ----------------------------------------------------------------

    async def prepare(self, ctx: StorageContext) -> None:
        """Read the Secret, then connect: wrong credentials fail here, before any data."""
        ref = self.settings.secret_ref
        data, source = await read_secret(ctx, ref)
        # A Secret that exists without its key stays so on every retry:
        # refused, like an S3 Secret without its keys.
        password = data.get("password") or ""
        if not password:
            raise StorageRejected(f"{source} has no password")
        user = self.settings.user or (data.get("username") or "").strip()
        if not user:
            raise StorageRejected(f"{source} has no username, and the entry sets no user")
        parts: dict[str, Any] = {
            "host": self.settings.host,
            "port": self.settings.port,
            "dbname": self.settings.database,
            "user": user,
            "password": password,
            "sslmode": self.settings.sslmode,
            "connect_timeout": self.settings.connect_timeout_seconds,
            "application_name": APPLICATION_NAME,
        }
        ca = data.get("ca") or ""
        if ca:
            self._ca_file = _private_file(ca)
            parts["sslrootcert"] = self._ca_file
        self._conninfo = make_conninfo(**parts)
        await self._retrying(ctx, "connecting", None)
        if self.role == "input":
            # A query that does not parse fails here, in the user's own words (not
            # the paging wrapper's), before any row is read.
            await self._run(ctx, "preparing the query", self._parse(sql.SQL(self.query)))

    async def _connect(self) -> psycopg.AsyncConnection[dict[str, Any]]:
        if self._connection is None or self._connection.closed:
            if self._conninfo is None:
                raise RuntimeError("prepare() was not called")
            self._connection = await psycopg.AsyncConnection.connect(
                self._conninfo,
                autocommit=True,
                row_factory=dict_row,
                cursor_factory=psycopg.AsyncRawCursor,
            )
            # numeric values arrive as floats (the runner's rows are JSON numbers).
            self._connection.adapters.register_loader("numeric", FloatLoader)
        return self._connection

    async def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()

    async def close(self) -> None:
        await self._drop()
        if self._ca_file:
            with contextlib.suppress(OSError):
                os.unlink(self._ca_file)
            self._ca_file = None

    async def _retrying(
        self,
        ctx: StorageContext,
        what: str,
        work: Callable[[psycopg.AsyncConnection[dict[str, Any]]], Awaitable[T]] | None,
    ) -> T | None:
        """``work`` on the connection, retried on transient failures (a new connection each)."""

        async def attempt(time_limit: float) -> T | None:
            try:
                async with asyncio.timeout(time_limit):
                    connection = await self._connect()
                    return None if work is None else await work(connection)
            except (psycopg.Error, TimeoutError, OSError) as error:
                await self._drop()
                raise failure(self.where, what, error) from None

        try:
            return await call_with_retries(
                attempt,
                policy=RETRY,
                deadline=ctx.deadline,
                request_timeout=self.settings.request_timeout_seconds,
                on_retry=log_retries(ctx.log, RETRY_EVENT),
            )
        except GaveUp as error:
            raise StorageError(error.message) from None

    async def _run(
        self,
        ctx: StorageContext,
        what: str,
        work: Callable[[psycopg.AsyncConnection[dict[str, Any]]], Awaitable[T]],
    ) -> T:
        result = await self._retrying(ctx, what, work)
        assert result is not None
        return result

    # -- input -----------------------------------------------------------------------

    def _arguments(self, ctx: StorageContext) -> list[str]:
        missing = [name for name in self.names if name not in ctx.parameters]
        if missing:
            given = ", ".join(sorted(ctx.parameters)) or "none"
            raise ContractError(
                f"input.postgres: the query uses ${missing[0]}, which the run's parameters do "
                f"not give (parameters: {given})"
            )
        return [ctx.parameters[name] for name in self.names]

    def _source(self) -> sql.Composed:
        return sql.SQL("({}) AS input").format(sql.SQL(self.query))

    async def load_rows(self, ctx: StorageContext) -> list[Any]:
        arguments = self._arguments(ctx)

        async def read(connection: psycopg.AsyncConnection[dict[str, Any]]) -> list[Any]:
            cursor = connection.cursor()
            await cursor.execute(self.query, arguments)
            return await cursor.fetchall()

        return await self._run(ctx, "reading the query's rows", read)

    def _page_query(self, after: bool, count: int = 1) -> sql.Composed:
        assert self.paging is not None
        key = sql.Identifier(self.paging.key)
        n = len(self.names)
        where = (
            sql.SQL("WHERE input.{} > {} ").format(key, sql.SQL(f"${n + 1}"))
            if after
            else sql.SQL("")
        )
        limit = sql.SQL(f"${n + 2}" if after else f"${n + 1}")
        window = sql.SQL("SELECT * FROM {} {}ORDER BY input.{} LIMIT {}").format(
            self._source(), where, key, limit
        )
        if count == 1:
            return window
        # Shard s of c keeps every c-th row of the window, filtered by the server so
        # only the shard's rows travel and are decoded; each kept row also says how
        # many rows the window had and its last key, where the next window starts.
        return sql.SQL(
            "SELECT * FROM (SELECT page.*, row_number() OVER (ORDER BY page.{key}) AS {n}, "
            "count(*) OVER () AS {scanned}, last_value(page.{key}) OVER (ORDER BY page.{key} "
            "ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS {last} "
            "FROM ({window}) AS page) AS numbered WHERE ({n} - 1) % {count} = 0 "
            "ORDER BY numbered.{key}"
        ).format(
            key=key,
            window=window,
            count=sql.Literal(count),
            n=sql.Identifier(_NUMBER),
            scanned=sql.Identifier(_SCANNED),
            last=sql.Identifier(_LAST),
        )

    async def read_page(
        self, ctx: StorageContext, offset: int, limit: int, part: Partition
    ) -> Page:
        if self.paging is None:
            raise RuntimeError("the input entry has no paging")
        arguments = self._arguments(ctx)
        key = self.paging.key
        if self._total is None:
            self._total = await self._run(ctx, "counting the query's rows", self._count(arguments))
        shard_total = max(0, math.ceil((self._total - part.index) / part.count))
        start = part.position(offset)
        if self._end is not None and start >= self._end:
            return Page(offset, [], shard_total)
        after: tuple[Any] | tuple[()] = ()
        if self._cursor is not None and self._cursor[0] == start:
            after = (self._cursor[1],)
        elif start > 0:
            found = await self._run(
                ctx, "finding where the shard starts", self._key_at(arguments, start - 1)
            )
            if not found:
                return Page(offset, [], shard_total)
            after = (found[0],)
        fetch = limit * part.count
        if not self._described:
            self._layout, self._records = await self._run(
                ctx, "describing the query's columns", self._describe(arguments)
            )
            self._described = True
        if self._layout is not None:
            columnar = await self._read_columnar(
                ctx, offset, [*arguments, *after, fetch], bool(after), part
            )
            if columnar is not None:
                table, texts, scanned, last = columnar
                assert self._layout is not None
                arrow = ArrowRows([table], self._records, frozenset(self._layout.opaque), texts)
                return self._paged(offset, arrow, start, scanned, last, fetch, shard_total)
        query = self._page_query(bool(after), part.count)

        async def read(connection: psycopg.AsyncConnection[dict[str, Any]]) -> list[dict[str, Any]]:
            cursor = connection.cursor()
            await cursor.execute(query, [*arguments, *after, fetch])
            return await cursor.fetchall()

        rows = await self._run(ctx, f"reading the page at row {offset}", read)
        scanned, last = len(rows), None
        if rows:
            last = rows[-1].get(key)
            if part.count > 1:
                scanned, last = rows[-1][_SCANNED], rows[-1][_LAST]
                for row in rows:
                    del row[_NUMBER], row[_SCANNED], row[_LAST]
        return self._paged(offset, rows, start, scanned, last, fetch, shard_total)

    def _paged(
        self,
        offset: int,
        rows: Sequence[Any],
        start: int,
        scanned: int,
        last: Any,
        fetch: int,
        shard_total: int,
    ) -> Page:
        """The page, once the next one's start (``last``, ``scanned`` rows on) is noted."""
        if scanned:
            if last is None:
                assert self.paging is not None
                raise StorageRejected(
                    f"{self.where}: paging.key {self.paging.key!r} is null in a row (or not a "
                    "column of the query): the paging key must be a unique, non-null column"
                )
            self._cursor = (start + scanned, last)
        if scanned < fetch:
            self._end = start + scanned
        return Page(offset, cast(list[Any], rows), shard_total)

    def _describe(
        self, arguments: list[str]
    ) -> Callable[
        [psycopg.AsyncConnection[dict[str, Any]]], Awaitable[tuple[CsvLayout | None, Records]]
    ]:
        """How pages travel (_pgcolumnar), from the query's result columns; no row is read."""

        async def describe(
            connection: psycopg.AsyncConnection[dict[str, Any]],
        ) -> tuple[CsvLayout | None, Records]:
            cursor = connection.cursor()
            await cursor.execute(
                sql.SQL("SELECT * FROM {} LIMIT 0").format(self._source()), arguments
            )
            columns = [(column.name, column.type_code) for column in cursor.description or []]
            layout = CsvLayout.of(columns)
            if layout is None:
                return None, Records({})
            # The loaders a row read uses for the opaque columns' text.
            loaders: dict[str, TextLoader] = {}
            for name, oid in layout.opaque.items():
                loader = connection.adapters.get_loader(oid, psycopg.pq.Format.TEXT)
                if loader is None:
                    return None, Records({})
                loaders[name] = loader(oid, connection)
            return layout, Records(loaders)

        return describe

    async def _read_columnar(
        self, ctx: StorageContext, offset: int, values: list[Any], after: bool, part: Partition
    ) -> tuple[pa.Table, dict[str, pa.ChunkedArray], int, Any] | None:
        """A page as one Arrow table, with its scanned rows and last key; None: the row path.

        The server writes the page as CSV (one value), Arrow parses it (_pgcolumnar).
        """
        assert self.paging is not None
        assert self._layout is not None
        key = self.paging.key
        layout = self._layout
        if key not in layout.names:
            return None  # the row path says why
        if part.count > 1:
            key_oid = layout.oids[layout.names.index(key)]
            layout = layout.with_columns([(_SCANNED, 20), (_LAST, key_oid)])
        query = sql.SQL(
            "SELECT string_agg({line}, E'\\n' ORDER BY page.{key}) AS csv, count(*) AS n "
            "FROM ({page}) AS page"
        ).format(
            line=layout.line("page"),
            key=sql.Identifier(key),
            page=self._page_query(after, part.count),
        )

        async def read(
            connection: psycopg.AsyncConnection[dict[str, Any]],
        ) -> tuple[Any, ...] | None:
            cursor = connection.cursor(row_factory=tuple_row)
            await cursor.execute(query, values)
            return await cursor.fetchone()

        found = await self._run(ctx, f"reading the page at row {offset}", read)
        text, rows = (found[0] or "", int(found[1])) if found else ("", 0)
        parsed = layout.parse(text.encode(), rows)
        if parsed is None:
            return None
        table, texts = parsed
        if not rows:
            return table.select(list(self._layout.names)), {}, 0, None
        if part.count > 1:
            scanned, last = table.column(_SCANNED)[-1].as_py(), table.column(_LAST)[-1].as_py()
            table = table.drop_columns([_SCANNED, _LAST])
        else:
            scanned, last = rows, table.column(key)[-1].as_py()
        return table, texts, int(scanned), last

    def _count(
        self, arguments: list[str]
    ) -> Callable[[psycopg.AsyncConnection[dict[str, Any]]], Awaitable[int]]:
        async def count(connection: psycopg.AsyncConnection[dict[str, Any]]) -> int:
            cursor = connection.cursor()
            await cursor.execute(
                sql.SQL("SELECT count(*) AS n FROM {}").format(self._source()), arguments
            )
            row = await cursor.fetchone()
            return int(row["n"]) if row else 0

        return count

    def _key_at(
        self, arguments: list[str], position: int
    ) -> Callable[[psycopg.AsyncConnection[dict[str, Any]]], Awaitable[list[Any]]]:
        assert self.paging is not None
        key = sql.Identifier(self.paging.key)
        n = len(self.names)
        query = sql.SQL("SELECT input.{} AS k FROM {} ORDER BY input.{} OFFSET {} LIMIT 1").format(
            key, self._source(), key, sql.SQL(f"${n + 1}")
        )

        async def find(connection: psycopg.AsyncConnection[dict[str, Any]]) -> list[Any]:
            cursor = connection.cursor()
            await cursor.execute(query, [*arguments, position])
            row = await cursor.fetchone()
            return [row["k"]] if row else []

        return find

    # -- output ------------------------------------------------------------------------

    @property
    def _table(self) -> sql.Identifier:
        assert self.settings.table is not None
        return sql.Identifier(*self.settings.table.split("."))

    async def _columns(
        self, connection: psycopg.AsyncConnection[dict[str, Any]]
    ) -> list[str] | None:
        """The table's columns, None when it does not exist.

        One statement, so one snapshot: ``to_regclass`` looks the name up in the
        latest catalog, which may already hold a table another shard is committing
        while this statement's snapshot does not show its columns yet; joining
        ``pg_class`` under the same snapshot as ``pg_attribute`` says "no table"
        then, never "a table without columns".
        """
        cursor = connection.cursor()
        await cursor.execute(
            "SELECT a.attname AS name FROM pg_class c "
            "LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 "
            "AND NOT a.attisdropped WHERE c.oid = to_regclass($1) ORDER BY a.attnum",
            [self._table.as_string()],
        )
        rows = await cursor.fetchall()
        if not rows:
            return None
        return [str(row["name"]) for row in rows if row["name"] is not None]

    async def _has_conflict_key(self, connection: psycopg.AsyncConnection[dict[str, Any]]) -> bool:
        cursor = connection.cursor()
        await cursor.execute(
            "SELECT array_agg(a.attname::text ORDER BY a.attname) AS columns FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indpred IS NULL "
            "GROUP BY i.indexrelid",
            [self._table.as_string()],
        )
        return any(
            sorted(row["columns"] or []) == sorted(KEY_COLUMNS) for row in await cursor.fetchall()
        )

    async def _check_output(
        self, connection: psycopg.AsyncConnection[dict[str, Any]], columns: list[str] | None
    ) -> None:
        """The table's key and ``columns`` (as :meth:`_columns` read them), when it exists.

        Without it (``columns`` None), whether it may be made.
        """
        name = self.settings.table
        if columns is None:
            if not self.settings.create_table:
                raise StorageRejected(
                    f"{self.where}: table {name} does not exist (createTable: true creates it)"
                )
            return
        missing = [c for c in (*KEY_COLUMNS, PREDICTION) if c not in columns]
        if missing:
            raise StorageRejected(
                f"{self.where}: table {name} has no column {missing[0]!r}, which the runner "
                f"writes (its columns: {', '.join(columns)})"
            )
        if not await self._has_conflict_key(connection):
            raise StorageRejected(
                f"{self.where}: table {name} has no unique key on ({', '.join(KEY_COLUMNS)}), "
                "which exactly-once writes need (INSERT ... ON CONFLICT): add "
                f"PRIMARY KEY ({', '.join(KEY_COLUMNS)}) or a unique index on them"
            )

    async def _ready_table(
        self,
        connection: psycopg.AsyncConnection[dict[str, Any]],
        carried: list[str],
        first: list[Any],
    ) -> None:
        columns = await self._columns(connection)
        if columns is None:
            if not self.settings.create_table:
                raise StorageRejected(
                    f"{self.where}: table {self.settings.table} does not exist "
                    "(createTable: true creates it)"
                )
            definitions = [
                sql.SQL("run_uid text NOT NULL, shard integer NOT NULL, row_index bigint NOT NULL"),
                sql.SQL("pod_uid text"),
                *(
                    sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(column_type(value)))
                    for name, value in zip([*carried, PREDICTION], first, strict=True)
                ),
                sql.SQL("stored_at timestamptz NOT NULL DEFAULT now()"),
                sql.SQL("PRIMARY KEY (run_uid, shard, row_index)"),
            ]
            # Shards start together, and two concurrent CREATE TABLE IF NOT EXISTS
            # race in PostgreSQL: the loser may fail on the catalog's unique index
            # (pg_type_typname_nsp_index). A lock on the table's name, held until the
            # create commits, makes the second wait and then skip. A server without
            # advisory locks (CockroachDB) refuses the call inside a savepoint and
            # the create goes on, serialised by that server's own schema changes.
            cursor = connection.cursor()
            async with connection.transaction():
                with contextlib.suppress(
                    psycopg.errors.UndefinedFunction, psycopg.errors.FeatureNotSupported
                ):
                    async with connection.transaction():
                        await cursor.execute(
                            "SELECT pg_advisory_xact_lock(hashtext($1))",
                            [self._table.as_string()],
                        )
                await cursor.execute(
                    sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                        self._table, sql.SQL(", ").join(definitions)
                    )
                )
            # Read again: another shard's create may have won (IF NOT EXISTS).
            columns = await self._columns(connection)
        # The columns read above, checked once (no second catalog query).
        await self._check_output(connection, columns)
        columns = columns or []
        missing = [c for c in carried if c not in columns]
        if missing:
            raise StorageRejected(
                f"{self.where}: table {self.settings.table} has no column {missing[0]!r} for the "
                f"carried input column of that name (its columns: {', '.join(columns)})"
            )
        self._has_pod_column = POD_COLUMN in columns
        self._carried = carried
        self._table_ready = True

    async def store_keyed(
        self,
        ctx: StorageContext,
        offset: int,
        predictions: list[Any] | pa.Table,
        part: Partition,
        row_count: int | None = None,
    ) -> Stored:
        """One chunk, keyed by its rows' input positions: stored once, retried like a read.

        A columnar page's output (an Arrow table, :mod:`runner.storage._pgcolumnar`)
        goes into ``COPY`` as one CSV buffer; any other, one row at a time.
        """
        table: pa.Table | None = None
        if isinstance(predictions, pa.Table):
            if csv_ready(predictions):
                table = predictions
            else:
                predictions = predictions.to_pylist()
        if table is not None:
            carried = checked_carried(table.column_names[:-1])
            head = table.slice(0, 1).to_pylist()[0]
            first_row = [head[name] for name in (*carried, PREDICTION)]
            values: list[list[Any]] = []
            count = table.num_rows
        else:
            if not predictions:
                return Stored(0, 0)
            carried, values = output_rows(predictions)
            first_row = first_values(predictions, carried)
            count = len(values)
        if self._carried is not None and carried != self._carried:
            raise StorageRejected(
                f"{self.where}: the output rows' columns changed from {self._carried} to {carried}"
            )
        first, step = part.position(offset), part.count

        async def write(connection: psycopg.AsyncConnection[dict[str, Any]]) -> int:
            if not self._table_ready:
                await self._ready_table(connection, carried, first_row)
            pod = [ctx.pod_uid] if self._has_pod_column else []
            used = [*KEY_COLUMNS, *([POD_COLUMN] if pod else []), *carried, PREDICTION]
            listed = sql.SQL(", ").join(sql.Identifier(n) for n in used)
            staging = sql.Identifier(STAGING)
            cursor = connection.cursor()
            async with connection.transaction():
                await cursor.execute(
                    sql.SQL(
                        "CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS) "
                        "ON COMMIT DELETE ROWS"
                    ).format(staging, self._table)
                )
                if table is not None:
                    # The CSV carries row_index and the output columns; the staging
                    # table's defaults give the run's key columns.
                    defaults = [("run_uid", ctx.job_id), ("shard", part.index)]
                    defaults += [(POD_COLUMN, ctx.pod_uid)] if pod else []
                    await cursor.execute(
                        sql.SQL("ALTER TABLE {} {}").format(
                            staging,
                            sql.SQL(", ").join(
                                sql.SQL("ALTER COLUMN {} SET DEFAULT {}").format(
                                    sql.Identifier(name), sql.Literal(value)
                                )
                                for name, value in defaults
                            ),
                        )
                    )
                    copied = ["row_index", *carried, PREDICTION]
                    async with cursor.copy(
                        sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
                            staging, sql.SQL(", ").join(sql.Identifier(n) for n in copied)
                        )
                    ) as copy:
                        await copy.write(memoryview(csv_chunk(table, first, step)))
                else:
                    async with cursor.copy(
                        sql.SQL("COPY {} ({}) FROM STDIN").format(staging, listed)
                    ) as copy:
                        for i, row in enumerate(values):
                            await copy.write_row(
                                (ctx.job_id, part.index, first + step * i, *pod, *row)
                            )
                await cursor.execute(
                    sql.SQL(
                        "INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) DO NOTHING"
                    ).format(
                        self._table,
                        listed,
                        listed,
                        staging,
                        sql.SQL(", ").join(sql.Identifier(c) for c in KEY_COLUMNS),
                    )
                )
                return max(cursor.rowcount, 0)

        stored = await self._run(ctx, f"storing the chunk at row {offset}", write)
        return Stored(stored, count - stored)

    async def store(self, ctx: StorageContext, predictions: list[Any]) -> None:
        """Every prediction of the shard (an unpaged run), ``chunkSize`` per transaction."""
        for start, piece in chunks(predictions, self.settings.chunk_size):
            await self.store_keyed(ctx, start, piece, ctx.part)

    async def stored_next(self, ctx: StorageContext, part: Partition) -> int | None:
        """The shard's first row not stored yet: after its highest stored ``row_index``."""

        async def highest(connection: psycopg.AsyncConnection[dict[str, Any]]) -> list[int]:
            # The table is checked here, before any prediction: a streaming run asks first.
            columns = await self._columns(connection)
            await self._check_output(connection, columns)
            if not self.settings.resume or columns is None:
                return []
            cursor = connection.cursor()
            await cursor.execute(
                sql.SQL(
                    "SELECT max(row_index) AS last FROM {} WHERE run_uid = $1 AND shard = $2"
                ).format(self._table),
                [ctx.job_id, part.index],
            )
            row = await cursor.fetchone()
            return [] if row is None or row["last"] is None else [int(row["last"])]

        found = await self._run(ctx, "reading what the shard stored", highest)
        if not self.settings.resume:
            return None
        return (found[0] - part.index) // part.count + 1 if found else 0

    # -- check -------------------------------------------------------------------------

    async def probe(self, ctx: StorageContext) -> str:
        """Connected; the query parses (PREPARE) or the table is there: nothing moved."""
        if self.role == "output":
            return await self._run(ctx, "checking the table", self._probe_table)
        # prepare() has parsed the query itself; the paged form adds the key's column.
        if self.paging is not None:
            await self._run(ctx, "preparing the paged query", self._parse(self._page_query(True)))
        return f"{self.where}: the query parses ({len(self.names)} parameter(s))"

    def _parse(
        self, query: sql.Composable
    ) -> Callable[[psycopg.AsyncConnection[dict[str, Any]]], Awaitable[bool]]:
        """``PREPARE`` then ``DEALLOCATE`` ``query``: parsed and planned, never run."""

        async def parse(connection: psycopg.AsyncConnection[dict[str, Any]]) -> bool:
            cursor = connection.cursor()
            await cursor.execute(sql.SQL("PREPARE ksc_check AS {}").format(query))
            await cursor.execute("DEALLOCATE ksc_check")
            return True

        return parse

    async def _probe_table(self, connection: psycopg.AsyncConnection[dict[str, Any]]) -> str:
        columns = await self._columns(connection)
        await self._check_output(connection, columns)
        if columns is not None:
            return f"{self.where}: table {self.settings.table} has the conflict key"
        table = self.settings.table or ""
        schema = table.split(".")[0] if "." in table else None
        cursor = connection.cursor()
        await cursor.execute(
            "SELECT has_schema_privilege(coalesce($1, current_schema()), 'CREATE') AS ok",
            [schema],
        )
        row = await cursor.fetchone()
        if not row or not row["ok"]:
            raise StorageRejected(
                f"{self.where}: table {self.settings.table} does not exist and this user may "
                "not create it (createTable)"
            )
        return f"{self.where}: table {self.settings.table} is missing and may be created"


def _private_file(text: str) -> str:
    fd, path = tempfile.mkstemp(prefix="runner-pg-ca-", suffix=".pem")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    return path


def from_settings(
    settings: Mapping[str, Any], role: Role, parameters: Mapping[str, str]
) -> PostgresProvider:
    try:
        parsed = Settings.model_validate(settings)
    except ValidationError as error:
        raise ValueError(explain(error)) from None
    if role == "input":
        if not parsed.query:
            raise ValueError("query: an input entry needs a query (a SELECT)")
        if parsed.table:
            raise ValueError("table belongs to an output entry")
    else:
        if not parsed.table:
            raise ValueError("table: an output entry needs a table")
        if parsed.query or parsed.paging:
            raise ValueError("query and paging belong to an input entry")
    provider = PostgresProvider(parsed, role)
    return provider
