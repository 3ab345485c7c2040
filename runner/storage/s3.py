"""``s3``: objects in any S3-compatible store (AWS S3, Ceph RGW, MinIO, versitygw, ...).

Contract entry (keys marked *input* or *output* apply to that side only)::

    s3:
      bucket: features
      endpointUrl: https://minio.data:9000   # default: AWS's endpoint for the region
      region: eu-west-1           # default: us-east-1 (or $AWS_REGION)
      pathStyle: true             # default: true with endpointUrl, virtual-hosted on AWS
      caBundle: "-----BEGIN CERTIFICATE-----..."   # PEM to trust besides the system's
      secretRef: {name: s3-creds, namespace: data}  # default: the AWS environment
      # input: exactly one of
      key: iris/part-0.parquet    # one object
      prefix: iris/2026-11/       # every object under it, in key order
      keys: [a.csv, b.csv.gz]     # these objects, in this order
      format: parquet             # csv | jsonl | parquet | openai-batch; default: from
                                  # each extension (openai-batch only when given)
      compression: gzip           # none | gzip | zstd; default: from the extension
      columnTypes: {id: string}   # input, CSV/JSON Lines: types instead of inference
      paging: {pageSize: 10000}   # input: rows per page (the default)
      # output
      prefix: predictions/iris    # where the chunks go (below)
      format: parquet             # parquet (default) | jsonl | csv | openai-batch
      compression: none           # jsonl/csv: none (default) | gzip | zstd

**Credentials.** With ``secretRef`` the Secret's ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY`` and optional ``AWS_SESSION_TOKEN`` sign every request
(and its optional ``ca`` is trusted, like ``caBundle``). Without it the standard
AWS environment applies: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, web
identity (``AWS_WEB_IDENTITY_TOKEN_FILE`` + ``AWS_ROLE_ARN``, as IRSA sets them),
EKS Pod Identity (``AWS_CONTAINER_CREDENTIALS_FULL_URI``), ``AWS_REGION``,
``AWS_ENDPOINT_URL``.

**Input.** The objects are read in order, one row group (Parquet) or one
streamed piece (CSV with a header, JSON Lines; gzip or zstd) at a time, never a
whole object at once; see :mod:`runner.storage._s3formats` for how rows are
made of columns (column types come from the file). An input prefix skips
folders and names starting with ``_`` or ``.`` (a manifest, ``_SUCCESS``). Every
object must have the first one's columns and types. The run always streams
(:mod:`runner.streaming`): ``paging.pageSize`` rows per page, each page's
predictions one keyed chunk. Shards read disjoint parts: Parquet row groups, or
whole objects for the text formats (:mod:`runner.storage._s3layout`).

**OpenAI Batch files** (``format: openai-batch``, :mod:`runner.storage._s3formats`).
An input of OpenAI Batch API input files, read line for line, each line a row
as it is written; an output of Batch API output lines, as the runner makes them
(``kserve.openai.format: batch``, :mod:`runner.openai`), without ``shard`` or
``row``: the chunks' keys give their order, so the chunks of a shard, concatenated
in key order, are the output file.

**Output.** One object per chunk under ``prefix``, keyed by the run's uid, the
shard and the chunk's rows, so a chunk written again replaces itself with the
same bytes; a restarted pod lists what its shard stored and resumes after it;
manifests written last mark a shard and the whole output complete
(:mod:`runner.storage._s3layout`). An s3 output needs a streaming input (an
``s3`` input, or another with ``paging``).

**Errors.** A missing bucket or object, access denied (a wrong key or secret,
or an account without rights on the bucket), a wrong region, a malformed row
(the object and row are named), a Parquet object whose columns differ from the
first one's: rejected (exit 6 input, 8 output; not retried). No connection,
timeouts and 5xx are retried by the S3 client (3 times), then exit 3 or 5.

**Probe** (``--check``): a HEAD of ``key`` (or each of ``keys``), or one listing
page of ``prefix`` (the output's too): the bucket exists and the credentials
work; no data is read and nothing is written.

The client is obstore (Rust's ``object_store``): asynchronous, no Python
dependencies, about 15 MiB installed.
"""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import obstore
import orjson
import pyarrow as pa
from obstore.exceptions import (
    BaseError,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
)
from obstore.store import S3Store
from pydantic import Field, ValidationError, field_validator

