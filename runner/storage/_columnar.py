"""Columnar pages: an Arrow page to the model's request body and back, no object per row.

An ``s3`` input reads Arrow tables (a Parquet row group, a block of CSV or JSON
Lines). Made into Python objects, every row cost three objects (a record dict,
the join's output dict, and the chunk's ``Table.from_pylist``): most of the
runner's CPU per row. So a page stays a table (:class:`ArrowRows`) and, when
the join settings allow it, :meth:`ArrowRows.columnar` splits it in Arrow's C
loops:

- the **features** (the ``columns``) become each row's JSON text, ``[v1,v2,...]``,
  by Arrow's number-to-string cast and string joins (:class:`EncodedRows`); a
  batch's request carries the rows' texts joined, as the ``data`` of the v2
  body (``orjson.Fragment``), nested as the row path sends it. Integers are
  written as integers and floats in their shortest round-trip form, a whole
  float with its point (``1.0``, ``-0.0``: without it a JSON reader makes an
  integer, and ``-0`` loses its sign), so the model receives the same numbers,
  of the same types, as from the row path;
- the **carried** columns (``keyColumn``, ``passthroughColumns``) stay Arrow
  columns, and the chunk is those columns plus ``prediction`` (a Python value
  per row, as the model answered it): the table the row path would build from
  dicts, without the dicts.

No numpy: the runner image does not carry it, and Arrow's casts are enough.

A page the columnar path cannot take exactly as the row path would is taken
by the row path (:meth:`ArrowRows.__iter__` makes the records), which gives
the same output and the same errors as before: a feature column that is not
integer or floating point, or has a null, NaN or infinity (the row path sends
``null``); a column ``columns`` names that is absent; a null key; a carried
column of a type other than integer, floating point, string or boolean, or
null on every row of the page (``Table.from_pylist`` makes such a column of
type ``null``). Carried integers and floats are widened to 64 bits, as
``from_pylist`` types Python's ints and floats. Predictions that one Arrow
column cannot hold (an integer beyond 64 bits, numbers and strings on one
page) are joined to the page's records as the row path joins them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, overload

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from runner.join import PREDICTION_FIELD, RowSplitter


class EncodedRows:
    """Rows as JSON texts (``[5.1,3.5,1.4,0.2]``), one Arrow string per row.

    Sliced like a list; :meth:`json` is the rows as a JSON list, for a request
    body. ``rows[i]`` decodes row ``i`` (the model's first row gives its shape).
    """

    def __init__(self, texts: pa.Array) -> None:
        self.texts = texts

    def __len__(self) -> int:
        count: int = len(self.texts)
        return count

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> EncodedRows: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self.texts))
            if step != 1:
                raise ValueError("EncodedRows slices have no step")
            return EncodedRows(self.texts.slice(start, stop - start))
        return orjson.loads(self.texts[index].as_py())

    def json(self) -> bytes:
        """``[row,row,...]``: the rows' texts joined, one copy out of Arrow."""
        if not len(self.texts):
            return b"[]"
        whole = pc.binary_join(
            pa.ListArray.from_arrays(pa.array([0, len(self.texts)], pa.int32()), self.texts), ","
        )
        text: bytes = whole[0].as_buffer().to_pybytes()
        return b"[" + text + b"]"

    def fragment(self) -> orjson.Fragment:
        return orjson.Fragment(self.json())


@dataclass
class Carried:
    """A columnar page's carried columns, until its predictions are joined to them."""

    table: pa.Table

    def __len__(self) -> int:
        count: int = self.table.num_rows
        return count

    def records(self) -> list[tuple[Any, ...]]:
        """The carried values as the row path keeps them: a tuple per row."""
        columns = [column.to_pylist() for column in self.table.columns]
        return list(zip(*columns, strict=True))

    def output(self, predictions: list[Any]) -> pa.Table | None:
        """The carried columns, then ``prediction``; ValueError when the count is wrong.

        None when one Arrow column cannot hold the predictions (an integer beyond
        64 bits, a page answering numbers and strings): the row path's objects
        keep each value as the model gave it, and the output then stores or
        refuses them as it would any row path's.
        """
        rows = self.table.num_rows
        per_row, rest = divmod(len(predictions), rows) if rows else (0, len(predictions))
        if rest or (rows and per_row == 0):
            raise ValueError(f"{len(predictions)} prediction(s) for {rows} row(s)")
        try:
            if per_row == 1:
                values = pa.array(predictions)
            else:
                values = pa.array(
                    [predictions[i * per_row : (i + 1) * per_row] for i in range(rows)]
                )
        except (OverflowError, pa.ArrowInvalid, pa.ArrowTypeError):
            return None
        return self.table.append_column(PREDICTION_FIELD, values)


def _feature_ok(column: pa.ChunkedArray) -> bool:
    kind = column.type
    if pa.types.is_integer(kind):
        return bool(column.null_count == 0)
    if pa.types.is_floating(kind):
        return column.null_count == 0 and bool(pc.all(pc.is_finite(column)).as_py())
    return False


def _carried(column: pa.ChunkedArray, key: bool) -> pa.ChunkedArray | None:
    """The column as ``Table.from_pylist`` would type its values, or None (the row path)."""
    kind = column.type
    if column.null_count == len(column) or (key and column.null_count):
        return None
    if pa.types.is_integer(kind) and kind != pa.uint64():
        return column.cast(pa.int64())
    if pa.types.is_floating(kind):
        return column.cast(pa.float64())
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return column.cast(pa.string())
    if pa.types.is_boolean(kind):
        return column
    return None


def _whole_floats(values: pa.Array) -> pa.Array:
    """Where ``values`` (float64) is a finite whole number: false, never null, elsewhere."""
    whole = pc.and_(pc.equal(pc.floor(values), values), pc.is_finite(values))
    return pc.fill_null(whole, False)


def float_texts(values: pa.Array | pa.ChunkedArray, texts: Any = None) -> pa.Array:
    """Floats (float64) as JSON numbers that decode to the same floats, -0.0 included.

    ``texts`` is their shortest round-trip text (Arrow's cast, or a server's),
    made here when not given. Such text writes a whole number without a point
    (``1``, ``-0``), which a JSON reader takes as an integer (``-0`` as 0, its
    sign lost): those get ``.0``, as the row path's ``orjson`` writes them. A
    whole number written with an exponent (``1e+15``) is a float already.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if texts is None:
        texts = pc.cast(values, pa.string())
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    whole = _whole_floats(values)
    if not pc.any(whole).as_py():
        return texts
    picked = pc.filter(texts, whole)
    pointed = pc.if_else(
        pc.match_substring(picked, "e"), picked, pc.binary_join_element_wise(picked, ".0", "")
    )
    return pc.replace_with_mask(texts, whole, pointed)


def python_float_texts(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Floats (float64) as Python's ``repr`` writes them (``-0.0``, ``1e-05``, ``nan``), nulls kept.

    Arrow's shortest text has the same digits; it differs in where it uses an
    exponent and how it writes one (``1e+10``, ``0.00001``, ``1e-7`` for
    Python's ``10000000000.0``, ``1e-05``, ``1e-07``), and in the point of a
    whole number (:func:`float_texts`). The values it writes with an exponent,
    and those below 1e-4 (which Python writes with one), are made by ``repr``.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    texts = float_texts(values)
    tiny = pc.and_(pc.less(pc.abs(values), 1e-4), pc.not_equal(values, 0.0))
    odd = pc.fill_null(pc.or_(pc.match_substring(texts, "e"), tiny), False)
    if not pc.any(odd).as_py():
        return texts
    spelled = pa.array([repr(v) for v in pc.filter(values, odd).to_pylist()], pa.string())
    return pc.replace_with_mask(texts, odd, spelled)


def row_texts(
    columns: Sequence[pa.ChunkedArray], given: Sequence[pa.ChunkedArray | None] = ()
) -> pa.Array:
    """Each row's features as JSON text, ``[v1,...,vk]`` (module docstring).

    ``given[i]``, when there, is column ``i``'s values already as JSON numbers
    (a ``postgres`` page's server text), used as it is but for the point a
    whole float needs (:func:`float_texts`).
    """
    # float32 widened first: the row path sends Python's float of it (5.099999904632568).
    padded = [*given, *[None] * (len(columns) - len(given))]
    texts = []
    for column, text in zip(columns, padded, strict=True):
        if pa.types.is_floating(column.type):
            texts.append(float_texts(column.cast(pa.float64()), text))
        else:
            texts.append(text if text is not None else pc.cast(column, pa.string()))
    joined = pc.binary_join_element_wise(*texts, ",") if len(texts) > 1 else texts[0]
    wrapped = pc.binary_join_element_wise("[", joined, "]", "")
    if isinstance(wrapped, pa.ChunkedArray):
        return wrapped.combine_chunks()
    return wrapped


class ArrowRows(Sequence[Any]):
    """A page read as Arrow tables; its records (dicts) are made only if asked.

    ``records`` makes the row path's records (:func:`records_of`, given by the
    provider) on first use: iterating, indexing or slicing does. ``opaque``
    columns hold a text form of values the row path has as other objects (a
    ``postgres`` date): a page that uses one as a feature or carried column is
    taken by the row path.
    """

    def __init__(
        self,
        tables: list[pa.Table],
        records: Any,
        opaque: frozenset[str] = frozenset(),
        texts: Mapping[str, pa.ChunkedArray] | None = None,
    ) -> None:
        self.tables = tables
        self.opaque = opaque
        # A single table's number columns as JSON texts (row_texts' ``given``).
        self.texts = texts or {}
        self._records_of = records
        self._records: list[Any] | None = None
        self._count: int = sum(table.num_rows for table in tables)

    def __len__(self) -> int:
        return self._count

    def _all(self) -> list[Any]:
        if self._records is None:
            self._records = [r for table in self.tables for r in self._records_of(table)]
        return self._records

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        return self._all()[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._all())

    def columnar(self, splitter: RowSplitter) -> tuple[EncodedRows, Carried] | None:
        """``(features, carried)`` in Arrow, or None where the row path must take the page."""
        if not self._count:
            return None
        try:
            table = pa.concat_tables(self.tables) if len(self.tables) > 1 else self.tables[0]
        except pa.ArrowInvalid:
            return None
        names = table.column_names
        selection = splitter.selection
        carried_names = selection.carried
        if any(name not in names for name in carried_names):
            return None
        columns = splitter.columns
        if columns is None:
            columns = [name for name in names if name not in set(carried_names)]
            if not columns:
                return None  # the row path says why
        if any(name not in names for name in columns):
            return None
        if self.opaque.intersection(columns) or self.opaque.intersection(carried_names):
            return None
        features = [table.column(name) for name in columns]
        if not all(_feature_ok(column) for column in features):
            return None
        kept: list[pa.ChunkedArray] = []
        for name in carried_names:
            column = _carried(table.column(name), name == selection.key_column)
            if column is None:
                return None
            kept.append(column)
        splitter.columns = columns
        carried = pa.table(kept, names=carried_names) if kept else _no_columns(table.num_rows)
        given = [self.texts.get(name) for name in columns] if len(self.tables) == 1 else []
        return EncodedRows(row_texts(features, given)), Carried(carried)


@lru_cache(maxsize=8)
def _counting(count: int) -> pa.Array:
    # From a list: Arrow converts a range one Python call per value (2.3 us each),
    # a list in C (80 ns); made once per count (a page size) and reused.
    return pa.array(list(range(count)), pa.int64())


def positions(first: int, count: int, step: int = 1) -> pa.Array:
    """``first``, ``first + step``, ... (``count`` values) as an int64 column."""
    column = _counting(count)
    if step != 1:
        column = pc.multiply(column, pa.scalar(step, pa.int64()))
    if first:
        column = pc.add(column, pa.scalar(first, pa.int64()))
    return column


def constant(value: int, count: int, kind: pa.DataType) -> pa.Array:
    """``value``, ``count`` times, as a column of ``kind`` (no Python list)."""
    return pc.fill_null(pa.nulls(count, kind), pa.scalar(value, kind))


def _no_columns(rows: int) -> pa.Table:
    return pa.table({"_": pa.nulls(rows)}).drop_columns(["_"])
