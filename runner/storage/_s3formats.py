"""The ``s3`` provider's formats: CSV, JSON Lines and Parquet in, chunks out (pyarrow).

No network here: the provider (:mod:`runner.storage.s3`) fetches bytes and hands
them over. Readers never hold a whole object:

- **Parquet** is read one row group at a time. The footer comes first
  (:func:`footer_range`, :func:`parquet_metadata`); a row group's column chunks
  are one byte range (:func:`row_group_range`), fetched and decoded alone
  (:func:`decode_row_group`) through :class:`RangeFile`, a file made of the
  ranges fetched so far.
- **CSV and JSON Lines** (optionally gzip or zstd) are read by Arrow's
  streaming readers in a worker thread, from :class:`StreamFile`, a blocking
  file over the object's asynchronous byte stream: the thread waits for the
  next piece while the event loop fetches it.

Rows (:func:`records_of`) are objects with named columns: the runner's join
(:mod:`runner.join`) takes the model's features from them (every column, in the
file's order, without ``columns``; a single list column is the row itself) and
the columns each output row carries.

Output chunks (:func:`encode_chunk`) carry ``shard`` and ``row`` (the shard's row
number) beside the prediction, so each row has a key; the bytes depend only on
the chunk's content (Parquet with zstd, gzip without a timestamp).

**OpenAI Batch files** (``format: openai-batch``) are JSON Lines that Arrow must
not type: a batch line's ``body`` differs from line to line (a message's
``content`` a string here, a list of parts there), and Arrow's inference would
unify them or add nulls for fields a line never had. :class:`LineReader` hands
each line over as its own JSON text (checked to be a JSON object, with its line
number), :func:`records_of` decodes it unchanged, and :func:`encode_lines`
writes output lines as they are (the Batch API's output has no ``shard`` or
``row``: a chunk's place in the output is its key).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gzip
import io
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from runner.storage._columnar import constant, positions
from runner.storage._s3layout import Compression, Encoding, Format

# Arrow's codec names for a text object's compression.
_ARROW_CODECS: dict[Compression, str] = {"gzip": "gzip", "zstd": "zstd"}
# How much of a Parquet object's end is fetched first: the footer of most files.
FOOTER_GUESS = 64 * 1024
_PARQUET_MAGIC = b"PAR1"
BLOCK_SIZE = 1 << 20
# Column types a contract may give a CSV or JSON Lines object (columnTypes).
COLUMN_TYPES: dict[str, pa.DataType] = {
    "float64": pa.float64(),
    "float32": pa.float32(),
    "double": pa.float64(),
    "float": pa.float32(),
    "int64": pa.int64(),
    "int32": pa.int32(),
    "bool": pa.bool_(),
    "string": pa.string(),
}


class FormatError(ValueError):
    """The object's bytes are not what its format says: the input's fault."""


# -- Parquet, by row group ----------------------------------------------------------


def footer_range(size: int) -> tuple[int, int]:
    """The byte range fetched first from a Parquet object of ``size`` bytes."""
    return max(0, size - FOOTER_GUESS), size


def footer_length(tail: bytes, size: int) -> int:
    """The footer's length, read from the object's last 8 bytes; FormatError if not Parquet."""
    if size < 12 or len(tail) < 8 or tail[-4:] != _PARQUET_MAGIC:
        raise FormatError("not a Parquet file (no PAR1 at its end)")
    length = int.from_bytes(tail[-8:-4], "little")
    if length + 8 > size - 4:
        raise FormatError(f"not a Parquet file (a footer of {length} bytes in {size})")
    return length


class RangeFile(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only some ranges are known.

    pyarrow reads a Parquet footer or a row group through it; a read outside the
    known ranges calls ``fetch(start, end)`` (a blocking read, allowed only in a
    worker thread) or fails when there is none.
    """

    def __init__(
        self, size: int, fetch: Callable[[int, int], bytes] | None = None, name: str = ""
    ) -> None:
        super().__init__()
        self._size = size
        self._ranges: list[tuple[int, bytes]] = []
        self._position = 0
        self._fetch = fetch
        self._name = name

    def add(self, start: int, data: bytes | memoryview) -> None:
        self._ranges.append((start, bytes(data)))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self._position = offset
        elif whence == io.SEEK_CUR:
            self._position += offset
        else:
            self._position = self._size + offset
        return self._position

    def size(self) -> int:
        return self._size

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        wanted = min(len(view), self._size - self._position)
        if wanted <= 0:
            return 0
        start, end = self._position, self._position + wanted
        for first, data in self._ranges:
            if first <= start and end <= first + len(data):
                view[:wanted] = data[start - first : end - first]
                self._position = end
                return wanted
        if self._fetch is None:
            raise OSError(f"{self._name}: bytes {start}-{end} were not fetched")
        data = self._fetch(start, end)
        self._ranges.append((start, data))
        view[: len(data)] = data
        self._position += len(data)
        return len(data)