from runner.httputil import RETRYABLE_4XX, trim
from runner.storage._columnar import ArrowRows
from runner.storage._s3formats import (
    COLUMN_TYPES,
    FormatError,
    RangeFile,
    StreamFile,
    TextOptions,
    chunk_table,
    compress,
    decode_row_group,
    describe_schema,
    encode_chunk,
    encode_lines,
    footer_length,
    footer_range,
    open_text,
    parquet_metadata,
    records_of,
    row_group_range,
    same_columns,
)
from runner.storage._s3layout import (
    MANIFEST,
    Chunk,
    Compression,
    Encoding,
    Format,
    Unit,
    chunk_key,
    clean_prefix,
    encoding_of,
    hidden,
    output_suffix,
    run_dir,
    run_manifest,
    shard_dir,
    shard_manifest,
    shard_manifest_keys,
    shard_total,
    shard_units,
    stored_prefix,
)
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
    explain,
    read_secret,
)

KEY = "s3"
DEFAULT_PAGE_SIZE = 10_000
SECRET_ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
SECRET_SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
SECRET_SESSION_TOKEN = "AWS_SESSION_TOKEN"
SECRET_CA = "ca"
# The S3 client's own retries of connection errors, timeouts and 5xx.
RETRIES = {"max_retries": 3, "retry_timeout": timedelta(seconds=60)}
REQUEST_TIMEOUT = "120s"
CONNECT_TIMEOUT = "10s"
STREAM_PIECE = 1 << 20
# How obstore quotes the HTTP status of a failed request.
_STATUS = re.compile(r"status(?: code)?:? (\d{3})")


class Settings(EntrySettings):
    bucket: str = Field(min_length=1, max_length=255)
    endpoint_url: str | None = None
    region: str | None = None
    path_style: bool | None = None
    ca_bundle: str | None = None
    secret_ref: SecretRef | None = None
    key: str | None = Field(default=None, min_length=1)
    prefix: str | None = None
    keys: list[str] | None = Field(default=None, min_length=1)
    format: Format | None = None
    compression: Compression | None = None
    column_types: dict[str, str] | None = None
    paging: Paging | None = None

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s) URL with a host")
        if parts.username or parts.password:
            raise ValueError("must not carry credentials: use secretRef")
        return url.strip().rstrip("/")

    @field_validator("column_types")
    @classmethod
    def _types(cls, types: dict[str, str] | None) -> dict[str, str] | None:
        for name, kind in (types or {}).items():
            if kind not in COLUMN_TYPES:
                raise ValueError(
                    f"column {name!r}: unknown type {kind!r} (known: {', '.join(COLUMN_TYPES)})"
                )
        return types

    @field_validator("keys")
    @classmethod
    def _keys(cls, keys: list[str] | None) -> list[str] | None:
        if keys is not None and any(not k.strip("/") for k in keys):
            raise ValueError("a key may not be empty")
        return keys


