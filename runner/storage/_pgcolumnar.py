"""PostgreSQL pages as Arrow tables and Arrow chunks as ``COPY`` data: no object per row.

Read as Python objects (psycopg's rows as dicts, a list per row for the model,
a dict per output row, ``write_row`` per row into ``COPY``), a Postgres row cost
the runner about 12 CPU-us. So a streaming run keeps the rows columnar, as an
``s3`` input's Arrow tables are (:mod:`runner.storage._columnar`):

- **input**: the server writes each page as CSV, one value for the whole page
  (``string_agg`` of one line per row, the columns' own text forms), and Arrow's
  CSV reader parses it into columns of the types the query's result has
  (:class:`CsvLayout`). Integers and floats also keep their text: the server's
  text of a number is the JSON the model's request needs (the shortest form
  that reads back as the same number), so the features are not formatted
  again, but for the point a whole float needs (the server writes 5.0 as
  ``5`` and -0.0 as ``-0``, JSON integers; :func:`~runner.storage._columnar.float_texts`
  makes them ``5.0`` and ``-0.0``). The values are those the row path gets from psycopg:
  the same text, parsed the same way (``numeric`` as a float, as the row path's
  loader does; ``NaN`` and ``Infinity`` included). Strings are quoted by the
  server (``NULL`` unquoted and empty, ``''`` quoted), so nulls stay nulls.
- **output**: a columnar page's output (its carried columns and
  ``prediction``, an Arrow table) goes into ``COPY ... (FORMAT csv)`` as one
  CSV buffer Arrow writes (:func:`csv_chunk`), the row numbers an Arrow column,
  its floats spelled as the row path's ``COPY`` spells them.

Columns of the types whose text form Arrow parses to the row path's value
are Arrow columns: ``smallint``, ``integer``, ``bigint``, ``real``, ``double
precision``, ``numeric``, ``boolean``, ``text`` and ``varchar``. A column of any
other type (dates, timestamps, ``uuid``, ``json``, arrays, ``char(n)``...)
travels as its text form and is *opaque*: a page that uses it as a feature or
carried column is taken by the row path, whose records get its values from
psycopg's own loaders for that text (:class:`Records`), the values a row read
would have. A query with two columns of one name is read by the row path, as
is a page whose text Arrow cannot parse. An output table with a column Arrow
cannot write as CSV (a list per row) is written by the row path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
from psycopg import sql

from runner.storage._columnar import positions, python_float_texts

# The result types taken columnar, by type OID: what Arrow makes of their text.
ARROW_TYPES: dict[int, pa.DataType] = {
    16: pa.bool_(),  # boolean
    20: pa.int64(),  # bigint
    21: pa.int64(),  # smallint
    23: pa.int64(),  # integer
    700: pa.float64(),  # real
    701: pa.float64(),  # double precision
    1700: pa.float64(),  # numeric: a float, as the row path's FloatLoader makes it
    25: pa.string(),  # text
    1043: pa.string(),  # varchar
}
_STRING_OIDS = frozenset({25, 1043})
# Numbers whose server text is a JSON number equal to the row path's value: the
# model's request takes that text as it is (no float-to-text cast per value).
_JSON_NUMBER_OIDS = frozenset({20, 21, 23, 700, 701})
_CONVERT = {
    "null_values": [""],
    "strings_can_be_null": True,
    # A quoted empty field is an empty string, an unquoted one NULL (as the server wrote them).
    "quoted_strings_can_be_null": False,
    "true_values": ["true"],
    "false_values": ["false"],
}


@dataclass(frozen=True)
class CsvLayout:
    """The page's columns as the CSV carries them: names, type OIDs, Arrow types."""

    names: tuple[str, ...]
    oids: tuple[int, ...]

    @classmethod
    def of(cls, columns: Sequence[tuple[str, int]]) -> CsvLayout | None:
        """The layout of a result with these ``(name, type OID)`` columns; None: the row path."""
        names = [name for name, _ in columns]
        if not names or len(set(names)) != len(names):
            return None
        return cls(tuple(names), tuple(oid for _, oid in columns))

    @property
    def opaque(self) -> dict[str, int]:
        """The columns carried as their text form, with their type OIDs."""
        return {
            name: oid
            for name, oid in zip(self.names, self.oids, strict=True)
            if oid not in ARROW_TYPES
        }

    def with_columns(self, columns: Sequence[tuple[str, int]]) -> CsvLayout:
        """This layout and more columns (a sharded page's window columns)."""
        return CsvLayout(
            (*self.names, *(name for name, _ in columns)),
            (*self.oids, *(oid for _, oid in columns)),
        )

    def line(self, alias: str) -> sql.Composable:
        """One row of ``alias`` as a CSV line: each column's text form, strings quoted."""
        fields = []
        for name, oid in zip(self.names, self.oids, strict=True):
            column = sql.SQL("{}.{}").format(sql.Identifier(alias), sql.Identifier(name))
            if oid in ARROW_TYPES and oid not in _STRING_OIDS:
                fields.append(sql.SQL("coalesce({}::text, '')").format(column))
                continue
            # Quoted; format() writes the type's output text, as a row read gets it
            # (a cast to text would drop char(n)'s padding).
            fields.append(
                sql.SQL(
                    """CASE WHEN {c} IS NULL THEN '' """
                    """ELSE '"' || replace(format('%s', {c}), '"', '""') || '"' END"""
                ).format(c=column)
            )
        return sql.SQL("concat_ws(',', {})").format(sql.SQL(", ").join(fields))

    def parse(self, data: bytes, rows: int) -> tuple[pa.Table, dict[str, pa.ChunkedArray]] | None:
        """The page's CSV as a table of ``rows`` rows, and the numbers' texts by column.

        None when Arrow cannot take it.
        """
        if rows == 0:
            empty = pa.table({name: pa.array([], kind) for name, kind in self._columns()})
            return empty, {}
        strings = any(oid in _STRING_OIDS or oid not in ARROW_TYPES for oid in self.oids)
        try:
            table = pa_csv.read_csv(
                pa.BufferReader(data),
                read_options=pa_csv.ReadOptions(
                    column_names=list(self.names),
                    use_threads=False,
                    block_size=max(len(data) + 1, 1 << 20),
                ),
                # Only a quoted string can hold a newline; allowing it costs the parser.
                parse_options=pa_csv.ParseOptions(newlines_in_values=strings),
                convert_options=pa_csv.ConvertOptions(
                    column_types={
                        name: pa.string() if oid in _JSON_NUMBER_OIDS else kind
                        for (name, kind), oid in zip(self._columns(), self.oids, strict=True)
                    },
                    **_CONVERT,
                ),
            )
            texts: dict[str, pa.ChunkedArray] = {}
            for index, (name, oid) in enumerate(zip(self.names, self.oids, strict=True)):
                if oid in _JSON_NUMBER_OIDS:
                    texts[name] = table.column(index)
                    number = pc.cast(texts[name], ARROW_TYPES[oid])
                    table = table.set_column(index, name, number)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        return (table, texts) if table.num_rows == rows else None

    def _columns(self) -> list[tuple[str, pa.DataType]]:
        return [
            (name, ARROW_TYPES.get(oid, pa.string()))
            for name, oid in zip(self.names, self.oids, strict=True)
        ]