def parquet_metadata(tail: bytes, size: int, name: str) -> pq.FileMetaData:
    """The footer of a Parquet object whose last ``len(tail)`` bytes are ``tail``."""
    footer_length(tail, size)
    source = RangeFile(size, name=name)
    source.add(size - len(tail), tail)
    try:
        return pq.read_metadata(source)
    except (pa.ArrowException, OSError) as error:
        raise FormatError(f"unreadable Parquet footer: {error}") from None


def row_group_range(
    metadata: pq.FileMetaData, index: int, columns: Sequence[int] | None = None
) -> tuple[int, int]:
    """The byte range holding row group ``index``'s column chunks (``columns``, or all)."""
    group = metadata.row_group(index)
    starts, ends = [], []
    for column in columns if columns is not None else range(group.num_columns):
        chunk = group.column(column)
        first = chunk.data_page_offset
        if chunk.has_dictionary_page and chunk.dictionary_page_offset:
            first = min(first, chunk.dictionary_page_offset)
        starts.append(first)
        ends.append(first + chunk.total_compressed_size)
    return min(starts), max(ends)


def decode_row_group(
    metadata: pq.FileMetaData, index: int, source: RangeFile, columns: Sequence[str] | None = None
) -> pa.Table:
    """Row group ``index``, from a :class:`RangeFile` holding its range (and the footer)."""
    try:
        reader = pq.ParquetFile(source, metadata=metadata)
        return reader.read_row_group(index, columns=list(columns) if columns else None)
    except (pa.ArrowException, OSError) as error:
        raise FormatError(f"row group {index}: {error}") from None


# -- CSV and JSON Lines, streamed ---------------------------------------------------