def _check_role(settings: Settings, role: Role) -> None:
    if role == "input":
        given = [k for k in ("key", "prefix", "keys") if getattr(settings, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "an s3 input names its objects with exactly one of key, prefix or keys"
                + (f" (got {', '.join(given)})" if given else "")
            )
        return
    wrong = [
        alias
        for name, alias in (
            ("key", "key"),
            ("keys", "keys"),
            ("column_types", "columnTypes"),
            ("paging", "paging"),
        )
        if getattr(settings, name) is not None
    ]
    if wrong:
        raise ValueError(f"{', '.join(wrong)} only apply to an s3 input")
    if settings.prefix is None:
        raise ValueError("an s3 output needs a prefix (the chunks go under it)")
    if settings.format in (None, "parquet") and settings.compression not in (None, "none"):
        raise ValueError("Parquet output is compressed inside (zstd): compression is for jsonl/csv")


# -- the S3 client --------------------------------------------------------------------


@dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def __call__(self) -> dict[str, Any]:
        """obstore's credential provider: static, never expiring."""
        return {
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
            "token": self.session_token,
            "expires_at": None,
        }


def credentials_from_secret(data: Mapping[str, str], source: str) -> Credentials:
    access = (data.get(SECRET_ACCESS_KEY_ID) or "").strip()
    secret = (data.get(SECRET_SECRET_ACCESS_KEY) or "").strip()
    missing = [
        key
        for key, value in ((SECRET_ACCESS_KEY_ID, access), (SECRET_SECRET_ACCESS_KEY, secret))
        if not value
    ]
    if missing:
        raise StorageRejected(f"{source} has no {' or '.join(missing)}")
    token = (data.get(SECRET_SESSION_TOKEN) or "").strip() or None
    return Credentials(access, secret, token)


def store_options(
    settings: Settings, credentials: Credentials | None, ca: str | None
) -> dict[str, Any]:
    """The keyword arguments of obstore's ``S3Store`` for ``settings``: pure, unit-tested."""
    config: dict[str, Any] = {}
    client: dict[str, Any] = {"timeout": REQUEST_TIMEOUT, "connect_timeout": CONNECT_TIMEOUT}
    if settings.region:
        config["region"] = settings.region
    endpoint = settings.endpoint_url
    path_style = settings.path_style if settings.path_style is not None else bool(endpoint)
    if endpoint:
        if not path_style:
            parts = urlsplit(endpoint)
            endpoint = urlunsplit(
                (parts.scheme, f"{settings.bucket}.{parts.netloc}", parts.path, "", "")
            )
        config["endpoint"] = endpoint
        if endpoint.startswith("http://"):
            client["allow_http"] = True
    config["virtual_hosted_style_request"] = not path_style
    if ca:
        client["root_certificate"] = ca
    options: dict[str, Any] = {
        "config": config,
        "client_options": client,
        "retry_config": dict(RETRIES),
    }
    if credentials is not None:
        options["credential_provider"] = credentials
    return options


def _status(message: str) -> int | None:
    found = _STATUS.search(message)
    return int(found.group(1)) if found else None


_S3_CODE = re.compile(r"<Code>([^<]*)</Code>")
_S3_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")


def _said(text: str) -> str:
    """What the store said: its S3 error code and message, else the client's first words."""
    code, message = _S3_CODE.search(text), _S3_MESSAGE.search(text)
    if code:
        said = f"{code.group(1)}: {message.group(1)}" if message else code.group(1)
        return html.unescape(said)
    # obstore appends its debug representation: keep the sentence before it.
    return trim(" ".join(text.split("Debug source:")[0].split()), 300)


def failure(error: BaseException, what: str, region: str | None = None) -> StorageError:
    """An S3 call's failure as the runner's: rejected when asking again cannot help.

    ``region`` is the entry's (None: the default), named when a 400 comes
    without a reason: the answer to a HEAD has no body, and a 400 there most
    often means the request was signed for another region than the store's.
    """
    if isinstance(error, FormatError):
        return StorageRejected(f"{what}: {error}")
    text = str(error)
    status = _status(text)
    said = _said(text)
    if status == 400 and not _S3_CODE.search(text):
        said = (
            "the store gave no reason (a HEAD's answer has no body); a 400 here most often "
            f"means a wrong region: requests are signed for {region or 'the default region'}"
            ", so check the entry's region and endpointUrl"
        )
    if status == 403 and not _S3_CODE.search(text):
        said = (
            "the store gave no reason (a HEAD's answer has no body): either the access key "
            "and secret do not match, or the account they name has no right on this bucket "
            "or object"
        )
    if isinstance(error, NotFoundError | FileNotFoundError) or status == 404:
        return StorageRejected(f"{what}: not found (no such bucket or object): {said}")
    if isinstance(error, PermissionDeniedError | UnauthenticatedError | PermissionError) or (
        status in (401, 403)
    ):
        return StorageRejected(f"{what}: access denied ({status or 403}): {said}")
    if status is not None and 400 <= status < 500 and status not in RETRYABLE_4XX:
        return StorageRejected(f"{what}: refused ({status}): {said}")
    if isinstance(error, BaseError | OSError):
        return StorageError(f"{what}: {said}")
    return StorageError(f"{what}: {type(error).__name__}: {trim(text, 300)}")


# -- the provider ---------------------------------------------------------------------


@dataclass
class _Cursor:
    """Where a shard's read is: the rows handed out so far, and what is left of a table."""

    part: Partition
    position: int
    tables: AsyncIterator[pa.Table]
    left: pa.Table | None = None


@dataclass(eq=False)
class S3Provider:
    key = KEY
    # An output of keyed chunks only (runner.app.plan refuses a run that does not stream).
    streams_only = True
    # Rows are objects with named columns: runner.join picks the model's features.
    named_rows = True
    # store_keyed takes a page's output as one Arrow table (runner.storage._columnar).
    columnar_output = True

    settings: Settings
    role: Role
    paging: Paging | None = None
    _store: S3Store | None = field(default=None, init=False)
    _units: list[Unit] | None = field(default=None, init=False)
    _parquet: dict[str, tuple[int, Any]] = field(default_factory=dict, init=False)
    _encodings: dict[str, Encoding] = field(default_factory=dict, init=False)
    _schema: pa.Schema | None = field(default=None, init=False)
    _first: str | None = field(default=None, init=False)
    _cursor: _Cursor | None = field(default=None, init=False)

    @property
    def bucket(self) -> str:
        return self.settings.bucket

    def where(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"

    # -- connection ---------------------------------------------------------------------

    async def prepare(self, ctx: StorageContext) -> None:
        credentials = None
        ca = self.settings.ca_bundle
        ref = self.settings.secret_ref
        if ref is not None:
            data, source = await read_secret(ctx, ref)
            credentials = credentials_from_secret(data, source)
            ca = ca or (data.get(SECRET_CA) or None)
        try:
            self._store = S3Store(self.bucket, **store_options(self.settings, credentials, ca))
        except (BaseError, ValueError) as error:
            raise StorageRejected(
                f"s3 {self.role}: cannot configure the client: {trim(str(error), 300)}"
            ) from None

    @property
    def client(self) -> S3Store:
        if self._store is None:
            raise RuntimeError("prepare() was not called")
        return self._store

    async def _call(self, what: str, call: Any) -> Any:
        try:
            return await call
        except Exception as error:
            raise failure(error, what, self.settings.region) from None

    # -- input: which units -------------------------------------------------------------

    async def _object_keys(self) -> list[tuple[str, int]]:
        """The input's objects, ``(key, size)``, in order; rejected when there are none."""
        s = self.settings
        if s.prefix is not None:
            prefix = clean_prefix(s.prefix)
            found: list[tuple[str, int]] = []
            try:
                async for batch in obstore.list(self.client, prefix or None, chunk_size=1000):
                    found.extend(
                        (meta["path"], meta["size"]) for meta in batch if not hidden(meta["path"])
                    )
            except Exception as error:
                raise failure(
                    error, f"listing {self.where(prefix)}", self.settings.region
                ) from None
            if not found:
                raise StorageRejected(f"{self.where(prefix)}: no objects under this prefix")
            return sorted(found)
        keys = [s.key] if s.key is not None else list(s.keys or [])
        sizes = []
        for key in keys:
            key = key.lstrip("/")
            meta = await self._call(self.where(key), obstore.head_async(self.client, key))
            sizes.append((key, int(meta["size"])))
        return sizes

    async def _list_units(self) -> list[Unit]:
        units: list[Unit] = []
        for key, size in await self._object_keys():
            try:
                encoding = encoding_of(key, self.settings.format, self.settings.compression)
            except ValueError as error:
                raise StorageRejected(f"{self.where(key)}: {error}") from None
            self._encodings[key] = encoding
            if encoding.format != "parquet":
                units.append(Unit(key))
                continue
            if encoding.compression != "none":
                raise StorageRejected(
                    f"{self.where(key)}: a Parquet object is compressed inside; "
                    f"{encoding.compression} around it is not supported"
                )
            metadata = await self._parquet_footer(key, size)
            self._check_schema(key, metadata.schema.to_arrow_schema())
            units.extend(
                Unit(key, group, metadata.row_group(group).num_rows)
                for group in range(metadata.num_row_groups)
            )
        return units

    async def _parquet_footer(self, key: str, size: int) -> Any:
        start, end = footer_range(size)
        tail = bytes(await self._range(key, start, end))
        try:
            length = _footer_needs(tail, size)
            if length > len(tail):
                tail = bytes(await self._range(key, size - length, size))
            metadata = parquet_metadata(tail, size, self.where(key))
        except FormatError as error:
            raise StorageRejected(f"{self.where(key)}: {error}") from None
        self._parquet[key] = (size, metadata)
        return metadata

    async def _range(self, key: str, start: int, end: int) -> Any:
        if end <= start:
            return b""
        return await self._call(
            f"{self.where(key)} bytes {start}-{end}",
            obstore.get_range_async(self.client, key, start=start, end=end),
        )

    def _check_schema(self, key: str, schema: pa.Schema) -> None:
        """Every object has the first one's columns and types; rejected otherwise."""
        if self._schema is None:
            self._schema, self._first = schema, key
            return
        if not same_columns(schema, self._schema):
            raise StorageRejected(
                f"{self.where(key)} has columns ({describe_schema(schema)}), but "
                f"{self.where(self._first or '')} has ({describe_schema(self._schema)}): "
                "every object of the input must have the same columns and types"
            )

    # -- input: reading -----------------------------------------------------------------

    async def _tables(self, units: list[Unit], skip: int) -> AsyncIterator[pa.Table]:
        """The shard's rows from its ``skip``-th on, as tables (a row group, a text block)."""
        for unit in units:
            if skip and unit.rows is not None and unit.rows <= skip:
                skip -= unit.rows
                continue
            pieces = self._row_group(unit) if unit.row_group is not None else self._text(unit)
            async for table in pieces:
                if skip:
                    if table.num_rows <= skip:
                        skip -= table.num_rows
                        continue
                    table, skip = table.slice(skip), 0
                yield table

    async def _row_group(self, unit: Unit) -> AsyncIterator[pa.Table]:
        assert unit.row_group is not None
        size, metadata = self._parquet[unit.key]
        start, end = row_group_range(metadata, unit.row_group)
        data = await self._range(unit.key, start, end)
        store, key = self.client, unit.key

        def fetch(first: int, last: int) -> bytes:
            # Only if pyarrow reads outside the row group's range (it does not today);
            # blocking is fine: decoding runs in a worker thread.
            return bytes(obstore.get_range(store, key, start=first, end=last))

        source = RangeFile(size, fetch, self.where(unit.key))
        source.add(start, data)
        try:
            yield await asyncio.to_thread(decode_row_group, metadata, unit.row_group, source)
        except FormatError as error:
            raise StorageRejected(f"{unit.describe(self.bucket)}: {error}") from None

    async def _text(self, unit: Unit) -> AsyncIterator[pa.Table]:
        encoding = self._encodings[unit.key]
        what = self.where(unit.key)
        result = await self._call(what, obstore.get_async(self.client, unit.key))
        source = StreamFile(aiter(result.stream(min_chunk_size=STREAM_PIECE)), _loop())
        options = TextOptions(self.settings.column_types)
        try:
            try:
                reader = await asyncio.to_thread(open_text, source, encoding, options, self._schema)
                self._check_schema(unit.key, reader.schema)
                while True:
                    batch = await asyncio.to_thread(_next_batch, reader)
                    if batch is None:
                        break
                    yield pa.Table.from_batches([batch])
            except (pa.ArrowException, OSError) as error:
                if source.error is not None:
                    raise failure(source.error, what, self.settings.region) from None
                raise StorageRejected(
                    f"{what} ({encoding.format}"
                    f"{'' if encoding.compression == 'none' else ', ' + encoding.compression}): "
                    f"{trim(str(error), 400)}"
                ) from None
        finally:
            source.abort()

    async def _open(self, part: Partition, offset: int) -> _Cursor:
        if self._units is None:
            self._units = await self._list_units()
        units = shard_units(self._units, part)
        return _Cursor(part, offset, self._tables(units, offset))

    async def read_page(
        self, ctx: StorageContext, offset: int, limit: int, part: Partition
    ) -> Page:
        cursor = self._cursor
        if cursor is None or cursor.part != part or cursor.position != offset:
            cursor = self._cursor = await self._open(part, offset)
        tables: list[pa.Table] = []
        count = 0
        while count < limit:
            table = cursor.left
            cursor.left = None
            if table is None:
                table = await anext(cursor.tables, None)
                if table is None:
                    break
            wanted = limit - count
            if table.num_rows > wanted:
                cursor.left = table.slice(wanted)
                table = table.slice(0, wanted)
            tables.append(table)
            count += table.num_rows
        cursor.position = offset + count
        units = shard_units(self._units or [], part)
        # Kept columnar: records are made only if the row path needs them (_columnar).
        return Page(offset, cast(list[Any], ArrowRows(tables, records_of)), shard_total(units))

    async def load_rows(self, ctx: StorageContext) -> list[Any]:
        # The runner streams an s3 input (from_settings always sets paging).
        rows: list[Any] = []
        size = self.paging.page_size if self.paging else DEFAULT_PAGE_SIZE
        while True:
            page = await self.read_page(ctx, len(rows), size, Partition())
            rows.extend(page.rows)
            if len(page.rows) < size:
                return rows

    # -- output ---------------------------------------------------------------------------

    @property
    def out_format(self) -> Format:
        return self.settings.format or "parquet"

    @property
    def out_compression(self) -> Compression:
        return self.settings.compression or "none"

    @property
    def suffix(self) -> str:
        return output_suffix(self.out_format, self.out_compression)

    @property
    def prefix(self) -> str:
        return clean_prefix(self.settings.prefix or "")

    async def _keys_under(self, prefix: str) -> list[str]:
        keys: list[str] = []
        try:
            async for batch in obstore.list(self.client, prefix.rstrip("/"), chunk_size=1000):
                keys.extend(meta["path"] for meta in batch)
        except Exception as error:
            raise failure(error, f"listing {self.where(prefix)}", self.settings.region) from None
        return keys

    async def _stored(self, ctx: StorageContext, part: Partition) -> list[Chunk]:
        keys = await self._keys_under(shard_dir(self.prefix, ctx.job_id, part))
        return stored_prefix(keys, self.suffix)

    async def stored_next(self, ctx: StorageContext, part: Partition) -> int | None:
        stored = await self._stored(ctx, part)
        return stored[-1].end if stored else 0

    async def _put(self, key: str, data: bytes, content_type: str) -> None:
        await self._call(
            f"writing {self.where(key)}",
            obstore.put_async(self.client, key, data, attributes={"Content-Type": content_type}),
        )

    async def store_keyed(
        self,
        ctx: StorageContext,
        offset: int,
        predictions: list[Any],
        part: Partition,
        row_count: int | None = None,
    ) -> Stored:
        """One chunk: the shard's rows ``[offset, offset + row_count)`` and their predictions."""
        count = len(predictions) if row_count is None else row_count
        try:
            if self.out_format == "openai-batch":
                if len(predictions) != count:
                    raise FormatError(f"{len(predictions)} output lines for {count} input lines")
                data = compress(encode_lines(predictions), self.out_compression)
            else:
                table = chunk_table(predictions, count, offset, part.index)
                data = await asyncio.to_thread(
                    encode_chunk, table, self.out_format, self.out_compression
                )
        except (FormatError, pa.ArrowException) as error:
            raise StorageRejected(f"chunk at row {offset}: {error}") from None
        key = chunk_key(self.prefix, ctx.job_id, part, offset, count, self.suffix)
        await self._put(key, data, _CONTENT_TYPES[self.out_format])
        return Stored()

    async def finish_keyed(self, ctx: StorageContext, part: Partition, rows: int) -> None:
        """The shard's manifest, then the run's when every shard has one (module docstring)."""
        stored = await self._stored(ctx, part)
        covered = stored[-1].end if stored else 0
        if covered != rows:
            raise StorageError(
                f"{self.where(shard_dir(self.prefix, ctx.job_id, part))}: the stored chunks "
                f"cover rows 0..{covered - 1} but the shard has {rows}: no manifest written"
            )
        directory = shard_dir(self.prefix, ctx.job_id, part)
        body = shard_manifest(ctx.job_id, part, self.out_format, stored)
        await self._put(directory + MANIFEST, body, "application/json")
        await self._finish_run(ctx, part.count)

    async def _finish_run(self, ctx: StorageContext, count: int) -> None:
        present = set(await self._keys_under(run_dir(self.prefix, ctx.job_id)))
        wanted = shard_manifest_keys(self.prefix, ctx.job_id, count)
        if not all(key in present for key in wanted):
            return
        shards = []
        for key in wanted:
            result = await self._call(self.where(key), obstore.get_async(self.client, key))
            shards.append(orjson.loads(bytes(await result.bytes_async())))
        body = run_manifest(ctx.job_id, count, shards)
        await self._put(run_dir(self.prefix, ctx.job_id) + MANIFEST, body, "application/json")

    async def store(self, ctx: StorageContext, predictions: list[Any]) -> None:
        # runner.app.plan refuses such a contract (streams_only); this guards a direct call.
        raise StorageRejected(
            "the s3 output stores keyed chunks: the input must stream (an s3 input, "
            "or paging in its entry)"
        )

    # -- probe ----------------------------------------------------------------------------

    async def probe(self, ctx: StorageContext) -> str:
        """The bucket and credentials, reading no data and writing nothing (module docstring)."""
        s = self.settings
        if self.role == "input" and s.prefix is None:
            keys = [s.key] if s.key is not None else list(s.keys or [])
            for key in keys:
                await self._call(self.where(key), obstore.head_async(self.client, key.lstrip("/")))
            return f"{len(keys)} object(s) in {self.where()} found"
        prefix = clean_prefix(s.prefix or "")
        try:
            stream = obstore.list(self.client, prefix or None, chunk_size=100)
            first: Sequence[Any] = await anext(aiter(stream), [])
        except Exception as error:
            raise failure(error, f"listing {self.where(prefix)}", self.settings.region) from None
        if self.role == "input" and not [m for m in first if not hidden(m["path"])]:
            raise StorageRejected(f"{self.where(prefix)}: no objects under this prefix")
        return f"{self.where(prefix)} listed"


_CONTENT_TYPES: dict[Format, str] = {
    "parquet": "application/vnd.apache.parquet",
    "jsonl": "application/jsonl",
    "csv": "text/csv",
    "openai-batch": "application/jsonl",
}


def _footer_needs(tail: bytes, size: int) -> int:
    """How many of the object's last bytes hold its footer (with its length and magic)."""
    return footer_length(tail, size) + 8


def _next_batch(reader: Any) -> pa.RecordBatch | None:
    try:
        batch: pa.RecordBatch = reader.read_next_batch()
    except StopIteration:
        return None
    return batch


def _loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def from_settings(
    settings: Mapping[str, Any], role: Role, parameters: Mapping[str, str]
) -> S3Provider:
    try:
        parsed = Settings.model_validate(settings)
    except ValidationError as error:
        raise ValueError(explain(error)) from None
    _check_role(parsed, role)
    paging = None
    if role == "input":
        paging = parsed.paging or Paging(page_size=DEFAULT_PAGE_SIZE)
    return S3Provider(parsed, role, paging)