class TextLoader(Protocol):
    """psycopg's loader of one type's text form (``Loader.load``)."""

    def load(self, data: bytes) -> Any: ...


@dataclass(frozen=True)
class Records:
    """The page's rows as the row path has them: one dict per row, columns in order.

    An opaque column's text is loaded by ``loaders[name]``, the loader psycopg
    uses for that column's type on the connection (a date becomes a date).
    """

    loaders: Mapping[str, TextLoader]

    def __call__(self, table: pa.Table) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = table.to_pylist()
        for name, loader in self.loaders.items():
            load = loader.load
            for record in records:
                value = record[name]
                if value is not None:
                    record[name] = load(value.encode())
        return records


def _writable(kind: pa.DataType) -> bool:
    types = pa.types
    return bool(
        types.is_integer(kind)
        or types.is_floating(kind)
        or types.is_boolean(kind)
        or types.is_string(kind)
        or types.is_large_string(kind)
    )


def csv_ready(table: pa.Table) -> bool:
    """Whether every column of an output table is one ``COPY`` takes from Arrow's CSV."""
    return table.num_rows > 0 and all(_writable(field.type) for field in table.schema)


def csv_chunk(table: pa.Table, first: int, step: int) -> pa.Buffer:
    """``row_index`` (``first``, ``first + step``, ...) then the table's columns, as CSV.

    Arrow writes strings quoted and nulls as empty unquoted fields, which is how
    ``COPY ... (FORMAT csv)`` reads them. Floats are written as the row path's
    ``COPY`` writes them, Python's ``repr`` (``-0.0``, ``1.0``, ``1e-05``), so a
    ``text`` or ``numeric`` column stores the same text either way (Arrow's own
    ``-0``, ``1``, ``0.00001`` differ); booleans as ``true``/``false``, as both
    paths write them.
    """
    rows = table.num_rows
    index = positions(first, rows, step)
    columns = [
        python_float_texts(column.cast(pa.float64()))
        if pa.types.is_floating(column.type)
        else column
        for column in table.columns
    ]
    chunk = pa.table([index, *columns], names=["row_index", *table.column_names])
    sink = pa.BufferOutputStream()
    pa_csv.write_csv(chunk, sink, write_options=pa_csv.WriteOptions(include_header=False))
    buffer: pa.Buffer = sink.getvalue()
    return buffer