class StreamFile(io.RawIOBase):
    """A blocking, read-only file over an asynchronous stream of byte pieces.

    Read from a worker thread while ``loop`` runs: each read that needs more waits
    for the loop to fetch the next piece (``anext(pieces)``), so the loop stays
    free and only one piece is held at a time. :meth:`abort` cancels a wait (the
    run is being stopped). A failure of the stream is kept in :attr:`error`, so
    the caller can tell it from a parse error.
    """

    def __init__(self, pieces: AsyncIterator[Any], loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._pieces = pieces
        self._loop = loop
        self._buffer = memoryview(b"")
        self._done = False
        self._waiting: concurrent.futures.Future[bytes | None] | None = None
        self.error: BaseException | None = None

    def readable(self) -> bool:
        return True

    async def _next(self) -> bytes | None:
        try:
            piece = await anext(self._pieces)
        except StopAsyncIteration:
            return None
        except Exception as error:
            self.error = error
            raise
        return bytes(piece)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        while not self._buffer:
            if self._done:
                return 0
            self._waiting = asyncio.run_coroutine_threadsafe(self._next(), self._loop)
            piece = self._waiting.result()
            self._waiting = None
            if piece is None:
                self._done = True
                return 0
            self._buffer = memoryview(piece)
        count = min(len(view), len(self._buffer))
        view[:count] = self._buffer[:count]
        self._buffer = self._buffer[count:]
        return count

    def abort(self) -> None:
        waiting = self._waiting
        if waiting is not None:
            waiting.cancel()


@dataclass(frozen=True)
class TextOptions:
    """How text objects are parsed: the given column types, else Arrow's inference."""

    column_types: Mapping[str, str] | None = None

    def arrow_types(self) -> dict[str, pa.DataType]:
        return {name: COLUMN_TYPES[kind] for name, kind in (self.column_types or {}).items()}


# The one column of an openai-batch table: each line's JSON text.
BATCH_LINE = "__openai_batch_line__"
BATCH_SCHEMA = pa.schema([(BATCH_LINE, pa.string())])
BATCH_LINES = 10_000


class LineReader:
    """JSON Lines as tables of whole lines (see "OpenAI Batch files"); Arrow's reader API."""

    schema = BATCH_SCHEMA

    def __init__(self, stream: Any, block_size: int = BLOCK_SIZE) -> None:
        self._stream = stream
        self._block_size = block_size
        self._rest = b""
        self._done = False
        self._line = 0

    def read_next_batch(self) -> pa.RecordBatch:
        lines: list[str] = []
        while len(lines) < BATCH_LINES:
            newline = self._rest.find(b"\n")
            if newline < 0:
                if self._done:
                    if self._rest.strip():
                        lines.append(self._check(self._rest))
                    self._rest = b""
                    break
                block = self._stream.read(self._block_size)
                if not block:
                    self._done = True
                self._rest += bytes(block)
                continue
            line, self._rest = self._rest[:newline], self._rest[newline + 1 :]
            if line.strip():
                lines.append(self._check(line))
            else:
                self._line += 1
        if not lines:
            raise StopIteration
        return pa.RecordBatch.from_arrays([pa.array(lines, pa.string())], schema=BATCH_SCHEMA)

    def _check(self, line: bytes) -> str:
        self._line += 1
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as error:
            raise pa.ArrowInvalid(f"line {self._line} is not JSON: {error}") from None
        if not isinstance(value, dict):
            raise pa.ArrowInvalid(f"line {self._line} is not a JSON object")
        return line.decode()


def encode_lines(rows: Sequence[Any]) -> bytes:
    """Output lines (objects) as JSON Lines, each exactly as given."""
    return b"".join(orjson.dumps(row) + b"\n" for row in rows)


def open_text(
    source: io.RawIOBase, encoding: Encoding, options: TextOptions, expected: pa.Schema | None
) -> Any:
    """Arrow's streaming reader over ``source`` (blocking: call it in a worker thread).

    ``expected`` is the first object's schema: later objects are read with its
    column types, so every object of the input has the same ones.
    """
    stream: Any = pa.PythonFile(source, mode="r")
    if encoding.compression != "none":
        stream = pa.CompressedInputStream(stream, _ARROW_CODECS[encoding.compression])
    if encoding.format == "openai-batch":
        return LineReader(stream)
    types = options.arrow_types()
    if expected is not None:
        types = {field.name: field.type for field in expected} | types
    if encoding.format == "csv":
        return pa_csv.open_csv(
            stream,
            read_options=pa_csv.ReadOptions(use_threads=False, block_size=BLOCK_SIZE),
            convert_options=pa_csv.ConvertOptions(column_types=types),
        )
    schema = pa.schema(list(types.items())) if types else None
    return pa_json.open_json(
        stream,
        read_options=pa_json.ReadOptions(use_threads=False, block_size=BLOCK_SIZE),
        parse_options=pa_json.ParseOptions(explicit_schema=schema),
    )


def describe_schema(schema: pa.Schema) -> str:
    return ", ".join(f"{field.name}: {field.type}" for field in schema)


def same_columns(schema: pa.Schema, expected: pa.Schema) -> bool:
    """The same column names and types, in the same order (metadata aside)."""
    same: bool = schema.remove_metadata().equals(expected.remove_metadata())
    return same


# -- rows for the model -------------------------------------------------------------


def _list_type(kind: pa.DataType) -> bool:
    types = pa.types
    return bool(types.is_list(kind) or types.is_large_list(kind) or types.is_fixed_size_list(kind))


def records_of(table: pa.Table | pa.RecordBatch) -> list[dict[str, Any]]:
    """The table's rows as objects with named columns (:mod:`runner.join` picks the features).

    An openai-batch table's rows are its lines, decoded as they are.
    """
    if table.schema.names == [BATCH_LINE]:
        return [orjson.loads(line) for line in table.column(0).to_pylist()]
    records: list[dict[str, Any]] = table.to_pylist()
    return records


# -- output chunks ------------------------------------------------------------------


def chunk_table(
    predictions: Sequence[Any] | pa.Table, rows: int, start: int, shard: int
) -> pa.Table:
    """A chunk's table: ``shard``, ``row``, then the joined columns or ``prediction``.

    ``predictions`` is the chunk's output: a table (a columnar page's, its
    carried columns and ``prediction``), one object per row (predictions joined
    to their input columns), or the rows' flat answers, ``k`` per row (a list of
    ``k`` values per row when ``k`` > 1). FormatError when it fits neither, or
    holds an integer beyond 64 bits (Arrow's columns, so Parquet's, end there).
    """
    try:
        return _chunk_table(predictions, rows, start, shard)
    except OverflowError:
        raise FormatError(
            "an output value is an integer beyond 64 bits, which the chunk's columns cannot hold"
        ) from None


def _chunk_table(
    predictions: Sequence[Any] | pa.Table, rows: int, start: int, shard: int
) -> pa.Table:
    keys = {
        "shard": constant(shard, rows, pa.int32()),
        "row": positions(start, rows),
    }
    if rows == 0:
        return pa.table({**keys, "prediction": pa.array([], pa.float64())})
    if isinstance(predictions, pa.Table):
        # A columnar page's output (runner.storage._columnar): already a table.
        if predictions.num_rows != rows:
            raise FormatError(f"{predictions.num_rows} output rows for {rows} input rows")
        return _after_keys(keys, predictions)
    if predictions and isinstance(predictions[0], Mapping):
        if len(predictions) != rows:
            raise FormatError(f"{len(predictions)} output rows for {rows} input rows")
        return _after_keys(keys, pa.Table.from_pylist(list(predictions)))
    per_row, rest = divmod(len(predictions), rows)
    if rest or per_row == 0:
        raise FormatError(f"{len(predictions)} predictions for {rows} rows")
    if per_row == 1:
        values = pa.array(list(predictions))
    else:
        values = pa.array([list(predictions[i * per_row : (i + 1) * per_row]) for i in range(rows)])
    return pa.table({**keys, "prediction": values})


def _after_keys(keys: Mapping[str, pa.Array], joined: pa.Table) -> pa.Table:
    """The chunk's own columns ``keys``, then the columns of ``joined`` (none may clash)."""
    clash = sorted(set(joined.column_names) & set(keys))
    if clash:
        raise FormatError(f"output columns {clash} clash with the chunk's own")
    table = pa.table(keys)
    for name in joined.column_names:
        table = table.append_column(name, joined.column(name))
    return table


def compress(data: bytes, compression: Compression) -> bytes:
    if compression == "gzip":
        return gzip.compress(data, mtime=0)
    if compression == "zstd":
        compressed: bytes = pa.compress(data, codec="zstd", asbytes=True)
        return compressed
    return data


def encode_chunk(table: pa.Table, fmt: Format, compression: Compression) -> bytes:
    """A chunk object's bytes: the same for the same table."""
    if fmt == "parquet":
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        return bytes(sink.getvalue())
    if fmt == "jsonl":
        lines = [orjson.dumps(record) for record in table.to_pylist()]
        data = b"\n".join(lines) + (b"\n" if lines else b"")
    else:
        flat = table
        for index, field in enumerate(table.schema):
            if not (_list_type(field.type) or pa.types.is_struct(field.type)):
                continue
            values = flat.column(index).to_pylist()
            as_text = pa.array(
                [None if v is None else orjson.dumps(v).decode() for v in values], pa.string()
            )
            flat = flat.set_column(index, field.name, as_text)
        sink = pa.BufferOutputStream()
        pa_csv.write_csv(flat, sink)
        data = bytes(sink.getvalue())
    return compress(data, compression)
